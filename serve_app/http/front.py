"""The front: what the ingress is, without Ray. One object per ingress
replica holding what every HTTP request leases (the body budget, the
in-flight slots, the bulk lane's slots), the one read path every sync door
goes through (`Front.read_upload`: admission, the result cache, the deadline and
the error mapping), the handle API's logic (`Front.ocr`), readiness and the
live figures.

It is given the pipeline and job-store handles (any object whose methods
have `.remote(...)`), its metrics, how to tell the handles' own errors from
the domain errors behind them (HandleErrors) and what it may ask of the
platform (`cluster`: app_name(), status()); the Serve deployment
(serve_app/http/ingress.py) passes Ray's. The routes
(serve_app/http/routes/) get it as a dependency of the app that
serve_app/http/app.py builds over it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional

from starlette.requests import Request

from serve_app.core.app_args import CacheArgs, IngressArgs, LaneArgs
from serve_app.core.engine_config import DocumentLimits, ImageLimits
from serve_app.core.errors import ConfigError, DeadlineExceeded, Overloaded, Unavailable
from serve_app.core.lanes import BULK, INTERACTIVE
from serve_app.core.request_context import RequestContext
from serve_app.core.model_sets import DEFAULT_MODEL, SETS
from serve_app.core.request_options import OcrOptions, parse_options
from serve_app.flow.render_pool import RenderPool
from serve_app.flow.upload import Upload, upload_of
from serve_app.http import paddlex
from serve_app.http.clients import ClientIdentity
from serve_app.http.body import (
    OCR_TYPES, BodyBudget, BodyHold, BytePace, body_limit, check_media_type, content_length, read_body,
)
from serve_app.http.headers import deadline_s
from serve_app.ocr.image_header import check_structure
from serve_app.http.policies.admission import Admission, Gate, current_client
from serve_app.http.policies.answers import Answers
from serve_app.http.policies.live_stats import RollingHistory, deployment_summary, stage_summary
from serve_app.http.policies.result_cache import Dedupe, Deferred, ResultCache
from serve_app.http.policies.slots import ClientSlots

log = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class HandleErrors:
    """The errors a handle call raises besides the domain errors (`types`,
    rendered as the JSON error body like those), the domain error behind
    each (`unwrap`), and how to start a call that no one request owns
    (`detach(start, *args)`: a computation that identical requests share).
    Ray's: serve_app.http.ingress.RAY_ERRORS."""

    types: tuple[type[BaseException], ...] = ()
    unwrap: Callable[[BaseException], BaseException] = lambda e: e
    detach: Callable[..., Any] = lambda start, *args: start(*args)


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


# A handle call's argument from this size on is put into the object store
# off the event loop (Front.handle_arg).
LARGE_ARG_BYTES = 1024 * 1024


class CachedCall:
    """A value made by one call at a time and reused for `ttl_s` seconds
    (readiness, the live figures): cheap under any polling. A caller that
    goes away does not cancel the call the others wait on."""

    def __init__(self, make):
        self.make = make
        self.last: Optional[tuple[float, Any]] = None  # (when, value) of the last call
        self.call: Optional[asyncio.Future] = None

    async def get(self, ttl_s: float) -> Any:
        if self.last is None or time.monotonic() - self.last[0] > ttl_s:
            if self.call is None or self.call.done():
                self.call = asyncio.ensure_future(self.make())
            value = await asyncio.shield(self.call)
            self.last = (time.monotonic(), value)
        return self.last[1]


class Lease:
    """One HTTP request's hold on the front (Front.lease): its share of the
    body budget, its body, its deadline and whether it holds a bulk slot."""

    def __init__(self, front: "Front", hold: BodyHold, timeout_s: Optional[float]):
        self.front, self.hold, self.timeout_s = front, hold, timeout_s
        self.deadline = None if timeout_s is None else time.time() + timeout_s  # wall clock, as the replicas get it
        self.body = b""
        self.bulk = False
        self.large = False  # holds one of max_large_submits
        self.client: Optional[str] = None  # whose in-flight slot it holds (Front.client_slots)

    def take_lane(self, opts: OcrOptions) -> OcrOptions:
        """The request's lane is known: a bulk request takes a bulk slot too."""
        self.bulk = self.front._take_bulk_slot(opts)
        return opts

    def context(self, request_id: str, opts: OcrOptions) -> RequestContext:
        return RequestContext(request_id, self.deadline, opts.priority or INTERACTIVE, current_client() or "")

    def late(self) -> str:
        return f"not done within the {self.timeout_s:g} s deadline"


class Front:
    """The ingress's state and its one read path (module docstring).
    `metrics`: request outcomes and latencies (serve_app.serving.metrics.
    RequestMetrics or an object with the same four meters);
    `admission_metrics`, `cache_metrics`: Admission's and Dedupe's (None:
    not counted)."""

    def __init__(self, pipeline: Any, jobs: Any, limits: ImageLimits,
                 args: IngressArgs = IngressArgs(), documents: DocumentLimits = DocumentLimits(),
                 paddlex_defaults: Optional[paddlex.PaddleXDefaults] = None, cache: CacheArgs = CacheArgs(),
                 model_id: str = "", lanes: LaneArgs = LaneArgs(), *, metrics: Any, cluster: Any,
                 admission_metrics: Any = None, cache_metrics: Any = None, errors: HandleErrors = HandleErrors(),
                 models: tuple = (DEFAULT_MODEL,), put: Optional[Callable[[Any], Any]] = None):
        # The OcrPipeline deployment serves every read (sync, jobs) and
        # answers readiness and stats: one placement, one bulk gate per
        # pipeline replica (docs/architecture.md).
        self.pipeline = pipeline
        self.jobs = jobs
        self.models = models
        self.limits = limits
        self.args = args
        self.documents = documents
        self.paddlex = paddlex_defaults or paddlex.PaddleXDefaults({}, 0.5, True)
        self.cluster = cluster
        self.errors = errors
        self.put = put  # ray.put in the ingress (handle_arg)
        self.in_flight = 0
        self.bulk_in_flight = 0  # of in_flight, bulk-lane requests (capped by lanes.bulk_max_in_flight)
        self.lanes = lanes
        self.submitting = 0
        self.large_submits = 0  # of those, submits with a large body (ingress.max_large_submits)
        self.bodies = BodyBudget(args.max_body_bytes, args.retry_after_s)
        self.submit_pace = BytePace(args.submit_bytes_per_s)
        self.metrics = metrics
        self.renders = RenderPool(args.render_workers, args.render_waiting, args.large_result_bytes,
                                  args.max_large_reads, retry_after_s=max(args.retry_after_s, 1))
        self.answers = Answers(args.answer_cache_bytes, args.answer_bytes_per_s)  # job results as sent, made once
        # Admission by cost (serve_app.http.policies.admission): one ledger for /v1/ocr, its batch items, /ocr and the handle.
        self.admission = Admission(args.admission, admission_metrics, default_retry_s=args.retry_after_s,
                                   max_requests=args.max_in_flight)
        self.client_slots = ClientSlots(args.retry_after_s)  # the in-flight slots by client
        # Identical requests computed once per ingress replica (serve_app.http.policies.result_cache).
        self.dedupe = Dedupe(model_id, ResultCache(cache.max_bytes, cache.ttl_s) if cache.max_bytes else None,
                             cache.share_in_flight, cache_metrics, downstream, args.max_timeout_s, errors.detach)
        # The stages' readiness, kept current by a background task (Front.ready): /readyz never waits on a probe.
        self._ready_state: Optional[tuple[float, dict]] = None  # (when probed, the stages' answer)
        self._ready_task: Optional[asyncio.Task] = None
        self._ready_asked = 0.0
        self.history = RollingHistory(args.stats_bucket_s, args.stats_span_s)
        self._stats = CachedCall(self._gather_stats)  # the live figures, one gathering at a time
        self.token: Optional[bytes] = None
        if args.auth_token_env:
            token = os.environ.get(args.auth_token_env, "")
            if not token:
                raise ConfigError(f"ingress.auth_token_env names {args.auth_token_env!r}, but that environment "
                                  f"variable is empty or unset in the ingress replica (set it, e.g. through "
                                  f"runtime_env.env_vars, or remove auth_token_env)")
            self.token = token.encode()
        self.clients = ClientIdentity.from_args(args)  # who a request's client is (serve_app/http/clients.py)

    # -- the one read path -----------------------------------------------------
    async def read_upload(self, upload: Upload, opts: OcrOptions, ctx: RequestContext, late: str = "",
                   fresh: bool = False) -> tuple[dict, str]:
        """Every synchronous door's read (POST /v1/ocr, each item of
        /v1/ocr/batch, PaddleX's /ocr, the handle's `ocr`): admission by
        cost, the result cache and in-flight sharing, the deadline (the
        context's: past it a 504, and the pipeline's call is cancelled
        with its pending stage calls unless another identical request
        still waits on it) and the error mapping (a handle's error raised
        as the domain error behind it). -> (the result body, how the cache
        answered: hit | shared | miss | bypass). `fresh`: computed alone,
        not looked up (Cache-Control: no-cache)."""
        late = late or "not done within the request's deadline"
        # The model set first: unserved is a 400 before admission, cache or any
        # work (nothing is ever loaded for a request); it is part of the key.
        popts = opts.with_model(self.models).for_pipeline()  # the key: JSON and rendered formats share one computation
        try:
            left = ctx.time_left()
            if left is not None and left <= 0:
                raise DeadlineExceeded(late)
            if not upload.is_document and isinstance(upload.data, (bytes, bytearray, memoryview)):
                # the decoder's bounded walks (chunks, frames, segments), here at the door, before a
                # price; a small body's walk is a few hundred steps at most: inline
                if len(upload.data) <= 256 * 1024:
                    check_structure(upload.data)
                else:
                    await asyncio.to_thread(check_structure, upload.data)
            # Admitted only if it starts a computation (a hit costs nothing; a shared one shares its ticket).
            with Gate(self.admission, upload, left, self.documents, limits=self.limits, options=popts) as gate:
                start = lambda d, u=upload: self.pipeline.ocr.remote(u, popts, ctx.until(d))  # noqa: E731
                if self.put is not None and upload.nbytes >= LARGE_ARG_BYTES:  # its bytes put off the loop first
                    call = start
                    start = lambda d: Deferred(self.handle_upload(upload), lambda u: call(d, u))  # noqa: E731
                result, cache = await self.dedupe.read(upload.data, popts, left, start, late, fresh, gate=gate)
                gate.done(result)
        except Exception as e:
            raise self.errors.unwrap(e) from None
        if cache in ("miss", "bypass"):  # a hit's or a shared answer's timings were counted once already
            for step, ms in result.get("timings_ms", {}).items():
                self.metrics.stage_latency.observe(ms, tags={"step": step})
        return result, cache

    # -- the handle API (other Ray jobs and deployments) -------------------------
    async def ocr(self, image: Any, options: Optional[dict] = None) -> Any:
        """`serve.get_app_handle("ocr").ocr.remote(image_bytes_or_array)` (or
        a PDF's bytes): the same dict as the HTTP body, with `cache`; with
        options `format` text, hocr or alto, that document as a str instead.
        Domain errors raise. No slot or body budget (those are HTTP's): a
        handle caller is bounded by Serve's max_ongoing_requests."""
        opts = parse_options(options).with_lane(INTERACTIVE)  # refuse bad options here, before any work
        upload = upload_of(image, self.limits)
        ctx = RequestContext.of(uuid.uuid4().hex, None, opts.priority)
        result, cache = await self.read_upload(upload, opts, ctx)
        body = {"request_id": ctx.request_id, **result, "cache": cache}
        return body if opts.format == "json" else (await self.renders.render(body, opts.format))[0].decode()

    # -- HTTP -----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, request: Request, media: tuple[str, ...] = OCR_TYPES,
                    submit: bool = False) -> AsyncIterator[Lease]:
        """What one HTTP request holds of this front while it is served,
        taken in this order and all given back on leaving: its deadline
        (X-Request-Timeout; a job submit has none), its media type (else
        415), for a job submit of a large body (by Content-Length) one of
        ingress.max_large_submits (else 503), its body, read within ingress.body_timeout_s (or what is left
        of the deadline) else 408, under the size limit else 413 and within
        the ingress's budget of body bytes else 503, then an in-flight slot
        (ingress.max_in_flight; a job submit: max_submits_in_flight) else
        503, and once its lane is known a bulk slot (`lease.take_lane`)."""
        timeout = None if submit else deadline_s(request.headers, self.args)
        lease = Lease(self, self.bodies.hold(), timeout)
        try:
            check_media_type(request.headers, media)
            declared = content_length(request.headers)
            if submit and (declared is None or declared >= self.args.large_result_bytes):
                lease.large = self._take_large_submit(declared or 0)  # before its body is read
            wait = self.args.body_timeout_s if timeout is None else min(self.args.body_timeout_s, timeout)
            lease.body = await read_body(request, body_limit(self.limits), wait, lease.hold)
            if lease.large:
                self.submit_pace.pay(len(lease.body) - (declared or 0))  # a body of undeclared length
            if submit:
                self._take_submit_slot()
            else:
                lease.client = self._take_slot()
            try:
                yield lease
            finally:
                if submit:
                    self.submitting -= 1
                else:
                    self.in_flight -= 1
                    self.client_slots.give(lease.client)
                self.bulk_in_flight -= lease.bulk
        finally:
            lease.hold.release()
            self.large_submits -= lease.large

    def _take_slot(self) -> Optional[str]:  # within the client's share of them (serve_app.http.policies.slots)
        client = self.client_slots.take(current_client(), self.admission)  # its share first: the likelier answer
        if self.in_flight >= self.args.max_in_flight:
            self.client_slots.give(client)
            self.admission.count_refusal("in_flight", current_client())
            raise Overloaded(f"{self.in_flight} requests in progress here; retry shortly",
                             retry_after_s=self.args.retry_after_s)
        self.in_flight += 1
        return client

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

    def _take_large_submit(self, declared: int) -> bool:
        """A job submit whose Content-Length is at least
        ingress.large_result_bytes (or not given: a chunked body) also takes
        one of max_large_submits, and its bytes are paced at
        submit_bytes_per_s: its body's transfer and checks (a 19 MB PNG of
        250 chunks) are tens of ms of CPU in the proxy, here and in the job
        store, and four clients sending such bodies back to back took
        /healthz to 0.3 s one at a time, 120-160 ms unpaced."""
        if self.large_submits >= self.args.max_large_submits:
            raise Overloaded(f"{self.large_submits} large job submits are being read here; retry shortly",
                             retry_after_s=max(self.args.retry_after_s, 2))
        wait = self.submit_pace.take(declared)
        if wait is not None:
            raise Overloaded(f"large job submits are taken at {self.args.submit_bytes_per_s} bytes a second, all "
                             "clients together; retry shortly", retry_after_s=max(1, math.ceil(wait)))
        self.large_submits += 1
        return True

    def _take_submit_slot(self) -> None:
        if self.submitting >= self.args.max_submits_in_flight:
            raise Overloaded(f"{self.submitting} job submits in progress here; retry shortly",
                             retry_after_s=self.args.retry_after_s)
        self.submitting += 1

    async def handle_arg(self, data: Any) -> Any:
        """`data` as a handle call's argument: a body of LARGE_ARG_BYTES or
        more is put into Ray's object store by a worker thread first (`put`),
        and the call carries its reference. Serialised by the call itself,
        on the event loop, a 19 MB job body held the loop ~20 ms per submit."""
        if self.put is None or not isinstance(data, (bytes, bytearray)) or len(data) < LARGE_ARG_BYTES:
            return data
        return await asyncio.to_thread(self.put, data)

    async def handle_upload(self, upload: Upload) -> Upload:
        """`upload` with its bytes as handle_arg makes them (the pipeline awaits a reference: arrived())."""
        return dataclasses.replace(upload, data=await self.handle_arg(upload.data))

    @property
    def models(self) -> tuple[str, ...]:
        """The catalogue's names (serve_app.core.model_sets, own_sets), the default first."""
        return tuple(m["name"] for m in self.catalogue)

    @models.setter
    def models(self, models: tuple) -> None:
        """Names, or the sets as GET /v1/models describes them (an application's own sets come so)."""
        self.catalogue = tuple(m if isinstance(m, dict) else SETS[m].describe(default=k == 0)
                               for k, m in enumerate(models))

    # -- readiness and the live figures ------------------------------------------
    READY_IDLE_S = 60.0  # the background probes stop this long after the last /readyz (and start again with the next)
    NOT_READY_PROBE_S = 0.1  # after a probe that found a stage not ready (a start), the next comes this soon

    async def ready(self) -> dict:
        """The stages' readiness as last probed, at once: a background task
        probes every ingress.ready_cache_s while /readyz is asked (one probe
        at a time, each within ready_timeout_s; every NOT_READY_PROBE_S while
        a stage is not ready, so a start is seen at once), so a call never waits on a
        probe or a busy pipeline, only the first (or one after the probes
        have idled past READY_IDLE_S) waits for a probe."""
        now = time.monotonic()
        self._ready_asked = now
        if self._ready_task is None or self._ready_task.done():
            self._ready_task = asyncio.ensure_future(self._keep_ready())
        state = self._ready_state
        if state is None or now - state[0] > self.READY_IDLE_S:
            first = self._ready_state
            while self._ready_state is first and not self._ready_task.done():
                await asyncio.sleep(0.005)  # the running probe answers within ready_timeout_s
            state = self._ready_state
        return state[1] if state is not None else {}

    async def _keep_ready(self) -> None:
        while True:
            stages = await self._probe_ready()
            self._ready_state = (time.monotonic(), stages)
            if time.monotonic() - self._ready_asked > self.READY_IDLE_S:
                return
            ready = bool(stages) and all(stages.values())
            await asyncio.sleep(max(self.args.ready_cache_s, 0.01) if ready else self.NOT_READY_PROBE_S)

    async def stats(self) -> dict:
        """The live figures: one gathering at a time, its answer reused for
        ingress.stats_cache_s."""
        return await self._stats.get(self.args.stats_cache_s)

    async def model_states(self) -> dict[str, dict]:
        """Each catalogued set's state as the pipeline holds it ("loaded",
        "loading", "not loaded", "failed"; serve_app/serving/set_cache.py);
        {} when the pipeline does not answer in time."""
        try:
            return await asyncio.wait_for(self.pipeline.model_states.remote(), timeout=self.args.ready_timeout_s)
        except Exception:
            return {}

    async def _probe_ready(self) -> dict:
        try:
            return await asyncio.wait_for(self.pipeline.ready.remote(), timeout=self.args.ready_timeout_s)
        except Exception:  # a stage that does not answer in time (or at all) is not ready
            return {}

    async def _gather_stats(self) -> dict:
        """Replica states from the platform (`cluster.status()`, Serve's),
        and each model stage's replicas' stats() through the pipeline (each
        asked about twice as often as it has replicas running, at most 8
        times)."""
        app = self.cluster.app_name()
        try:
            status = await asyncio.wait_for(asyncio.to_thread(self.cluster.status), timeout=3.0)
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
            "stages": {s: {"deployment": home(names.get(s, s), deployments), **stage_summary(r, now)}
                       for s, r in stages.items()},
            "ingress": {"in_flight": self.in_flight, "max_in_flight": self.args.max_in_flight,
                        "bulk_in_flight": self.bulk_in_flight,
                        "job_submits_in_flight": self.submitting, "admission": self.admission.snapshot(),
                        "cache": self.dedupe.stats()},
            "history": {"bucket_s": self.history.bucket_s, "buckets": self.history.snapshot(now)},
        }


def home(name: str, deployments: dict) -> str:
    """The deployment whose replicas run a stage: its own, else the
    recogniser's (detector/classifier.beside_recognizer), else the
    pipeline's (recognizer.with_pipeline). Unknown deployments: its own."""
    if not deployments or name in deployments:
        return name
    return "TextRecognizer" if "TextRecognizer" in deployments else "OcrPipeline"
