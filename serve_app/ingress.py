"""The HTTP ingress (FastAPI under @serve.ingress) and the handle API.

Only this module turns domain errors into HTTP responses, with FastAPI's own
tools: dependencies give each /v1 route its request id and check the bearer
token, exception handlers turn domain and Ray errors into the JSON error
body, and one middleware counts every /v1 request's outcome. Reading the
request is serve_app.http_body and serve_app.http_headers (no Ray there)."""

import asyncio
import logging
import os
import time
import uuid
from dataclasses import replace
from typing import Annotated, Any, Optional

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError, RayError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException

from . import paddlex
from .admission import Admission, Gate
from .config import DocumentLimits, ImageLimits
from .documents import PdfFile, check_pdf, is_pdf
from .errors import (
    BadRequest, ConfigError, DeadlineExceeded, NotFound, OcrError, Overloaded, TooLarge, Unauthorized, Unavailable,
)
from .formats import render
from .http_body import BodyBudget, batch_items, body_limit, check_media_type, parse_body, read_body
from .http_headers import bearer_matches, check_exposure, deadline_s, idempotency_key, priority
from .http_schema import batch_request_body, ocr_request_body
from .image_header import check_image_header
from .job_clients import client_of_request
from .lanes import BULK, INTERACTIVE
from .live_stats import RollingHistory, deployment_summary, stage_summary
from .metrics import AdmissionMetrics, CacheMetrics, RequestMetrics
from .options import FORMATS, OcrOptions, parse_options, with_format
from .pipeline_here import PipelineHere
from .result_cache import Dedupe, ResultCache, wants_fresh
from .settings import CacheArgs, IngressArgs, LaneArgs
from .stages.decode import decode_image
from .ui import page_config, static_file

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

# `?format=json|text|hocr|alto` on the OCR routes (serve_app.formats); it
# wins over the options' own `format`.
Format = Annotated[Optional[str], Query(alias="format", description=f"one of {', '.join(FORMATS)} (default json)")]


def with_format_of(parsed: tuple, fmt: Optional[str]) -> tuple:
    data, opts = parsed
    return data, with_format(opts, fmt).for_pipeline()


def with_lane(opts: OcrOptions, request: Request, default: str) -> OcrOptions:
    """The options with the request's lane: X-Priority, else the options'
    own `priority`, else the route's default (serve_app.lanes)."""
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
    if not isinstance(e, OcrError):
        log.error("request %s failed", rid, exc_info=exc)
        e = OcrError("internal error; the request was not completed")
    request.state.error_code = e.code  # counted by the middleware
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


@api.middleware("http")
async def docs_behind_token(request: Request, call_next):
    """With a token, the API docs (/docs, /openapi.json) need it too."""
    if request.url.path in DOC_PATHS:
        token = _ingress().token
        if token is not None and not bearer_matches(request.headers.get("authorization"), token):
            return await domain_error(request, Unauthorized("missing or wrong bearer token (Authorization: Bearer TOKEN)"))
    return await call_next(request)


@api.middleware("http")
async def count_outcomes(request: Request, call_next):
    """Every /v1 request's status, error code and latency, counted in one
    place; an exception no handler took becomes a 500 JSON error."""
    t0 = time.perf_counter()
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


def pipeline_here(handle: DeploymentHandle, init_args: tuple) -> PipelineHere:
    """The OcrPipeline's code as an object in this process (same class,
    same stage calls), standing in for its handle's `ocr`."""
    from .deployments import OcrPipeline

    return PipelineHere(OcrPipeline.func_or_class(*init_args), handle)


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
                 model_id: str = "", lanes: LaneArgs = LaneArgs(), local_pipeline: Optional[tuple] = None):
        # With ingress.pipeline_in_ingress, `local_pipeline` holds the
        # OcrPipeline's own init args (the model deployments' handles...):
        # sync reads run that pipeline here (serve_app/pipeline_here.py).
        self.pipeline = pipeline if local_pipeline is None else pipeline_here(pipeline, local_pipeline)
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
        # Admission by cost (serve_app.admission): one ledger for /v1/ocr, its batch items, /ocr and the handle.
        self.admission = Admission(args.admission, AdmissionMetrics(), default_retry_s=args.retry_after_s)
        # Identical requests computed once per ingress replica (serve_app.result_cache).
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

    # -- handle API (other Ray jobs and deployments) -------------------------
    async def ocr(self, image: Any, options: Optional[dict] = None) -> Any:
        """`serve.get_app_handle("ocr").ocr.remote(image_bytes_or_array)` (or
        a PDF's bytes): the same dict as the HTTP body; with options `format`
        text, hocr or alto, that document as a str instead. Domain errors raise."""
        opts = parse_options(options).with_lane(INTERACTIVE)  # refuse bad options here, before any work
        try:
            popts = opts.for_pipeline()  # the key: JSON and rendered formats share one computation
            with Gate(self.admission, image, None, self.documents) as gate:
                result, cache = await self.dedupe.read(
                    image, popts, None, lambda deadline: self.pipeline.ocr.remote(image, popts, deadline),
                    admit=gate.admit)
                gate.done(result)
        except Exception as e:
            raise unwrap(e) from None
        body = {"request_id": uuid.uuid4().hex, **result, "cache": cache}
        return body if opts.format == "json" else (await asyncio.to_thread(render, body, opts.format))[0]

    # -- HTTP -----------------------------------------------------------------
    async def _body(self, request: Request, deadline: float, held: list[int]) -> bytes:
        """The request's body, read before the request takes an in-flight
        slot: within ingress.body_timeout_s (or what is left of the
        request's deadline) else 408, under the size limit else 413, and
        within the ingress's budget of body bytes else 503."""
        check_media_type(request.headers)
        timeout = min(self.args.body_timeout_s, max(0.001, deadline - time.monotonic()))
        return await read_body(request, body_limit(self.limits), timeout, self.bodies, held)

    def _take_slot(self) -> None:
        if self.in_flight >= self.args.max_in_flight:
            self.admission.count_refusal("in_flight")
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
        timeout = deadline_s(request.headers, self.args)
        deadline = time.monotonic() + timeout
        held = [0]
        try:
            body = await self._body(request, deadline, held)
            self._take_slot()
            bulk = False
            try:
                data, opts = await parse_body(request, body, self.limits)
                opts = with_lane(with_format(opts, fmt), request, INTERACTIVE)
                bulk = self._take_bulk_slot(opts)
                del body
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeadlineExceeded(f"not done within the {timeout:g} s deadline")
                # Past the deadline: 504, and the pipeline's call is cancelled
                # (with its pending stage calls) unless another identical
                # request still waits on it; the replicas also get the
                # deadline (wall-clock) of a computation no one shares.
                popts = opts.for_pipeline()
                fresh = wants_fresh(request.headers.get("cache-control"))
                with Gate(self.admission, data, left, self.documents) as gate:  # admitted if it starts a computation
                    result, cache = await self.dedupe.read(
                        data, popts, left, lambda d: self.pipeline.ocr.remote(data, popts, d),
                        f"not done within the {timeout:g} s deadline", fresh, admit=gate.admit)
                    gate.done(result)
            finally:
                self.in_flight -= 1
                self.bulk_in_flight -= bulk
        finally:
            self.bodies.give(held[0])
        if cache in ("miss", "bypass"):  # a hit's or a shared answer's timings were counted once already
            for step, ms in result.get("timings_ms", {}).items():
                self.metrics.stage_latency.observe(ms, tags={"step": step})
        request.state.timings_ms = result.get("timings_ms")
        response = await formatted({"request_id": rid, **result}, opts.format)
        response.headers["X-Cache"] = cache
        return response

    async def _read(self, data: bytes, opts: OcrOptions, deadline: float, timeout: float) -> dict:
        """One image or PDF through the pipeline, within the deadline
        (time.monotonic()): past it a 504, and the pipeline's call is
        cancelled."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"not done within the {timeout:g} s deadline")
        with Gate(self.admission, data, left, self.documents) as gate:
            await gate.admit()
            left = deadline - time.monotonic()
            # The replicas get the deadline as wall-clock time: work still
            # queued for this request when it passes is dropped there.
            response = self.pipeline.ocr.remote(data, opts, time.time() + left)
            try:
                result = await downstream(asyncio.wait_for(asyncio.shield(response), left))
            except asyncio.TimeoutError:
                response.cancel()  # cancels the pipeline's task and its pending stage calls
                raise DeadlineExceeded(f"not done within the {timeout:g} s deadline") from None
            gate.done(result)
        for step, ms in result.get("timings_ms", {}).items():
            self.metrics.stage_latency.observe(ms, tags={"step": step})
        return result

    @api.post("/v1/ocr/batch", dependencies=V1, openapi_extra=batch_request_body(),
              summary="Read several images (or PDFs) in one request; one result or error per item, in order")
    async def http_ocr_batch(self, request: Request, rid: RequestId):
        timeout = deadline_s(request.headers, self.args)
        deadline = time.monotonic() + timeout
        held = [0]
        try:
            body = await self._body(request, deadline, held)
            self._take_slot()  # one slot per batch; its items go to the pipeline batch_concurrency at a time
            bulk = False
            try:
                items, opts = await batch_items(request, body, self.limits, self.args.max_batch_items)
                opts = with_lane(opts, request, INTERACTIVE).for_pipeline()
                bulk = self._take_bulk_slot(opts)
                del body
                gate = asyncio.Semaphore(self.args.batch_concurrency)

                async def one(index: int, item) -> dict:
                    if isinstance(item, OcrError):
                        return _item_error(index, item)
                    async with gate:
                        try:
                            return {"index": index, **await self._read(item, opts, deadline, timeout)}
                        except Exception as exc:  # this item's failure only; cancellation propagates
                            e = unwrap(exc)
                            if not isinstance(e, OcrError):
                                log.error("request %s item %d failed", rid, index, exc_info=exc)
                                e = OcrError("internal error; this item was not completed")
                            return _item_error(index, e)

                out = await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
            finally:
                self.in_flight -= 1
                self.bulk_in_flight -= bulk
        finally:
            self.bodies.give(held[0])
        return JSONResponse({"request_id": rid, "items": out})

    @api.post("/ocr", summary="PaddleX-compatible OCR (PaddleX's serving API: file as base64, fileType 0 PDF / 1 image)",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": paddlex.PaddleXOcrRequest.model_json_schema()}}}})
    async def paddlex_ocr(self, request: Request):
        """PaddleX's request and response shapes (serve_app/paddlex.py),
        errors included: HTTP status + {"logId", "errorCode", "errorMsg"}."""
        log_id = str(uuid.uuid4())
        held = [0]
        try:
            if self.token is not None and not bearer_matches(request.headers.get("authorization"), self.token):
                raise Unauthorized("missing or wrong bearer token (Authorization: Bearer TOKEN)")
            timeout = deadline_s(request.headers, self.args)
            deadline = time.monotonic() + timeout
            body = await read_body(request, body_limit(self.limits),
                                   min(self.args.body_timeout_s, timeout), self.bodies, held)
            self._take_slot()
            bulk = False
            try:
                req = await asyncio.to_thread(paddlex.parse_request, body)
                del body
                data, opts = await asyncio.to_thread(paddlex.to_call, req)
                opts = with_lane(opts, request, INTERACTIVE)
                bulk = self._take_bulk_slot(opts)
                if len(data) > self.limits.max_bytes:
                    raise TooLarge(f"file is {len(data)} bytes, over the limit of {self.limits.max_bytes}")
                result = await self._read(data, opts, deadline, timeout)
                images = None
                if req.visualize is not False:  # PaddleX visualizes unless told not to
                    images = await asyncio.to_thread(self._visualize, data, result)
            finally:
                self.in_flight -= 1
                self.bulk_in_flight -= bulk
            return JSONResponse(paddlex.success(log_id, paddlex.result(result, opts, self.paddlex, images)))
        except Exception as exc:
            e = unwrap(exc)
            if not isinstance(e, OcrError):
                log.error("PaddleX request %s failed", log_id, exc_info=exc)
                e = OcrError("Internal server error")
            retry = getattr(e, "retry_after_s", None)
            return JSONResponse(paddlex.failure(log_id, e.status, e.message), status_code=e.status,
                                headers={"Retry-After": str(retry)} if retry is not None else {})
        finally:
            self.bodies.give(held[0])

    def _visualize(self, data: bytes, result: dict) -> list[dict[str, str]]:
        """Each page's ocrImage and inputImage (a worker thread; one page
        bitmap at a time)."""
        pages = paddlex.pages_of(result)
        if not is_pdf(data):
            image = decode_image(data, self.limits, self.paddlex.exif_transpose)
            return [paddlex.visualization(image, pages[0]["results"])]
        with PdfFile(data, self.documents, self.limits.max_pixels) as pdf:
            return [paddlex.visualization(pdf.render(k), page["results"]) for k, page in enumerate(pages)]

    @api.post("/v1/ocr/jobs", status_code=202, dependencies=V1, openapi_extra=ocr_request_body(),
              summary="Submit an image; poll the job for the result")
    async def http_submit_job(self, request: Request, fmt: Format = None):
        key = idempotency_key(request.headers)
        held = [0]
        try:
            body = await self._body(request, time.monotonic() + self.args.body_timeout_s, held)
            self._take_submit_slot()  # a gate of their own: a submit is short, a sync request long
            try:
                # A format is kept with the job (its pipeline run then makes
                # word boxes for hOCR/ALTO); the job's result stays JSON.
                data, opts = with_format_of(await parse_body(request, body, self.limits), fmt)
                opts = with_lane(opts, request, BULK)  # a job is bulk unless it asks otherwise
                del body
                # Junk is a 400 now, not a failed job later (header only, off
                # the loop); a PDF is opened, its pages counted, none rendered.
                await asyncio.to_thread(self._check_upload, data)
                job = await downstream(self.jobs.submit.remote(data, opts, key, client_of_request(request)))
            finally:
                self.submitting -= 1
        finally:
            self.bodies.give(held[0])
        return JSONResponse({"job_id": job["job_id"], "status": job["status"]}, status_code=202,
                            headers={"Location": f"/v1/ocr/jobs/{job['job_id']}"})

    def _check_upload(self, data: bytes) -> None:
        if is_pdf(data):
            if len(data) > self.limits.max_bytes:
                raise TooLarge(f"PDF is {len(data)} bytes, over the limit of {self.limits.max_bytes}")
            check_pdf(data, self.documents)
        else:
            check_image_header(data, self.limits)

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
        return Response(content, media_type=media, headers={"Cache-Control": "no-cache"})

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
