"""Ray Serve deployments, thin: each builds its stage in `__init__` from its
typed args, has one `@serve.batch` method taking a list and returning a list
of the same length, and `reconfigure` for the batch knobs. What a replica
does besides (predictor placement, warm-up, stats, failure isolation) is in
serve_app.serving.replica; the OCR steps are in serve_app.flow.pipeline.
Resources, replica counts and max_ongoing_requests are set in the Serve
config file (deployments.yaml), not here."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator, Optional

import numpy as np
from ray import serve
from ray.serve.handle import DeploymentHandle

from serve_app.serving.autoscaling import backlog_stats
from serve_app.serving.canary import classifier_probe, detector_probe, recognizer_probe
from serve_app.core.engine_config import EngineConfig
from serve_app.core.own_sets import SetLoading
from serve_app.serving.crop_scheduler import CropScheduler
from serve_app.serving.shapes_after_ready import DeferredShapes, core_shapes, kept_shapes
from serve_app.inference.int8_calibration import stage_inputs
from serve_app.core.lanes import INTERACTIVE, PriorityGate, lane_of
from serve_app.serving.metrics import LaneMetrics, LaneRequestMetrics
from serve_app.core.request_options import DetParams, OcrOptions, parse_options
from serve_app.serving.payloads import arrived, sized
from serve_app.flow.pipeline import Context, Pipeline, Stages
from serve_app.flow.fan_out import fanned_out, route_tag
from serve_app.serving.replica import Crops, ModelReplica, crops_weight
from serve_app.serving.set_cache import DeploymentSets, stage_states
from serve_app.serving.replica_calls import ReplicaCalls as _Replica, stage_batch as _batch
from serve_app.serving.batch_items import Timed, TimedCrops, _expired, per_owner
from serve_app.core.results import Direction, Recognition
from serve_app.inference.runners import DirectionClassifier, TextDetector, TextRecognizer
from serve_app.core.app_args import BATCH_DEFAULTS, ClassifierArgs, DetectorArgs, LaneArgs, RecognizerArgs
from serve_app.ocr.recognition import batch_limit, batch_width, load_charset
from serve_app.inference.weights import dictionary_path


@serve.deployment(name="TextDetector")
class TextDetectorDeployment(_Replica):
    def __init__(self, engine: EngineConfig, args: DetectorArgs, lanes: LaneArgs = LaneArgs()):
        self.replica = ModelReplica.build("det", engine.det_model, engine.predictor, args, BATCH_DEFAULTS["det"],
                                          stage_inputs("det", engine), engine.model)
        if lanes.enabled:  # interactive images ahead of bulk ones in the FIFO batch queue
            self.replica.use_lanes(lanes.bulk_max_wait_s, LaneMetrics("det"), lanes.det_bulk_batch)
        self.detector = TextDetector(self.replica.predictor, engine.det)
        self.replica.check_precision(lambda p: TextDetector(p, engine.det).detect)  # fp16/int8: boxes as fp32's
        self.replica.watch(detector_probe(TextDetector(self.replica.predictor, engine.det), engine.pipeline),
                           args.canary_interval_s)
        # detector.warm "core": the largest input before ready; "full", or TensorRT (engine per shape): all.
        self.replica.warm(self.detector.warm_calls(args.warm_shapes,
                                                   core=args.warm == "core" and not self.replica.tensorrt_on))
        self.detector.on_batch = lambda n, seconds: self.replica.record(n, n, seconds)  # served batches only

    def reconfigure(self, user_config: dict) -> None:
        self.replica.reconfigure(user_config, self._detect_batch)

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom-metrics hook: images queued here (serve_app.serving.autoscaling)."""
        return backlog_stats("det", self.replica.pending, self.replica.metrics)

    async def detect(self, image: np.ndarray, deadline: Optional[float] = None, params: Optional[DetParams] = None,
                     lane: Optional[str] = None, client: Optional[str] = None) -> np.ndarray:
        """Boxes (N,4,2) for one working image, in its coordinates; batched
        with other requests' images (whatever their detection params: only
        the input shape separates batches, serve_app.inference.runners.TextDetector).
        An image whose deadline (time.time()) has passed by the time its
        batch runs is not run (504 to its caller, which is usually gone): a
        burst of expired pages costs nothing. Interactive images enter the
        batch queue before bulk ones, bulk ones client by client in turn (serve_app.core.lanes)."""
        return await self.replica.queued(self._detect_batch, Timed((image, params or DetParams()), deadline, self),
                                         lane_of(lane), client=client)

    @_batch("det")
    @per_owner
    async def _detect_batch(self, items: list) -> list:
        # Images that fall in one input shape run as one predictor batch
        # (each recorded by the detector's on_batch). Serve drops items whose
        # caller cancelled; items whose deadline passed are dropped here.
        now = time.time()
        items = [i if isinstance(i, Timed) else Timed((i, DetParams())) for i in items]
        live = [k for k, i in enumerate(items) if not i.expired(now)]
        out: list = [_expired("detector") for _ in items]
        if live:
            def detect(pairs: list) -> list:
                return self.detector.detect([p[0] for p in pairs], [p[1] for p in pairs])

            got = await self.replica.isolated(detect, [[items[k].item] for k in live])
            for k, o in zip(live, got):
                out[k] = o if isinstance(o, Exception) else o[0]
        return out


@serve.deployment(name="DirectionClassifier")
class DirectionClassifierDeployment(_Replica):
    def __init__(self, engine: EngineConfig, args: ClassifierArgs, lanes: LaneArgs = LaneArgs()):
        self.replica = ModelReplica.build("cls", engine.cls_model, engine.predictor, args, BATCH_DEFAULTS["cls"],
                                          stage_inputs("cls", engine), engine.model)
        if lanes.enabled:
            self.replica.use_lanes(lanes.bulk_max_wait_s, LaneMetrics("cls"))
        self.classifier = DirectionClassifier(self.replica.predictor, engine.cls)
        self.replica.check_precision(lambda p: DirectionClassifier(p, engine.cls).classify)  # fp16/int8: angles
        self.replica.watch(classifier_probe(self.classifier), args.canary_interval_s)
        self.replica.warm(self.classifier.warm_calls())

    def reconfigure(self, user_config: dict) -> None:
        self.replica.reconfigure(user_config, self._classify_batch)

    async def classify(self, crops: list[np.ndarray], deadline: Optional[float] = None,
                       lane: Optional[str] = None, client: Optional[str] = None) -> list[Direction]:
        """One call per image with all its crops; crops of every image in a
        batch are classified together (interactive calls first). An image
        whose deadline (time.time()) has passed by the time its batch runs
        is not classified (504 to its caller, as at the detector)."""
        c = self.replica.crops(crops)
        return await self.replica.queued(self._classify_batch,
                                         TimedCrops(c.crops, c.weight, deadline, lane_of(lane), self),
                                         lane_of(lane), c.weight, client)

    @_batch("cls", batch_size_fn=crops_weight)
    @per_owner
    async def _classify_batch(self, items: list[Crops]) -> list:
        t0 = time.perf_counter()
        now = time.time()
        live = [k for k, i in enumerate(items) if getattr(i, "deadline", None) is None or now <= i.deadline]
        out: list = [_expired("direction classifier") for _ in items]
        if live:
            got = await self.replica.isolated(self.classifier.classify, [items[k].crops for k in live])
            for k, o in zip(live, got):
                out[k] = o
            self.replica.record(len(live), sum(len(items[k].crops) for k in live), time.perf_counter() - t0)
        return out


@serve.deployment(name="TextRecognizer")
class TextRecognizerDeployment(_Replica):
    """`@serve.batch` gathers requests (one per image, with all its crops);
    a CropScheduler underneath composes the predictor batches: as soon as
    the predictor is free, from every pending request, one width bucket per
    batch, a request not served yet first, then round robin. So crops of
    different requests share predictor batches, nothing waits for company,
    and a page of 200 lines does not hold up a one-line image behind it.
    Serve batches run concurrently (max_concurrent_batches) so that a new
    request reaches the scheduler while an older one is still being read."""

    def __init__(self, engine: EngineConfig, args: RecognizerArgs, lanes: LaneArgs = LaneArgs()):
        self.replica = ModelReplica.build("rec", engine.rec_model, engine.predictor, args, BATCH_DEFAULTS["rec"],
                                          stage_inputs("rec", engine), engine.model)
        charset = load_charset(dictionary_path(engine.rec_dict, engine.model), engine.rec.use_space_char)
        self.recognizer = TextRecognizer(self.replica.predictor, engine.rec, charset)
        # TensorRT fp16/int8: refuse to start unless it reads real words as fp32 does (#29 item 5).
        self.replica.check_precision(lambda p: TextRecognizer(p, engine.rec, charset).recognize)
        opts = engine.rec
        self.scheduler: Optional[CropScheduler] = None
        if opts.batch_padding == "bucket":
            self.scheduler = CropScheduler(
                lambda crops: self.replica.predictor.call_async(self.recognizer.recognize_batch, crops),
                lambda c: batch_width([c.shape[1] / c.shape[0]], opts), lambda w: batch_limit(w, opts),
                self.replica.record)
            # Interactive crops lead the predictor batches (serve_app.core.lanes); the
            # serve.batch queue above passes requests on at once (16 concurrent batches).
            self.scheduler.lanes = lanes.enabled
            self.scheduler.max_wait_s = lanes.bulk_max_wait_s
            self.scheduler.bulk_fill = lanes.bulk_fill
            self.scheduler.bulk_depth = lanes.bulk_depth
            self.scheduler.metrics = LaneMetrics("rec")
        # else batch_max padding: a crop's reading depends on its batch; keep the engine's batches.
        self.replica.watch(recognizer_probe(self.recognizer), args.canary_interval_s)
        shapes = self.recognizer.warm_shapes(args.warm_widths)
        split = self.scheduler is not None and not self.replica.tensorrt_on  # TensorRT: engines per shape, all now
        if split and args.batch_sizes is not None:  # only these sizes (and each width's largest), ever
            shapes = kept_shapes(shapes, args.batch_sizes)
        if split and (args.warm == "core" or args.batch_sizes is not None):
            # warm core: the widths up to warm_core_max_width at batch size 1 now; the rest after ready, between
            # batches, split into built shapes meanwhile (serve_app/serving/shapes_after_ready.py).
            now, later = core_shapes(shapes, args.warm_core_max_width) if args.warm == "core" else (shapes, [])
            deferred = self.replica.deferred = DeferredShapes(
                now, [(s, *self.recognizer.warm_call(s)) for s in later])
            self.scheduler.run_batch = deferred.batches(
                self.replica.predictor.call_async, self.recognizer.recognize_batch,
                lambda crops: batch_width([c.shape[1] / c.shape[0] for c in crops], opts))
            shapes = now
        self.replica.warm([self.recognizer.warm_call(s) for s in shapes])
        self._build_later()

    def _build_later(self) -> None:
        """Start the background build of the shapes left (once; from the
        first call that finds an event loop running)."""
        d = self.replica.deferred
        if d is not None and d.task is None and self.scheduler is not None:
            d.start(self.replica.predictor.call_async, self.scheduler, self._others_busy)

    def _others_busy(self) -> bool:
        """Another stage in this process has work (serve_app/serving/stages_in_one_process.py): no shape build meanwhile."""
        return False

    def reconfigure(self, user_config: dict) -> None:
        knobs = self.replica.reconfigure(user_config, self._recognize_batch)
        if self.scheduler is not None:  # max_batch_size 1 = no cross-request predictor batches
            self.scheduler.cross_request = knobs.max_batch_size > 1

    async def recognize(self, crops: list[np.ndarray], deadline: Optional[float] = None,
                        lane: Optional[str] = None, client: Optional[str] = None) -> list[Recognition]:
        """One call per image with all its crops. Crops not yet read when
        the deadline (time.time()) passes are dropped by the scheduler,
        which also puts the interactive lane's crops first."""
        self._build_later()
        c = self.replica.crops(crops)
        return await self.replica.queued(self._recognize_batch,
                                         TimedCrops(c.crops, c.weight, deadline, lane_of(lane), self, client))

    async def check_health(self) -> None:
        self._build_later()
        await super().check_health()

    def stats(self, stage: Optional[str] = None) -> dict[str, Any]:
        return {**self.replica.stats(),
                "pending_crops": self.scheduler.pending_items if self.scheduler else None,
                "pending_crops_by_lane": self.scheduler.pending_by_lane() if self.scheduler else None}

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom-metrics hook: crops queued here (serve_app.serving.autoscaling)."""
        crops = self.scheduler.pending_items if self.scheduler else self.replica.pending
        return backlog_stats("rec", crops, self.replica.metrics)

    @_batch("rec", batch_size_fn=crops_weight, max_concurrent_batches=16)
    @per_owner
    async def _recognize_batch(self, items: list[Crops]) -> list:
        if self.scheduler is None:
            t0 = time.perf_counter()
            out = await self.replica.isolated(self.recognizer.recognize, [i.crops for i in items])
            self.replica.record(len(items), sum(len(i.crops) for i in items), time.perf_counter() - t0)
            return out
        out = await asyncio.gather(*(self.scheduler.submit(i.crops, getattr(i, "deadline", None), getattr(
            i, "lane", INTERACTIVE), getattr(i, "client", None)) for i in items), return_exceptions=True)
        for o in out:
            if isinstance(o, Exception):
                self.replica.metrics.errors.inc()
        return out


@serve.deployment(name="OcrPipeline")
class OcrPipeline:
    """The pipeline (serve_app.flow.pipeline) over the model deployments' handles.
    The image travels once (to the detector); only crops go further."""

    def __init__(self, detector: DeploymentHandle, classifier: Optional[DeploymentHandle],
                 recognizer: DeploymentHandle, engine: EngineConfig, rec_args: RecognizerArgs,
                 lanes: LaneArgs = LaneArgs(),
                 others: Optional[dict[str, tuple[DeploymentHandle, DeploymentHandle, EngineConfig]]] = None,
                 loading: SetLoading = SetLoading(),
                 structure: Optional[tuple[DeploymentHandle, DeploymentHandle]] = None):
        """`engine`: the default model set's config; `others`: each further
        catalogued set's (detector, recogniser) handles and config; the
        classifier is shared. A further set's deployments may be at zero
        replicas until its first request (serve_app.serving.set_cache.DeploymentSets).
        `structure`: the LayoutDetector and TableRecognizer handles, at zero
        replicas until the first request that asks for structure
        (serve_app/serving/structure_start.py); every set reads with them."""
        self.handles = {"det": detector, "rec": recognizer, **({"cls": classifier} if classifier else {})}
        sets = {engine.model: (self._stages(detector, classifier, recognizer, rec_args), engine)}
        self._further = {name: (det, rec) for name, (det, rec, _) in (others or {}).items()}
        for name, (det, rec, eng) in (others or {}).items():
            self.handles.update({f"det@{name}": det, f"rec@{name}": rec})
            sets[name] = (self._stages(det, classifier, rec, rec_args), eng)
        self._setup(sets, lanes)
        self.sets = DeploymentSets(self.served, self._start_set, self._running_sets, loading)
        self.structure = None
        if structure is not None:
            from serve_app.serving.structure_start import StructureStarter

            self.structure = StructureStarter(*structure, loading)
            for pipeline in self.pipelines.values():
                pipeline.stages = self.structure.stages(pipeline.stages)

    async def _start_set(self, name: str) -> None:  # a call queued at zero replicas: Serve starts one
        det, rec = self._further[name]
        await asyncio.gather(det.ready.remote(), rec.ready.remote())

    def _running_sets(self) -> dict[str, str]:
        """set -> "running", "failed" or "stopped" (set_cache.stage_states; blocking: called on a thread)."""
        app = serve.status().applications[serve.get_replica_context().app_name].deployments
        return {name: stage_states([app[h.deployment_name] for h in pair if h.deployment_name in app])
                for name, pair in self._further.items()}

    def _live(self) -> dict[str, DeploymentHandle]:  # the loaded sets' stages (a call would start the others)
        live = {k: h for k, h in self.handles.items() if "@" not in k or self.sets.loaded(k.split("@", 1)[1])}
        return {**live, **(self.structure.handles() if getattr(self, "structure", None) is not None else {})}

    @staticmethod
    def _stages(detector: DeploymentHandle, classifier: Optional[DeploymentHandle], recognizer: DeploymentHandle,
                rec_args: RecognizerArgs) -> Stages:
        # Positional: the stage methods' arguments (lists of items are batched below them).
        # Arrays over 1 MiB go by reference (serve_app/serving/payloads.py): gRPC's 4 MiB
        # message limit under RAY_SERVE_THROUGHPUT_OPTIMIZED=1.
        return Stages(
            detect=lambda image, params, ctx: sized(detector, image).detect.remote(image, ctx.deadline, params,
                                                                                    ctx.lane, ctx.client),
            classify=(lambda crops, ctx: sized(classifier, crops).classify.remote(
                crops, ctx.deadline, ctx.lane, ctx.client)) if classifier is not None else None,
            recognize=fanned_out(lambda crops, ctx=None, part=None: sized(recognizer, crops)
                                 .options(multiplexed_model_id=route_tag(part))
                                 .recognize.remote(crops, ctx.deadline, ctx.lane, ctx.client),
                                 rec_args.fan_out, rec_args.fan_out_min_items, tag_parts=True),
        )

    def _setup(self, sets: dict[str, tuple[Stages, EngineConfig]], lanes: LaneArgs) -> None:
        """A pipeline per served model set (the first: the default) over its
        stages, the bulk gate they share and lane metrics."""
        # Bulk images in the model stages at once, at most lanes.bulk_in_stages
        # (interactive ones pass): bulk never fills a stage's max_ongoing_requests,
        # whose queue (Serve's router) is FIFO.
        self.bulk_gate = (PriorityGate(lanes.bulk_in_stages, lanes.bulk_max_wait_s, bypass=(INTERACTIVE,),
                                       metrics=LaneMetrics("pipeline")) if lanes.enabled else None)
        self.lane_metrics = LaneRequestMetrics()
        # Each stage call is given the request's context (serve_app.core.request_context)
        # and passes on its deadline and lane, so the replicas drop work queued
        # for a request that is gone and serve interactive work first.
        hold = self.bulk_gate.hold if self.bulk_gate is not None else None
        # Each set's images and crops go to its own predictors only: batches never mix sets.
        self.pipelines = {name: Pipeline(stages, engine, hold) for name, (stages, engine) in sets.items()}
        self.served = tuple(self.pipelines)
        self.pipeline = self.pipelines[self.served[0]]

    def _options(self, options: Any) -> OcrOptions:
        """Parsed options with their lane (a handle call without one:
        interactive) and model set (none: the default; an unserved one: 400
        listing the served, before any work), counted."""
        opts = parse_options(options).with_lane(INTERACTIVE).with_model(self.served).for_pipeline()
        self.lane_metrics.requests.inc(tags={"lane": opts.priority})
        return opts

    def models(self) -> list[str]:
        """The model sets served, the default first."""
        return list(self.served)

    @contextlib.asynccontextmanager
    async def _set(self, name: str) -> AsyncIterator[Pipeline]:
        """The pipeline of the model set `name` (a catalogued one), its
        stages running (waited for, bounded, on its first request), held
        while the block runs. PipelineWithModels loads sets in its process."""
        await self.sets.wait_loaded(name)
        yield self.pipelines[name]

    async def model_states(self) -> dict[str, dict[str, Any]]:
        """name -> {"state": "loaded" | "loading" | "not loaded" | "failed", "load_s"} per catalogued set."""
        return await self.sets.states()

    async def ocr(self, image: Any, options: Optional[OcrOptions] = None, ctx: Context = None) -> dict:
        """The result body (image size, lines, timings) for one image, or
        the document body (pages in order) for a PDF, as JSON whatever
        options.format says (the ingress renders it); options come parsed
        from the ingress (a dict is parsed here). `image`: an Upload (its
        kind decided at the door, serve_app.flow.upload), bytes, an array or a
        path. `ctx`: the request's context (serve_app.core.request_context), or
        just a deadline (time.time()); work not started by the deadline is
        not done (DeadlineExceeded, 504).

        A PDF comes here as its bytes (put once in the object store by the
        caller) and its pages are rendered here, in a worker thread, a few
        at a time: a page's bitmap goes from here to the detector only, as
        a decoded image does."""
        opts = self._options(options)
        async with self._set(opts.model) as pipeline:
            return {**(await pipeline.read_any(await arrived(image), opts, ctx)).to_dict(), "model": pipeline.config.model}

    async def ocr_progress(self, image: Any, options: Optional[OcrOptions] = None,
                           ctx: Context = None) -> AsyncIterator[dict]:
        """`ocr` as a stream (handle.options(stream=True)), for the job store: {"pages_done", "pages_total",
        "pages"} as a document's pages are read (the latest counts, the pages read since), then {"result": body}."""
        latest: dict[str, int] = {}
        finished: list[dict] = []  # (an image gives the result alone)
        changed = asyncio.Event()

        def progress(done: int, total: int) -> None:
            latest.update(pages_done=done, pages_total=total)
            changed.set()

        opts = self._options(options)
        async with self._set(opts.model) as pipeline:
            task = asyncio.ensure_future(pipeline.read_any(await arrived(image), opts, ctx, progress,
                                                           lambda p: finished.append(p.to_dict())))
            try:
                while not task.done():
                    waiter = asyncio.ensure_future(changed.wait())
                    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    if changed.is_set() and not task.done():
                        changed.clear()
                        pages, finished[:] = finished[:], []
                        yield {**latest, "pages": pages}
                yield {"result": {**task.result().to_dict(), "model": pipeline.config.model}}
            finally:
                task.cancel()

    async def stats(self, calls: dict[str, int], timeout_s: float = 2.0) -> dict[str, list[dict]]:
        """stage -> the stats() of its replicas that answered `calls[stage]`
        concurrent calls (the router spreads them; a replica may be reached
        twice or not at all, so callers ask about twice the replicas
        running). A stage that does not answer in time gives []."""

        async def one(h, name):
            try:
                return await asyncio.wait_for(h.stats.remote(name.split("@")[0]), timeout=timeout_s)
            except Exception:
                return None

        async def stage(name, h):
            got = await asyncio.gather(*(one(h, name) for _ in range(max(1, calls.get(name, 1)))))
            return list({s["pid"]: s for s in got if s}.values())

        await self.sets.refresh()
        if getattr(self, "structure", None) is not None:
            await self.structure.sets.refresh()
        live = self._live()
        answers = await asyncio.gather(*(stage(n, h) for n, h in live.items()))
        return dict(zip(live, answers))

    async def ready(self) -> dict[str, bool]:
        """Whether each stage answers (a replica answers only once warmed)."""

        async def one(h):
            try:
                return bool(await asyncio.wait_for(h.ready.remote(), timeout=2.0))
            except Exception:
                return False

        await self.sets.refresh()
        if getattr(self, "structure", None) is not None:
            await self.structure.sets.refresh()
        live = self._live()
        results = await asyncio.gather(*(one(h) for h in live.values()))
        return dict(zip(live, results))
