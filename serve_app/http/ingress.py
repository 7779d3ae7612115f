"""The HTTP ingress deployment (FastAPI under @serve.ingress) and the handle API.

OcrIngress is the one read path every sync door goes through (`read`: the
request's lease, admission, the result cache, the deadline and the error
mapping) and the handle method `ocr`; its routes are one mixin per API on
the one FastAPI app (serve_app/http/api.py: dependencies, error handlers,
middleware): v1.py (/v1/ocr, /v1/ocr/batch), paddlex_api.py (/ocr),
jobs_api.py (/v1/ocr/jobs), page.py (probes, the web page, /v1/stats).
Reading the request is serve_app/http/body.py and serve_app/http/headers.py
(no Ray there)."""

import asyncio
import contextlib
import os
import time
import uuid
from typing import Any, AsyncIterator, Optional

from fastapi import Request
from ray import serve
from ray.serve.handle import DeploymentHandle

from serve_app.http import paddlex
from serve_app.serving.admission import Admission, Gate, current_client
from serve_app.core.engine_config import DocumentLimits, ImageLimits
from serve_app.core.errors import ConfigError, DeadlineExceeded, Overloaded
from serve_app.flow.formats import render
from serve_app.http.clients import ClientIdentity
from serve_app.http.body import OCR_TYPES, BodyBudget, BodyHold, body_limit, check_media_type, read_body
from serve_app.http.headers import check_exposure, deadline_s
from serve_app.core.lanes import BULK, INTERACTIVE
from serve_app.serving.live_stats import RollingHistory
from serve_app.serving.metrics import AdmissionMetrics, CacheMetrics, RequestMetrics
from serve_app.core.request_options import OcrOptions, parse_options
from serve_app.core.request_context import RequestContext
from serve_app.serving.result_cache import Dedupe, ResultCache
from serve_app.core.app_args import CacheArgs, IngressArgs, LaneArgs
from serve_app.flow.upload import Upload, upload_of
# Every route is registered on `api` when its module is imported: before the
# class below (@serve.ingress takes a frozen copy of the app).
from serve_app.http.api import api, unwrap, downstream
from serve_app.http.jobs_api import JobRoutes
from serve_app.http.page import PageRoutes, Reused
from serve_app.http.paddlex_api import PaddleXRoutes
from serve_app.http.v1 import V1Routes


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
class OcrIngress(V1Routes, PaddleXRoutes, JobRoutes, PageRoutes):
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
                             cache.share_in_flight, CacheMetrics(), downstream, flight_timeout_s=args.max_timeout_s)
        self._ready = Reused(self._probe_ready)  # the stages' readiness, one probe at a time
        self.history = RollingHistory(args.stats_bucket_s, args.stats_span_s)
        self._stats = Reused(self._gather_stats)  # the live figures, one gathering at a time
        self.token: Optional[bytes] = None
        if args.auth_token_env:
            token = os.environ.get(args.auth_token_env, "")
            if not token:
                raise ConfigError(f"ingress.auth_token_env names {args.auth_token_env!r}, but that environment "
                                  f"variable is empty or unset in the ingress replica (set it, e.g. through "
                                  f"runtime_env.env_vars, or remove auth_token_env)")
            self.token = token.encode()
        self.clients = ClientIdentity.from_args(args)  # who a request's client is (serve_app/http/clients.py)
        check_exposure(_serve_host(), self.token is not None or bool(self.clients.named_tokens), args.allow_anonymous)

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
            # Admitted only if it starts a computation (a hit costs nothing; a shared one shares its ticket).
            with Gate(self.admission, upload, left, self.documents, limits=self.limits, options=popts) as gate:
                result, cache = await self.dedupe.read(
                    upload.data, popts, left, lambda d: self.pipeline.ocr.remote(upload, popts, ctx.until(d)),
                    late, fresh, gate=gate)
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
