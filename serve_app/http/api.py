"""The one FastAPI app every route is on, and what all its routes share: the
request id and bearer-token dependencies (PaddleX's too, in its error
shape), the exception handlers that turn domain and Ray errors into the JSON
error body (the only place that does), the middleware that counts every
request's outcome and keeps /docs behind the token, and the Ray error
unwrapping of a downstream call. Reading the request is serve_app/http/body.py
and serve_app/http/headers.py (no Ray there)."""

import asyncio
import logging
import time
import uuid
from urllib.parse import urlsplit
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Optional

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError, RayError
from ray.serve.exceptions import BackPressureError
from starlette.exceptions import HTTPException

from serve_app.http import paddlex
from serve_app.serving.admission import set_client
from serve_app.core.errors import BadRequest, Forbidden, OcrError, Overloaded, Unauthorized, Unavailable
from serve_app.flow.formats import render
from serve_app.http.headers import priority
from serve_app.core.request_options import FORMATS, OcrOptions

if TYPE_CHECKING:
    from serve_app.http.ingress import OcrIngress


log = logging.getLogger("ray.serve")

api = FastAPI(
    title="OCR service",
    description="PP-OCRv4 (detection, direction, recognition) on Paddle Inference, served by Ray Serve.",
    version="1",
)

# Everything registered on `api` (handlers, middleware, routes) must come
# before OcrIngress (serve_app/http/ingress.py): @serve.ingress takes a
# frozen copy of the app.


def unwrap(e: BaseException) -> BaseException:
    """The domain error behind a Ray error, if any: a replica's exception
    (a RayTaskError's cause), Serve's back-pressure refusal as our 503
    Overloaded, a dead replica as our 503 Unavailable."""
    if isinstance(e, BackPressureError):
        return Overloaded("the service is at capacity; retry shortly")
    if isinstance(e, (RayActorError, ActorUnavailableError)):
        return Unavailable("a replica serving this request stopped; retry shortly")
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


async def downstream(call):
    """Await a handle call. Its own cancellation (the replica serving it went
    away) is a 503 Unavailable; this request's cancellation (client gone,
    shutdown) propagates."""
    try:
        return await call
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        raise Unavailable("a replica serving this request stopped; retry shortly") from None


def _ingress() -> "OcrIngress":
    """This replica's OcrIngress (what Serve's class-based routes get as `self`)."""
    return serve.get_replica_context().servable_object


# -- dependencies ---------------------------------------------------------------
def request_id(request: Request, x_request_id: Annotated[Optional[str], Header()] = None) -> str:
    """X-Request-ID, or a new id; kept on request.state for the error
    handlers (the proxy echoes the header)."""
    request.state.request_id = x_request_id or uuid.uuid4().hex
    return request.state.request_id


RequestId = Annotated[str, Depends(request_id)]


def authorized(request: Request, _: RequestId) -> None:
    """Bearer-token check for /v1 routes (when ingress.auth_token_env is set)."""
    if not bearer_ok(request):
        raise Unauthorized("missing or wrong bearer token (Authorization: Bearer TOKEN)")


def has_token() -> bool:
    """The service requires a token (the shared one, or named ones)."""
    ingress = _ingress()
    return ingress.clients.requires_token(ingress.token)


def bearer_ok(request: Request) -> bool:
    """No token required, or the request bears the shared token or a named one."""
    ingress = _ingress()
    return ingress.clients.authorized(request.headers.get("authorization"), ingress.token)


V1 = [Depends(authorized)]


def paddlex_shape(request: Request) -> None:
    """PaddleX's route: its log id, and its error shape for every error of
    the request (the exception handlers read request.state.api)."""
    request.state.api = "paddlex"
    request.state.log_id = str(uuid.uuid4())


# The same token check as /v1, its refusal in PaddleX's error shape.
PADDLEX = [Depends(paddlex_shape), Depends(authorized)]

# `?format=json|text|hocr|alto` on the OCR routes (serve_app.flow.formats); it
# wins over the options' own `format`.
Format = Annotated[Optional[str], Query(alias="format", description=f"one of {', '.join(FORMATS)} (default json)")]


def with_lane(opts: OcrOptions, request: Request, default: str) -> OcrOptions:
    """The options with the request's lane: X-Priority, else the options'
    own `priority`, else the route's default (serve_app.core.lanes)."""
    header = priority(request.headers)
    return replace(opts, priority=header) if header is not None else opts.with_lane(default)


async def formatted(body: dict, fmt: str) -> Response:
    """The answer in the asked format: JSON as it is, else rendered (off
    the event loop: a long document's XML takes a while)."""
    if fmt == "json":
        return JSONResponse(body)
    content, media_type = await asyncio.to_thread(render, body, fmt)
    return Response(content, media_type=media_type)


# -- errors -----------------------------------------------------------------------
def error_response(e: OcrError, request_id: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else {}
    retry = getattr(e, "retry_after_s", None)
    if retry is not None:
        headers["Retry-After"] = str(retry)
    return JSONResponse({"request_id": request_id, "error": {"code": e.code, "message": e.message}},
                        status_code=e.status, headers=headers)


def _item_error(index: int, e: OcrError) -> dict:
    """A batch item's failure: its own error body, the others unaffected."""
    return {"index": index, "error": {"code": e.code, "message": e.message}}


def _request_id_of(request: Request) -> str:
    return getattr(request.state, "request_id", None) or request_id(request, request.headers.get("x-request-id"))


@api.exception_handler(OcrError)
@api.exception_handler(RayError)  # RayTaskError (a replica's exception), RayActorError
@api.exception_handler(BackPressureError)
async def domain_error(request: Request, exc: Exception) -> JSONResponse:
    e = unwrap(exc)
    rid = _request_id_of(request)
    paddlex_route = getattr(request.state, "api", None) == "paddlex"
    if not isinstance(e, OcrError):
        log.error("request %s failed", rid, exc_info=exc)
        e = OcrError("Internal server error" if paddlex_route else "internal error; the request was not completed")
    request.state.error_code = e.code  # counted by the middleware
    if paddlex_route:
        retry = getattr(e, "retry_after_s", None)
        return JSONResponse(paddlex.failure(request.state.log_id, e.status, e.message), status_code=e.status,
                            headers={"Retry-After": str(retry)} if retry is not None else {})
    return error_response(e, rid)


@api.exception_handler(RequestValidationError)
async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(x) for x in first.get("loc", ()))
    return await domain_error(request, BadRequest(f"bad request {where}: {first.get('msg', 'invalid')}"))


@api.exception_handler(HTTPException)
async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own refusals (no such route, method not allowed) in the same JSON shape."""
    e = OcrError(str(exc.detail))
    e.status = exc.status_code
    e.code = {404: "not_found", 405: "method_not_allowed"}.get(
        exc.status_code, "bad_request" if exc.status_code < 500 else "internal")
    response = await domain_error(request, e)
    response.headers.update(exc.headers or {})
    return response


DOC_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
# The page loads only its own script and style, shows pictures from data:
# and blob: URLs (the answer's visualization, the chosen file) and talks
# only to this service; nothing may frame it.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def app_path(request: Request) -> str:
    """The request's path inside the app, without the route prefix the app
    is mounted under (Serve's `route_prefix`, given as the ASGI root_path)."""
    path, root = request.url.path, request.scope.get("root_path") or ""
    return path[len(root):] or "/" if root and path.startswith(root) else path


@api.middleware("http")
async def docs_behind_token(request: Request, call_next):
    """With a token, the API docs (/docs, /openapi.json) need it too,
    whatever route prefix the app is mounted under. Without a token (an
    anonymous local service), a browser's POST from another site's page
    (its Origin is not this service) is refused: a page elsewhere must not
    be able to drive the service through its visitor's browser."""
    if app_path(request) in DOC_PATHS:
        if not bearer_ok(request):
            return await domain_error(request, Unauthorized("missing or wrong bearer token (Authorization: Bearer TOKEN)"))
    elif not has_token() and request.method == "POST" and cross_origin(request):
        return await domain_error(request, Forbidden(
            f"a POST from the page of another origin ({request.headers['origin']}) is refused by a service "
            "without a token; give the service a token (ingress.auth_token_env) to take cross-origin calls"))
    return await call_next(request)


def cross_origin(request: Request) -> bool:
    """A browser's request from a page whose origin is not this service's."""
    origin = request.headers.get("origin")
    if not origin:
        return False  # not a browser's cross-site request (curl, clients, same-origin GET-style forms)
    return urlsplit(origin).netloc.lower() != (request.headers.get("host") or "").lower()


@api.middleware("http")
async def count_outcomes(request: Request, call_next):
    """Every /v1 request's status, error code and latency, counted in one
    place; an exception no handler took becomes a 500 JSON error."""
    t0 = time.perf_counter()
    # The client, for its fair shares (admission, jobs): its named token, else its address as the connection
    # (or a trusted proxy) says, never an unchecked header (serve_app/http/clients.py). Set here, it reaches
    # the route's task.
    set_client(_ingress().clients.of(request.client.host if request.client else None, request.headers))
    try:
        response = await call_next(request)
    except Exception as exc:
        response = await domain_error(request, exc)
    path = getattr(request.scope.get("route"), "path", "")
    if path.startswith("/v1/") or path == "/ocr":
        ingress = _ingress()
        metrics = ingress.metrics
        if path == "/v1/ocr" and request.method == "POST":  # the live view's history: OCR requests only
            ingress.history.record(time.time(), response.status_code, (time.perf_counter() - t0) * 1000,
                                   getattr(request.state, "timings_ms", None))
        metrics.requests.inc(tags={"route": path, "code": str(response.status_code)})
        code = getattr(request.state, "error_code", None)
        if code is not None:
            metrics.errors.inc(tags={"code": code})
        ms = (time.perf_counter() - t0) * 1000
        metrics.latency.observe(ms, tags={"route": path})
        response.headers["Server-Timing"] = f"ingress;dur={ms:.3f}"  # this replica's own time on the request
    return response
