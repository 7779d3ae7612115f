"""The HTTP ingress (FastAPI under @serve.ingress) and the handle API.

Only this module turns domain errors into HTTP responses, with FastAPI's own
tools: dependencies give each /v1 route its request id and check the bearer
token, exception handlers turn domain and Ray errors into the JSON error
body, and one middleware counts every /v1 request's outcome. Reading the
request is serve_app.http.body and serve_app.http.headers (no Ray there)."""

import asyncio
import contextlib
import logging
import os
import time
import uuid
from urllib.parse import urlsplit
from dataclasses import replace
from typing import Annotated, Any, AsyncIterator, Optional

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError, RayError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException

from serve_app.http import paddlex
from serve_app.serving.admission import Admission, Gate, current_client, set_client
from serve_app.core.engine_config import DocumentLimits, ImageLimits
from serve_app.flow.documents import check_document
from serve_app.core.errors import (
    BadRequest, ConfigError, DeadlineExceeded, Forbidden, NotFound, OcrError, Overloaded, Unauthorized, Unavailable,
)
from serve_app.flow.formats import render
from serve_app.http.body import (
    JSON_ONLY, OCR_TYPES, BodyBudget, BodyHold, batch_items, body_limit, check_media_type, parse_body, read_body,
)
from serve_app.http.headers import bearer_matches, check_exposure, deadline_s, idempotency_key, priority
from serve_app.http.schema import batch_request_body, ocr_request_body
from serve_app.ocr.image_header import check_image_header
from serve_app.jobs.clients import client_of_request
from serve_app.core.lanes import BULK, INTERACTIVE
from serve_app.serving.live_stats import RollingHistory, deployment_summary, stage_summary
from serve_app.serving.metrics import AdmissionMetrics, CacheMetrics, RequestMetrics
from serve_app.core.request_options import FORMATS, OcrOptions, parse_options, with_format
from serve_app.core.request_context import RequestContext
from serve_app.serving.result_cache import Dedupe, ResultCache, wants_fresh
from serve_app.core.app_args import CacheArgs, IngressArgs, LaneArgs
from serve_app.http.ui import page_config, static_file
from serve_app.flow.upload import Upload, upload_of

log = logging.getLogger("ray.serve")

api = FastAPI(
    title="OCR service",
    description="PP-OCRv4 (detection, direction, recognition) on Paddle Inference, served by Ray Serve.",
    version="1",
)

# Everything registered on `api` (handlers, middleware) must come before the
# class below: @serve.ingress takes a frozen copy of the app.


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
    token = _ingress().token
    if token is not None and not bearer_matches(request.headers.get("authorization"), token):
        raise Unauthorized("missing or wrong bearer token (Authorization: Bearer TOKEN)")


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
    token = _ingress().token
    if app_path(request) in DOC_PATHS:
        if token is not None and not bearer_matches(request.headers.get("authorization"), token):
            return await domain_error(request, Unauthorized("missing or wrong bearer token (Authorization: Bearer TOKEN)"))
    elif token is None and request.method == "POST" and cross_origin(request):
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
    # The client, for its fair share of admission (serve_app.serving.admission): its address (the token is one
    # shared secret: it names no client). Set here, it reaches the route's task.
    set_client(f"addr:{request.client.host}" if request.client else None)
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


class Lease:
    """One HTTP request's hold on the ingress (OcrIngress.lease): its share
    of the body budget, its body, its deadline and whether it holds a bulk
    slot."""

    def __init__(self, ingress: "OcrIngress", hold: BodyHold, timeout_s: Optional[float]):
        self.ingress = ingress
        self.hold = hold
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.time() + timeout_s  # wall clock, as the replicas get it
        self.body = b""
        self.bulk = False

    def take_lane(self, opts: OcrOptions) -> OcrOptions:
        """The request's lane is known: a bulk request takes a bulk slot too."""
        self.bulk = self.ingress._take_bulk_slot(opts)
        return opts

    def context(self, request_id: str, opts: OcrOptions) -> RequestContext:
        return RequestContext(request_id, self.deadline, opts.priority or INTERACTIVE)

    def late(self) -> str:
        return f"not done within the {self.timeout_s:g} s deadline"


def _serve_host() -> Optional[str]:
    """The host Serve's HTTP proxies listen on (http_options.host); None if unknown."""
    try:
        from ray.serve.context import _get_global_client

        return _get_global_client().http_config.host
    except Exception:
        return None


@serve.deployment(name="OcrIngress")
@serve.ingress(api)
class OcrIngress:
    def __init__(self, pipeline: DeploymentHandle, jobs: DeploymentHandle, limits: ImageLimits,
                 args: IngressArgs = IngressArgs(), documents: DocumentLimits = DocumentLimits(),
                 paddlex_defaults: Optional[paddlex.PaddleXDefaults] = None, cache: CacheArgs = CacheArgs(),
                 model_id: str = "", lanes: LaneArgs = LaneArgs()):
        # The OcrPipeline deployment serves every read (sync, jobs) and
        # answers readiness and stats: one placement, one bulk gate per
        # pipeline replica (docs/request-path.md).
        self.pipeline = pipeline
        self.jobs = jobs
        self.limits = limits
        self.args = args
        self.documents = documents
        self.paddlex = paddlex_defaults or paddlex.PaddleXDefaults({}, 0.5, True)
        self.in_flight = 0
        self.bulk_in_flight = 0  # of in_flight, bulk-lane requests (capped by lanes.bulk_max_in_flight)
        self.lanes = lanes
        self.submitting = 0
        self.bodies = BodyBudget(args.max_body_bytes, args.retry_after_s)
        self.metrics = RequestMetrics()
        # Admission by cost (serve_app.serving.admission): one ledger for /v1/ocr, its batch items, /ocr and the handle.
        self.admission = Admission(args.admission, AdmissionMetrics(), default_retry_s=args.retry_after_s,
                                   max_requests=args.max_in_flight)
        # Identical requests computed once per ingress replica (serve_app.serving.result_cache).
        self.dedupe = Dedupe(model_id, ResultCache(cache.max_bytes, cache.ttl_s) if cache.max_bytes else None,
                             cache.share_in_flight, CacheMetrics(), downstream)
        self._ready: Optional[tuple[float, dict]] = None  # (when, stages) of the last probe
        self._ready_probe: Optional[asyncio.Task] = None
        self.history = RollingHistory(args.stats_bucket_s, args.stats_span_s)
        self._stats: Optional[tuple[float, dict]] = None  # (when, body) of the last gathering
        self._stats_probe: Optional[asyncio.Task] = None
        self.token: Optional[bytes] = None
        if args.auth_token_env:
            token = os.environ.get(args.auth_token_env, "")
            if not token:
                raise ConfigError(f"ingress.auth_token_env names {args.auth_token_env!r}, but that environment "
                                  f"variable is empty or unset in the ingress replica (set it, e.g. through "
                                  f"runtime_env.env_vars, or remove auth_token_env)")
            self.token = token.encode()
        check_exposure(_serve_host(), self.token is not None, args.allow_anonymous)

    # -- the one read path -----------------------------------------------------
    async def read(self, upload: Upload, opts: OcrOptions, ctx: RequestContext, late: str = "",
                   fresh: bool = False) -> tuple[dict, str]:
        """Every synchronous door's read (POST /v1/ocr, each item of
        /v1/ocr/batch, PaddleX's /ocr, the handle's `ocr`): admission by
        cost, the result cache and in-flight sharing, the deadline (the
        context's: past it a 504, and the pipeline's call is cancelled
        with its pending stage calls unless another identical request
        still waits on it) and the error mapping (a Ray error raised as
        the domain error behind it). -> (the result body, how the cache
        answered: hit | shared | miss | bypass). `fresh`: computed alone,
        not looked up (Cache-Control: no-cache)."""
        late = late or "not done within the request's deadline"
        popts = opts.for_pipeline()  # the key: JSON and rendered formats share one computation
        try:
            left = ctx.time_left()
            if left is not None and left <= 0:
                raise DeadlineExceeded(late)
            # Admitted only if it starts a computation (a hit or a shared answer costs nothing).
            with Gate(self.admission, upload, left, self.documents, limits=self.limits) as gate:
                result, cache = await self.dedupe.read(
                    upload.data, popts, left, lambda d: self.pipeline.ocr.remote(upload, popts, ctx.until(d)),
                    late, fresh, admit=gate.admit)
                gate.done(result)
        except Exception as e:
            raise unwrap(e) from None
        if cache in ("miss", "bypass"):  # a hit's or a shared answer's timings were counted once already
            for step, ms in result.get("timings_ms", {}).items():
                self.metrics.stage_latency.observe(ms, tags={"step": step})
        return result, cache

    # -- handle API (other Ray jobs and deployments) -------------------------
    async def ocr(self, image: Any, options: Optional[dict] = None) -> Any:
        """`serve.get_app_handle("ocr").ocr.remote(image_bytes_or_array)` (or
        a PDF's bytes): the same dict as the HTTP body, with `cache`; with
        options `format` text, hocr or alto, that document as a str instead.
        Domain errors raise. No slot or body budget (those are HTTP's): a
        handle caller is bounded by Serve's max_ongoing_requests."""
        opts = parse_options(options).with_lane(INTERACTIVE)  # refuse bad options here, before any work
        upload = upload_of(image, self.limits)
        ctx = RequestContext.of(uuid.uuid4().hex, None, opts.priority)
        result, cache = await self.read(upload, opts, ctx)
        body = {"request_id": ctx.request_id, **result, "cache": cache}
        return body if opts.format == "json" else (await asyncio.to_thread(render, body, opts.format))[0]

    # -- HTTP -----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, request: Request, media: tuple[str, ...] = OCR_TYPES,
                    submit: bool = False) -> AsyncIterator["Lease"]:
        """What one HTTP request holds of this ingress while it is served,
        taken in this order and all given back on leaving: its deadline
        (X-Request-Timeout; a job submit has none), its media type (else
        415), its body, read within ingress.body_timeout_s (or what is left
        of the deadline) else 408, under the size limit else 413 and within
        the ingress's budget of body bytes else 503, then an in-flight slot
        (ingress.max_in_flight; a job submit: max_submits_in_flight) else
        503, and once its lane is known a bulk slot (`lease.take_lane`)."""
        timeout = None if submit else deadline_s(request.headers, self.args)
        lease = Lease(self, self.bodies.hold(), timeout)
        try:
            check_media_type(request.headers, media)
            wait = self.args.body_timeout_s if timeout is None else min(self.args.body_timeout_s, timeout)
            lease.body = await read_body(request, body_limit(self.limits), wait, lease.hold)
            if submit:
                self._take_submit_slot()
            else:
                self._take_slot()
            try:
                yield lease
            finally:
                if submit:
                    self.submitting -= 1
                else:
                    self.in_flight -= 1
                self.bulk_in_flight -= lease.bulk
        finally:
            lease.hold.release()

    def _take_slot(self) -> None:
        if self.in_flight >= self.args.max_in_flight:
            self.admission.count_refusal("in_flight", current_client())
            raise Overloaded(f"{self.in_flight} requests in progress here; retry shortly",
                             retry_after_s=self.args.retry_after_s)
        self.in_flight += 1

    def _take_bulk_slot(self, opts: OcrOptions) -> bool:
        """A bulk request also takes one of lanes.bulk_max_in_flight (of
        max_in_flight): the rest stay for interactive requests. True if taken."""
        if opts.priority != BULK or not self.lanes.enabled:
            return False
        if self.bulk_in_flight >= self.lanes.bulk_max_in_flight:
            raise Overloaded(f"{self.bulk_in_flight} bulk requests in progress here; retry shortly, or submit a job",
                             retry_after_s=self.args.retry_after_s)
        self.bulk_in_flight += 1
        return True

    def _take_submit_slot(self) -> None:
        if self.submitting >= self.args.max_submits_in_flight:
            raise Overloaded(f"{self.submitting} job submits in progress here; retry shortly",
                             retry_after_s=self.args.retry_after_s)
        self.submitting += 1

    @api.post("/v1/ocr", dependencies=V1, openapi_extra=ocr_request_body(), summary="Read the text in one image")
    async def http_ocr(self, request: Request, rid: RequestId, fmt: Format = None):
        async with self.lease(request) as lease:
            upload, opts = await parse_body(request, lease.body, self.limits)
            opts = lease.take_lane(with_lane(with_format(opts, fmt), request, INTERACTIVE))
            result, cache = await self.read(upload, opts, lease.context(rid, opts), lease.late(),
                                            wants_fresh(request.headers.get("cache-control")))
        request.state.timings_ms = result.get("timings_ms")
        response = await formatted({"request_id": rid, **result}, opts.format)
        response.headers["X-Cache"] = cache
        return response

    @api.post("/v1/ocr/batch", dependencies=V1, openapi_extra=batch_request_body(),
              summary="Read several images (or PDFs) in one request; one result or error per item, in order")
    async def http_ocr_batch(self, request: Request, rid: RequestId):
        """An adapter on the read path: the items in, one result (with its
        `cache`) or error per item out. One slot per batch; its items go to
        the read path batch_concurrency at a time, under the batch's deadline."""
        async with self.lease(request) as lease:
            items, opts = await batch_items(request, lease.body, self.limits, self.args.max_batch_items)
            opts = lease.take_lane(with_lane(opts, request, INTERACTIVE).for_pipeline())
            ctx, late = lease.context(rid, opts), lease.late()
            fresh = wants_fresh(request.headers.get("cache-control"))
            gate = asyncio.Semaphore(self.args.batch_concurrency)

            async def one(index: int, item) -> dict:
                if isinstance(item, OcrError):
                    return _item_error(index, item)
                async with gate:
                    try:
                        result, cache = await self.read(item, opts, ctx, late, fresh)
                        return {"index": index, **result, "cache": cache}
                    except Exception as exc:  # this item's failure only; cancellation propagates
                        e = exc if isinstance(exc, OcrError) else None
                        if e is None:
                            log.error("request %s item %d failed", rid, index, exc_info=exc)
                            e = OcrError("internal error; this item was not completed")
                        return _item_error(index, e)

            out = await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
        return JSONResponse({"request_id": rid, "items": out})

    @api.post("/ocr", dependencies=PADDLEX, summary="PaddleX-compatible OCR (PaddleX's serving API: file as base64, "
              "fileType 0 PDF / 1 image)", openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": paddlex.PaddleXOcrRequest.model_json_schema()}}}})
    async def paddlex_ocr(self, request: Request, rid: RequestId):
        """An adapter on the read path: PaddleX's request in, its response
        shape out (serve_app/http/paddlex.py); errors, the token's included, as
        HTTP status + {"logId", "errorCode", "errorMsg"} (the exception
        handler renders them so for this route)."""
        async with self.lease(request, JSON_ONLY) as lease:
            req = await asyncio.to_thread(paddlex.parse_request, lease.body)
            data, opts = await asyncio.to_thread(paddlex.to_call, req)
            upload = upload_of(data, self.limits, "file")
            del data
            if req.visualize is not False:  # PaddleX visualizes unless told not to: the pipeline draws it
                opts = replace(opts, visualize="boxes")
            opts = lease.take_lane(with_lane(opts, request, INTERACTIVE))
            result, cache = await self.read(upload, opts, lease.context(rid, opts), lease.late(),
                                            wants_fresh(request.headers.get("cache-control")))
        images = [paddlex.images_of(page) for page in paddlex.pages_of(result)] if opts.visualize else None
        response = JSONResponse(paddlex.success(request.state.log_id, paddlex.result(result, opts, self.paddlex, images)))
        response.headers["X-Cache"] = cache
        return response

    @api.post("/v1/ocr/jobs", status_code=202, dependencies=V1, openapi_extra=ocr_request_body(),
              summary="Submit an image; poll the job for the result")
    async def http_submit_job(self, request: Request, fmt: Format = None):
        key = idempotency_key(request.headers)
        async with self.lease(request, submit=True) as lease:  # a gate of their own: a submit is short, a sync request long
            # A format is kept with the job (its pipeline run then makes
            # word boxes for hOCR/ALTO); the job's result stays JSON.
            upload, opts = await parse_body(request, lease.body, self.limits)
            opts = with_lane(with_format(opts, fmt).for_pipeline(), request, BULK)  # a job is bulk unless it asks otherwise
            # Junk is a 400 now, not a failed job later (header only, off
            # the loop); a document is opened, its pages counted, none rendered.
            await asyncio.to_thread(self._check_upload, upload)
            job = await downstream(self.jobs.submit.remote(upload.data, opts, key, client_of_request(request)))
        return JSONResponse({"job_id": job["job_id"], "status": job["status"]}, status_code=202,
                            headers={"Location": f"/v1/ocr/jobs/{job['job_id']}"})

    def _check_upload(self, upload: Upload) -> None:
        if upload.is_document:  # a PDF, a multi-page TIFF
            check_document(upload.data, self.documents)
        else:
            check_image_header(upload.data, self.limits)

    @api.get("/v1/ocr/jobs/{job_id}", dependencies=V1, summary="A job's status, and its result once done")
    async def http_get_job(self, job_id: str, fmt: Format = None):
        """JSON status (and result once done); with `?format=text|hocr|alto`
        a succeeded job's result in that format (while it is not done, the
        JSON status whatever the format)."""
        fmt = with_format(parse_options(None), fmt).format
        job = await downstream(self.jobs.get.remote(job_id))
        if job is None:
            raise NotFound(f"no job {job_id!r}: unknown, or expired after its time to live")
        if job.get("status") != "succeeded":
            return JSONResponse(job)
        return await formatted(job, fmt)

    @api.get("/healthz", summary="Alive")
    async def healthz(self):
        return {"status": "ok"}

    async def _probe_ready(self) -> dict:
        try:
            return await self.pipeline.ready.remote()
        except Exception:
            return {}

    @api.get("/readyz", summary="Every model loaded and warmed")
    async def readyz(self):
        """Open (for probes), but cheap: one probe of the stages at a time,
        its answer reused for ingress.ready_cache_s."""
        now = time.monotonic()
        if self._ready is None or now - self._ready[0] > self.args.ready_cache_s:
            if self._ready_probe is None or self._ready_probe.done():
                self._ready_probe = asyncio.ensure_future(self._probe_ready())
            stages = await asyncio.shield(self._ready_probe)
            self._ready = (time.monotonic(), stages)
        stages = self._ready[1]
        ready = bool(stages) and all(stages.values())
        return JSONResponse({"ready": ready, "stages": stages}, status_code=200 if ready else 503)

    # -- the web page and its live view --------------------------------------
    # The page holds no secret, so it is open like /healthz; what it calls
    # (/v1/ocr, /v1/stats) carries the token the person types in.
    # Served at / and /ui alike: both resolve the page's relative URLs
    # (ui/app.js, v1/ocr) under the app's route prefix.
    @api.get("/", include_in_schema=False)
    async def root(self):
        return self._static("index.html")

    @api.get("/ui", include_in_schema=False)
    async def ui_page(self):
        return self._static("index.html")

    @api.get("/ui/options.json", include_in_schema=False)
    async def ui_options(self):
        return JSONResponse(page_config())

    @api.get("/ui/{name}", include_in_schema=False)
    async def ui_file(self, name: str):
        return self._static(name)

    def _static(self, name: str) -> Response:
        found = static_file(name)
        if found is None:
            raise NotFound(f"no page file {name!r}")
        content, media = found
        return Response(content, media_type=media, headers={"Cache-Control": "no-cache", **PAGE_HEADERS})

    async def _gather_stats(self) -> dict:
        """Replica states from Serve's controller, and each model stage's
        replicas' stats() through the pipeline (each asked about twice as
        often as it has replicas running, at most 8 times)."""
        app = serve.get_replica_context().app_name
        try:
            status = await asyncio.wait_for(asyncio.to_thread(serve.status), timeout=3.0)
            deployments = deployment_summary(status.applications[app].deployments)
        except Exception as e:  # the live view shows what it got
            log.warning("live view: no deployment status: %s", e)
            deployments = {}
        names = {"det": "TextDetector", "cls": "DirectionClassifier", "rec": "TextRecognizer"}
        calls = {s: min(8, 2 * max(1, deployments.get(n, {}).get("running", 1))) for s, n in names.items()}
        try:
            stages = await asyncio.wait_for(self.pipeline.stats.remote(calls), timeout=5.0)
        except Exception as e:
            log.warning("live view: no stage stats: %s", e)
            stages = {}
        now = time.time()
        return {
            "time": now,
            "app": app,
            "deployments": deployments,
            "stages": {s: {"deployment": names.get(s, s), **stage_summary(r, now)} for s, r in stages.items()},
            "ingress": {"in_flight": self.in_flight, "max_in_flight": self.args.max_in_flight,
                        "bulk_in_flight": self.bulk_in_flight,
                        "job_submits_in_flight": self.submitting, "admission": self.admission.snapshot()},
            "history": {"bucket_s": self.history.bucket_s, "buckets": self.history.snapshot(now)},
        }

    @api.get("/v1/stats", dependencies=V1, summary="Live figures: replicas, queues, batches, recent requests")
    async def http_stats(self):
        """What the page's live view draws. Cheap under any polling: one
        gathering at a time, its answer reused for ingress.stats_cache_s.
        The history is this ingress replica's (one by default)."""
        now = time.monotonic()
        if self._stats is None or now - self._stats[0] > self.args.stats_cache_s:
            if self._stats_probe is None or self._stats_probe.done():
                self._stats_probe = asyncio.ensure_future(self._gather_stats())
            body = await asyncio.shield(self._stats_probe)
            self._stats = (time.monotonic(), body)
        return JSONResponse(self._stats[1])
