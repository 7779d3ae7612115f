"""Ray Serve deployments. Each is thin: it loads its model in __init__, warms
it, and exposes one `@serve.batch` method taking a list and returning a list
of the same length. The OCR logic lives in the plain classes it wraps."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from typing import Any, Optional

import numpy as np
from ray import serve
from ray.serve.handle import DeploymentHandle

from .options import parse_options
from .config import EngineConfig, PredictorOptions
from .crop_scheduler import CropScheduler
from .engine import assemble, crop_lines, load_image, whole_image_box
from .metrics import StageMetrics
from .weights import dictionary_path, model_files
from .runners import DirectionClassifier, TextDetector, TextRecognizer
from .predictor import PaddlePredictor
from .settings import FIXED_MMAP_THRESHOLD, StageRuntime, batch_params, replica_cores
from .stages.det_preprocess import Geometry, large_image_shapes, prepare_image
from .stages.direction import apply_direction, is_flipped
from .stages.recognition import batch_limit, batch_width, load_charset
from .stages.recognition import input_shapes as rec_input_shapes
from .results import Direction, OcrResult, Recognition

log = logging.getLogger("ray.serve")


class _ModelReplica:
    """What the three model deployments share: building the pinned predictor,
    live batch knobs, recent batch sizes, and readiness."""

    stage = "model"

    def _load(self, engine: EngineConfig, runtime: StageRuntime, model_dir: Optional[str]) -> None:
        self.engine = engine
        self.runtime = runtime
        options: PredictorOptions = runtime.predictor or engine.predictor
        if options.device == "gpu" and options.gpu_memory_fraction is None:
            share = _assigned_gpu_share()
            if share:
                options = options.model_copy(update={"gpu_memory_fraction": share})
        cores = replica_cores(runtime)
        if cores is not None:
            options = options.model_copy(update={"cpu_affinity": cores,
                                                 "cpu_math_library_num_threads": len(cores)})
        self.metrics = StageMetrics(self.stage)
        self.predictor = PaddlePredictor(model_files(self.stage, model_dir), options, self.stage)
        self.metrics.model_load_s.set(self.predictor.load_seconds)
        self.recent_batches: deque = deque(maxlen=256)
        self.max_batch_size, self.batch_wait_timeout_s = runtime.max_batch_size, runtime.batch_wait_timeout_s
        self.ready_at: Optional[float] = None

    def _warm(self, calls: list) -> None:
        t0 = time.perf_counter()
        for fn, arg in calls:
            fn(arg)
        self.warm_seconds = time.perf_counter() - t0
        self.metrics.first_inference_s.set(self.warm_seconds)
        self.ready_at = time.time()
        log.info("%s replica ready: load %.2fs, warm-up %.2fs over %d shapes, cores %s",
                 self.stage, self.predictor.load_seconds, self.warm_seconds, len(calls),
                 self.predictor.options.cpu_affinity)

    def reconfigure(self, user_config: dict) -> None:
        """Batch knobs, changed live (no replica restart)."""
        size, wait = batch_params(user_config, self.max_batch_size, self.batch_wait_timeout_s)
        self.max_batch_size, self.batch_wait_timeout_s = size, wait
        _crop_cap["value"] = size
        self._batched.set_max_batch_size(size)
        self._batched.set_batch_wait_timeout_s(wait)
        if getattr(self, "scheduler", None) is not None:  # max_batch_size 1 = no cross-request batches
            self.scheduler.cross_request = size > 1

    def check_health(self) -> None:
        if self.ready_at is None:
            raise RuntimeError(f"{self.stage} model not warmed yet")

    def stats(self) -> dict[str, Any]:
        """For operators and tests: who this replica is and what it batched."""
        return {
            "stage": self.stage,
            "pid": os.getpid(),
            "max_batch_size": self.max_batch_size,
            "batch_wait_timeout_s": self.batch_wait_timeout_s,
            "cpu_affinity": sorted(os.sched_getaffinity(0)),
            "load_seconds": self.predictor.load_seconds,
            "warm_seconds": getattr(self, "warm_seconds", None),
            "recent_batches": list(self.recent_batches),
            "gpu_ids": _gpu_ids(),
            "node_id": _node_id(),
            "rss_mb": _rss_mb(),
            "device": self.predictor.options.device,
            "openvino_precision": self.predictor.options.openvino_precision,
            "gpu_memory_fraction": self.predictor.options.gpu_memory_fraction,
        }

    def ready(self) -> bool:
        return self.ready_at is not None

    async def _queued(self, batched, item):
        """Count calls waiting for (or in) a batch: the queue-depth gauge."""
        self._pending = getattr(self, "_pending", 0) + 1
        self.metrics.queue_depth.set(self._pending)
        try:
            return await batched(item)
        finally:
            self._pending -= 1
            self.metrics.queue_depth.set(self._pending)

    async def _run_isolated(self, fn, items: list) -> list:
        """fn(items) on the predictor's thread. If the batch fails, each item
        is retried alone so one bad input fails alone (its slot holds the
        exception, which Serve raises to that caller only)."""
        try:
            return await self.predictor.call_async(fn, items)
        except Exception:
            out = []
            for item in items:
                try:
                    out.append((await self.predictor.call_async(fn, [item]))[0])
                except Exception as e:
                    self.metrics.errors.inc()
                    out.append(e)
            return out

    async def _flat(self, crop_lists: list[list[np.ndarray]], fn) -> list:
        """Run fn over the crops of every request in the batch at once, then
        give each request its own slice back."""
        t0 = time.perf_counter()
        flat = [c for crops in crop_lists for c in crops]
        try:
            results = await self.predictor.call_async(fn, flat) if flat else []
        except Exception:
            results = None
        out, i = [], 0
        for crops in crop_lists:
            if results is None:  # isolate the failing request
                try:
                    out.append(await self.predictor.call_async(fn, crops))
                except Exception as e:
                    self.metrics.errors.inc()
                    out.append(e)
            else:
                out.append(results[i : i + len(crops)])
            i += len(crops)
        self._record(len(crop_lists), len(flat), time.perf_counter() - t0)
        return out

    def _record(self, requests: int, items: int, seconds: float) -> None:
        self._seq = getattr(self, "_seq", 0) + 1
        self.recent_batches.append({"seq": self._seq, "t": round(time.time(), 3), "requests": requests,
                                    "items": items, "ms": round(seconds * 1000, 2)})
        self.metrics.batch_requests.observe(requests)
        self.metrics.batch_items.observe(items)
        self.metrics.latency.observe(seconds * 1000)


def _assigned_gpu_share() -> Optional[float]:
    try:
        import ray

        share = ray.get_runtime_context().get_assigned_resources().get("GPU")
        return min(float(share), 1.0) if share else None
    except Exception:
        return None


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _node_id() -> Optional[str]:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


def _gpu_ids() -> list:
    try:
        import ray

        return [str(g) for g in ray.get_gpu_ids()]
    except Exception:
        return []


@serve.deployment(name="TextDetector", ray_actor_options={"num_cpus": 0.3}, max_ongoing_requests=16)
class TextDetectorDeployment(_ModelReplica):
    stage = "det"

    def __init__(self, engine: EngineConfig, runtime: StageRuntime):
        self._load(engine, runtime, engine.det_model)
        self.detector = TextDetector(self.predictor, engine.det)
        self._batched = self._detect_batch
        self.reconfigure({})
        shapes = list(runtime.warm_det_shapes)
        if runtime.warm_det_large_images:
            shapes += [s for s in large_image_shapes(engine.det) if s not in shapes]
        self._warm([(self.detector.detect, [np.full((h, w, 3), 255, np.uint8)]) for h, w in shapes])

    async def detect(self, image: np.ndarray) -> np.ndarray:
        """Boxes (N,4,2) for one image, in its coordinates; batched with
        other requests' images."""
        return await self._queued(self._detect_batch, image)

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.0)
    async def _detect_batch(self, images: list[np.ndarray]) -> list:
        t0 = time.perf_counter()
        out = await self._run_isolated(self.detector.detect, images)
        self._record(len(images), len(images), time.perf_counter() - t0)
        return out


# Serve refuses an item whose own size exceeds max_batch_size, so an image
# with more crops than that counts as one full batch (it is then read alone,
# in predictor-sized chunks). Set per replica process by reconfigure().
_crop_cap = {"value": 24}


def _count_crops(items: list) -> int:
    cap = _crop_cap["value"]
    return sum(max(1, min(len(i), cap)) for i in items)


@serve.deployment(name="DirectionClassifier", ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=32)
class DirectionClassifierDeployment(_ModelReplica):
    stage = "cls"

    def __init__(self, engine: EngineConfig, runtime: StageRuntime):
        self._load(engine, runtime, engine.cls_model)
        self.classifier = DirectionClassifier(self.predictor, engine.cls)
        self._batched = self._classify_batch
        self.reconfigure({})
        crop = np.full((48, 192, 3), 255, np.uint8)
        self._warm([(self.classifier.classify, [crop] * n) for n in range(1, engine.cls.batch_size + 1)])

    async def classify(self, crops: list[np.ndarray]) -> list[Direction]:
        """One call per image with all its crops; crops of every image in a
        batch are classified together."""
        return await self._queued(self._classify_batch, crops)

    @serve.batch(max_batch_size=24, batch_wait_timeout_s=0.0, batch_size_fn=_count_crops)
    async def _classify_batch(self, crop_lists: list[list[np.ndarray]]) -> list:
        return await self._flat(crop_lists, self.classifier.classify)


@serve.deployment(name="TextRecognizer", ray_actor_options={"num_cpus": 0.3}, max_ongoing_requests=32)
class TextRecognizerDeployment(_ModelReplica):
    """`@serve.batch` gathers requests (one per image, with all its crops);
    a CropScheduler underneath composes the predictor batches: as soon as
    the predictor is free, from every pending request, one width bucket per
    batch, a request not served yet first, then round robin. So crops of
    different requests share predictor batches, nothing waits for company,
    and a page of 200 lines does not hold up a one-line image behind it.
    Serve batches run concurrently (max_concurrent_batches) so that a new
    request reaches the scheduler while an older one is still being read."""

    stage = "rec"

    def __init__(self, engine: EngineConfig, runtime: StageRuntime):
        self._load(engine, runtime, engine.rec_model)
        charset = load_charset(dictionary_path(engine.rec_dict), engine.rec.use_space_char)
        self.recognizer = TextRecognizer(self.predictor, engine.rec, charset)
        self._batched = self._recognize_batch
        opts = engine.rec
        if opts.batch_padding == "bucket":
            self.scheduler: Optional[CropScheduler] = CropScheduler(
                lambda crops: self.predictor.call_async(self.recognizer.recognize_batch, crops),
                lambda c: batch_width([c.shape[1] / c.shape[0]], opts), lambda w: batch_limit(w, opts), self._record)
        else:  # batch_max padding: a crop's reading depends on its batch; keep the engine's batches
            self.scheduler = None
        self.reconfigure({})
        # Every input shape it can be given (each batch size at each ladder
        # width: the crop scheduler mixes requests, so any batch size meets
        # any width). A new shape costs the predictor time and ~3 MB once;
        # warmed here, memory stays flat in service. Without a ladder the set
        # is open: warm the configured widths.
        shapes = rec_input_shapes(opts) if opts.batch_padding == "bucket" else []
        if not shapes:
            shapes = [(n, w) for w in [320, *runtime.warm_rec_widths] for n in range(1, opts.batch_size + 1)]
        h = opts.image_height
        self._warm([(self.recognizer.recognize_batch, [np.full((h, w, 3), 255, np.uint8)] * n) for n, w in shapes])

    async def recognize(self, crops: list[np.ndarray]) -> list[Recognition]:
        """One call per image with all its crops."""
        return await self._queued(self._recognize_batch, crops)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["pending_crops"] = self.scheduler.pending_items if self.scheduler else None
        return out

    @serve.batch(max_batch_size=24, batch_wait_timeout_s=0.0, batch_size_fn=_count_crops,
                 max_concurrent_batches=16)
    async def _recognize_batch(self, crop_lists: list[list[np.ndarray]]) -> list:
        if self.scheduler is None:
            return await self._flat(crop_lists, self.recognizer.recognize)
        out = await asyncio.gather(*(self.scheduler.submit(c) for c in crop_lists), return_exceptions=True)
        for o in out:
            if isinstance(o, Exception):
                self.metrics.errors.inc()
        return out


@serve.deployment(name="OcrPipeline", ray_actor_options={"num_cpus": 0.1, **FIXED_MMAP_THRESHOLD},
                  max_ongoing_requests=64)
class OcrPipeline:
    """decode -> detect -> crop -> classify -> recognise, composing the model
    deployments through their handles. The image travels once (to the
    detector); only crops go further."""

    def __init__(self, detector: DeploymentHandle, classifier: Optional[DeploymentHandle],
                 recognizer: DeploymentHandle, engine: EngineConfig, rec_runtime: Optional[StageRuntime] = None):
        self.detector, self.classifier, self.recognizer = detector, classifier, recognizer
        self.engine = engine
        self.rec_runtime = rec_runtime or StageRuntime()

    async def _recognize(self, crops: list[np.ndarray]) -> list[Recognition]:
        """One recogniser call per image, or, for a text-dense image, up to
        `fan_out` calls with the crops dealt out in width order (each part
        costs about the same), which the router spreads over replicas."""
        parts = min(self.rec_runtime.fan_out, len(crops) // max(1, self.rec_runtime.fan_out_min_items // 2))
        if parts <= 1 or len(crops) < self.rec_runtime.fan_out_min_items:
            return await self.recognizer.recognize.remote(crops)
        order = sorted(range(len(crops)), key=lambda i: crops[i].shape[1] / crops[i].shape[0])
        shares = [order[k::parts] for k in range(parts)]
        answers = await asyncio.gather(*(self.recognizer.recognize.remote([crops[i] for i in idx]) for idx in shares))
        out: list = [None] * len(crops)
        for idx, recs in zip(shares, answers):
            for i, r in zip(idx, recs):
                out[i] = r
        return out

    async def ocr(self, image: Any, options: Optional[dict] = None) -> dict:
        opts = parse_options(options)
        cfg = self.engine
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        img = await asyncio.to_thread(load_image, image, cfg.limits, cfg.pipeline.exif_transpose)
        h, w = img.shape[:2]
        timings["decode"] = _ms(t0)

        t = time.perf_counter()
        if opts.det:
            work, geometry = prepare_image(img, cfg.pipeline)
            boxes = await self.detector.detect.remote(work)
            boxes, crops = await asyncio.to_thread(crop_lines, work, boxes, cfg.limits)
        else:
            geometry = Geometry(1.0, 1.0, 0, w, h)
            boxes, crops = np.array([whole_image_box(w, h)], dtype=np.float32), [img]
        timings["det"] = _ms(t)

        t = time.perf_counter()
        flipped = [False] * len(crops)
        use_cls = opts.cls if opts.cls is not None else cfg.cls.enabled
        if use_cls and self.classifier is not None and crops:
            dirs: list[Direction] = await self.classifier.classify.remote(crops)
            flipped = [is_flipped(d, cfg.cls) for d in dirs]
            crops = [apply_direction(c, d, cfg.cls) for c, d in zip(crops, dirs)]
        timings["cls"] = _ms(t)

        t = time.perf_counter()
        recs: list[Recognition] = await self._recognize(crops) if crops else []
        timings["rec"] = _ms(t)
        lines = assemble(boxes, recs, geometry, cfg.pipeline.drop_score, flipped, opts.return_chars)
        timings["total"] = _ms(t0)
        return OcrResult(w, h, lines, timings).to_dict()

    async def ready(self) -> dict[str, bool]:
        """Whether each stage answers (a replica answers only once warmed)."""
        stages = {"det": self.detector, "rec": self.recognizer}
        if self.classifier is not None:
            stages["cls"] = self.classifier

        async def one(h):
            try:
                return bool(await asyncio.wait_for(h.ready.remote(), timeout=2.0))
            except Exception:
                return False

        results = await asyncio.gather(*(one(h) for h in stages.values()))
        return dict(zip(stages, results))


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0
