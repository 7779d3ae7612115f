"""The FastAPI app over a front (build_app): one router per API
(serve_app/http/routes/), the exception handlers that turn domain errors
(and the handles' own, through the front's HandleErrors) into the JSON
error body (the only place that does), and the middleware that counts every
request's outcome and keeps /docs behind the token. No Ray: the Serve
deployment (serve_app/http/ingress.py) builds it over its front."""

from __future__ import annotations

import time
from typing import Optional
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.core.errors import BadRequest, Forbidden, OcrError, Unauthorized
from serve_app.http import paddlex
from serve_app.http.front import Front
from serve_app.http.routes import jobs, paddlex as paddlex_routes, page, v1
from serve_app.http.routes.deps import assign_request_id, log
from serve_app.http.policies.admission import set_client

DOC_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


def build_app(front: Front) -> FastAPI:
    """The service's HTTP API over `front`: its routes find it through the
    `current_front` dependency (serve_app.http.routes.deps), its handlers
    and middleware through the app's state."""
    app = FastAPI(
        title="OCR service",
        description="PP-OCR (detection, direction, recognition; PP-OCRv6 small by default) on Paddle Inference, served by Ray Serve.",
        version="1",
    )
    app.state.front = front
    for router in (jobs.router, page.router, paddlex_routes.router, v1.router):
        app.include_router(router)
    for exc in (OcrError, *front.errors.types):
        app.add_exception_handler(exc, domain_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(HTTPException, http_error)
    # Plain ASGI middleware, not @app.middleware("http") (Starlette's
    # BaseHTTPMiddleware runs the rest of the app in a task of its own and
    # streams the answer through a queue, for each layer, on every request).
    app.add_middleware(DocsBehindToken)
    app.add_middleware(CountOutcomes)  # outermost: it sees every answer, the middleware's own refusals too
    return app


def _front(request: Request) -> Front:
    return request.app.state.front


# -- errors -----------------------------------------------------------------------
def error_response(e: OcrError, request_id: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else {}
    retry = getattr(e, "retry_after_s", None)
    if retry is not None:
        headers["Retry-After"] = str(retry)
    return JSONResponse({"request_id": request_id, "error": {"code": e.code, "message": e.message}},
                        status_code=e.status, headers=headers)


def _request_id_of(request: Request) -> str:
    return getattr(request.state, "request_id", None) or assign_request_id(request, request.headers.get("x-request-id"))


async def domain_error(request: Request, exc: Exception) -> JSONResponse:
    e = _front(request).errors.unwrap(exc)
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


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(x) for x in first.get("loc", ()))
    return await domain_error(request, BadRequest(f"bad request {where}: {first.get('msg', 'invalid')}"))


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own refusals (no such route, method not allowed) in the same JSON shape."""
    e = OcrError(str(exc.detail))
    e.status = exc.status_code
    e.code = {404: "not_found", 405: "method_not_allowed"}.get(
        exc.status_code, "bad_request" if exc.status_code < 500 else "internal")
    response = await domain_error(request, e)
    response.headers.update(exc.headers or {})
    return response


# -- middleware -------------------------------------------------------------------
def app_path(request: Request) -> str:
    """The request's path inside the app, without the route prefix the app
    is mounted under (Serve's `route_prefix`, given as the ASGI root_path)."""
    path, root = request.url.path, request.scope.get("root_path") or ""
    return path[len(root):] or "/" if root and path.startswith(root) else path


class DocsBehindToken:
    """With a token, the API docs (/docs, /openapi.json) need it too,
    whatever route prefix the app is mounted under. Without a token (an
    anonymous local service), a browser's POST from another site's page
    (its Origin is not this service) is refused: a page elsewhere must not
    be able to drive the service through its visitor's browser."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope, receive)
            refusal = docs_refusal(request, _front(request))
            if refusal is not None:
                await (await domain_error(request, refusal))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def docs_refusal(request: Request, front: Front) -> Optional[OcrError]:
    if app_path(request) in DOC_PATHS:
        if not front.clients.authorized(request.headers.get("authorization"), front.token):
            return Unauthorized("missing or wrong bearer token (Authorization: Bearer TOKEN)")
    elif not front.clients.requires_token(front.token) and request.method == "POST" and cross_origin(request):
        return Forbidden(
            f"a POST from the page of another origin ({request.headers['origin']}) is refused by a service "
            "without a token; give the service a token (ingress.auth_token_env) to take cross-origin calls")
    return None


def cross_origin(request: Request) -> bool:
    """A browser's request from a page whose origin is not this service's."""
    origin = request.headers.get("origin")
    if not origin:
        return False  # not a browser's cross-site request (curl, clients, same-origin GET-style forms)
    return urlsplit(origin).netloc.lower() != (request.headers.get("host") or "").lower()


class CountOutcomes:
    """Every /v1 request's status, error code and latency, counted in one
    place; an exception no handler took becomes a 500 JSON error."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        request = Request(scope, receive)
        # The client, for its fair shares (admission, jobs): its named token, else its address as the connection
        # (or a trusted proxy) says, never an unchecked header (serve_app/http/clients.py). Set here, it reaches
        # the route, which runs in this task.
        set_client(_front(request).clients.of(request.client.host if request.client else None, request.headers))
        started = False

        async def counted(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                _count(request, message, t0)
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception as exc:
            if started:  # the answer is under way: nothing else can be sent
                raise
            await (await domain_error(request, exc))(scope, receive, counted)


def _count(request: Request, start: Message, t0: float) -> None:
    """At the answer's start: the route's counts and latency, and the
    Server-Timing header (this replica's own time on the request)."""
    path = getattr(request.scope.get("route"), "path", "")
    if not (path.startswith("/v1/") or path in ("/ocr", "/layout-parsing")):
        return
    front, status = _front(request), start["status"]
    metrics = front.metrics
    if path == "/v1/ocr" and request.method == "POST":  # the live view's history: OCR requests only
        front.history.record(time.time(), status, (time.perf_counter() - t0) * 1000,
                             getattr(request.state, "timings_ms", None))
    metrics.requests.inc(tags={"route": path, "code": str(status)})
    code = getattr(request.state, "error_code", None)
    if code is not None:
        metrics.errors.inc(tags={"code": code})
    ms = (time.perf_counter() - t0) * 1000
    metrics.latency.observe(ms, tags={"route": path})
    MutableHeaders(scope=start)["Server-Timing"] = f"ingress;dur={ms:.3f}"
