"""What a model deployment's replica does besides its one batched method, as
plain classes: build the predictor where the replica was placed (cores, GPU
share), warm it, hold the live batch knobs, count queued calls, keep recent
batch sizes, isolate failures, and report stats. No Ray import at module
level: unit-tested with a stand-in predictor."""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Sequence

from serve_app.serving.canary import Canary, CanaryResult
from serve_app.core.engine_config import PredictorOptions
from serve_app.serving.isolation import run_isolated
from serve_app.serving.heap import counted_calls, idle_on_cpu, process_trimmer, set_mmap_threshold, trim, yield_to_front
from serve_app.core.lanes import PriorityGate, _Null  # _Null: metrics stand-in outside a Serve replica
from serve_app.inference.predictor import Predictor
from serve_app.core.app_args import BatchKnobs, ModelArgs


@dataclass(frozen=True)
class Crops:
    """One caller's crops, as a `@serve.batch` item. `weight` is what it
    counts against max_batch_size: its crops, but at most a full batch
    (Serve refuses an item heavier than a batch; a bigger one is read alone,
    in predictor-sized chunks)."""

    crops: list
    weight: int


def crops_weight(items: list[Crops]) -> int:
    """`batch_size_fn` of the batched crop methods: batches count crops."""
    return sum(i.weight for i in items)


def replica_cores(args: ModelArgs, rank: int) -> Optional[list[int]]:
    """The cores replica `rank` (its index on the node) pins its inference
    threads to: `threads` consecutive entries of cpu_cores from rank *
    threads, wrapping; None when no cores are listed."""
    if not args.cpu_cores:
        return None
    n = len(args.cpu_cores)
    return sorted({args.cpu_cores[(rank * args.threads + j) % n] for j in range(args.threads)})


def placed_options(options: PredictorOptions, cores: Optional[list[int]],
                   gpu_share: Optional[float]) -> PredictorOptions:
    """The predictor options of a replica placed on `cores` (threads = one per
    core) and, on a GPU, holding `gpu_share` of it: its memory share, which
    the predictor turns into Paddle's per-process limit
    (FLAGS_gpu_memory_limit_mb), unless the config names a share."""
    update: dict[str, Any] = {}
    if options.device == "gpu" and options.gpu_memory_fraction is None and gpu_share:
        update["gpu_memory_fraction"] = min(float(gpu_share), 1.0)
    if cores is not None:
        update.update(cpu_affinity=cores, cpu_math_library_num_threads=len(cores))
    return options.model_copy(update=update) if update else options


def hide_gpus_without_share(gpu_share: Optional[float], environ=os.environ) -> bool:
    """A replica Ray gave no GPU share (num_gpus: 0) sees no GPU: Ray 2.60
    leaves CUDA_VISIBLE_DEVICES as the node has it for such a process, so
    Paddle would find every GPU and run there, outside any share and any
    memory limit. Set to "" before Paddle is imported (CUDA reads it once,
    at its initialisation). True when it hid them."""
    if gpu_share:
        return False
    environ["CUDA_VISIBLE_DEVICES"] = ""
    return True


class ModelReplica:
    """One model's predictor inside a replica, and what the replica reports."""

    def __init__(self, stage: str, predictor: Predictor, knobs: BatchKnobs, metrics: Any = None):
        self.stage = stage
        self.predictor = predictor
        self.knobs = knobs
        self.defaults = knobs  # the code's knobs for this stage: what a user_config is laid over
        self.metrics = metrics or _Null()
        self.metrics.model_load_s.set(predictor.load_seconds)
        self.recent_batches: deque = deque(maxlen=256)
        self.warm_seconds: Optional[float] = None
        self.ready_at: Optional[float] = None
        # time.time() when the replica began building its predictor (set by build()).
        self.started_at: Optional[float] = None
        self._pending = 0
        self._seq = 0
        self.canary: Optional[Canary] = None
        self.health_checked = False  # by Serve, once: the start's reconfigure came before it
        self._probe: Optional[Callable[[], CanaryResult]] = None
        # In front of the FIFO batch queue: interactive first (serve_app.core.lanes); None: no lanes.
        self.gate: Optional[PriorityGate] = None
        self.precision_check: Optional[dict] = None  # fp16/int8 vs fp32 at start (check_precision)
        self._model: Any = None
        # Shapes built after ready (`warm: core`, serve_app.serving.shapes_after_ready); None: all before.
        self.deferred: Any = None
        # The process's heap trimmer (serve_app.serving.heap; set by build()); None: the heap is never trimmed.
        self.trimmer: Any = None

    @classmethod
    def build(cls, stage: str, model_dir: Optional[str], options: PredictorOptions, args: ModelArgs,
              knobs: BatchKnobs, int8_inputs: Optional[Callable], model: Optional[str],
              files: Any = None) -> "ModelReplica":
        """In a Serve replica: the Paddle predictor, pinned and sized for
        where Ray placed this replica, with Prometheus metrics. int8_inputs:
        the stage's real calibration batches (serve_app.inference.int8_calibration.stage_inputs).
        `files`: the model's ModelFiles when not a model set's stage (the
        structure models: serve_app.inference.weights.structure_files; model None)."""
        from serve_app.serving.metrics import StageMetrics
        from serve_app.inference.predictor import PaddlePredictor
        from serve_app.inference.weights import model_files

        started = time.time()
        share = _ray_context("gpu_share")
        if "ray" in sys.modules and hide_gpus_without_share(share):
            import logging

            logging.getLogger("ray.serve").info("%s replica: no GPU share (num_gpus: 0): CUDA_VISIBLE_DEVICES=\"\"",
                                                stage)
        # The process's heap (serve_app/serving/heap.py), before the predictor's first buffers.
        set_mmap_threshold(args.malloc_mmap_threshold)
        trimmer = process_trimmer(args.malloc_trim_idle_s)
        options = placed_options(args.predictor or options, replica_cores(args, _replica_rank()), share)
        predictor = PaddlePredictor(files or model_files(stage, model_dir, model), options, stage, int8_inputs=int8_inputs,
                                    thread_init=idle_on_cpu)
        yield_to_front()  # serve_app/serving/heap.py: the model's threads nicer than the front's
        trt = predictor.options.tensorrt
        if trt is not None:  # TensorRT on: below fp32 only where it is checked (serve_app/inference/precision_check.py)
            from serve_app.inference.precision_check import precision_policy

            try:
                predictor.needs_precision_check = precision_policy(stage, trt.precision)
            except Exception:
                predictor.close()
                raise
        counted_calls(predictor, trimmer)  # the idle trimmer sees its calls
        replica = cls(stage, predictor, knobs, StageMetrics(stage))
        replica.trimmer = trimmer
        replica.started_at = started
        replica._model = (model_dir, predictor.options, model)
        return replica

    def check_precision(self, make_reader: Callable[[Any], Callable[[list], list]]) -> Optional[dict]:
        """Before ready: a TensorRT stage below fp32 reads the real images
        kept in the package (serve_app.inference.precision_check.check_items) with its
        engine and with a plain fp32 predictor on the same GPU. Within the
        stage's bound (CER, box IoU, angle agreement) it serves as is;
        otherwise the predictor is rebuilt with TensorRT at fp32, a warning
        gives the figure, and stats say so: the app starts either way.
        make_reader(predictor) -> items -> the stage's outputs. None where no
        check is needed. Not run on a GPU here."""
        if not getattr(self.predictor, "needs_precision_check", False) or self.predictor.options.tensorrt is None:
            return None
        import cv2

        from serve_app.inference.precision_check import check_items
        from serve_app.inference.predictor import PaddlePredictor
        from serve_app.inference.weights import model_files

        model_dir, options, model = self._model
        reference = PaddlePredictor(model_files(self.stage, model_dir, model), options.model_copy(update={"tensorrt": None}),
                                    f"{self.stage}-fp32-reference")
        try:
            names, items = check_items(self.stage, lambda p: cv2.imread(p, cv2.IMREAD_COLOR))
            return self.judge_precision(names, items, make_reader(reference), make_reader(self.predictor))
        finally:
            reference.close()

    def judge_precision(self, names: list, items: list, read_reference: Callable[[list], list],
                        read_candidate: Callable[[list], list]) -> dict:
        """check_precision's verdict on the two readers' answers, and the
        fall-back to fp32 (PaddlePredictor.use_precision) when it misses."""
        import logging

        from serve_app.inference.precision_check import check

        precision = self.predictor.options.tensorrt.precision
        line, agreed, warning = check(self.stage, precision, names, items, read_reference, read_candidate)
        log = logging.getLogger("ray.serve")
        self.precision_check = {"precision": precision, "serving": precision, **agreed.as_dict()}
        if warning is None:
            log.info("%s", line)
            return self.precision_check
        self.predictor.use_precision("fp32")
        self.predictor.needs_precision_check = False
        log.warning("%s; serving this stage with TensorRT at fp32 instead", warning)
        self.precision_check.update(serving="fp32", fell_back=warning)
        return self.precision_check

    def watch(self, probe: Callable[[], CanaryResult], interval_s: float) -> None:
        """Check the predictor with `probe` (serve_app.serving.canary) before ready,
        every interval_s (0: only then and after reconfigures) and after
        every reconfigure; a failure fails check_health from then on."""
        self._probe = probe
        self.canary = Canary(self.stage, interval_s, on_result=self._canary_result)

    def _canary_result(self, ok: bool) -> None:
        self.metrics.canary_runs.inc(tags={"result": "pass" if ok else "fail"})

    @property
    def tensorrt_on(self) -> bool:
        """Whether the predictor runs under TensorRT (which builds an engine per input shape)."""
        return bool((getattr(self.predictor, "tensorrt_status", None) or {}).get("on"))

    def warm(self, calls: Sequence[tuple[Callable, Any]]) -> None:
        """Run every (fn, arg) once (each an input shape the replica will
        meet), then the canary, if any; the replica is ready after it."""
        t0 = time.perf_counter()
        try:
            for fn, arg in calls:
                fn(arg)
        except Exception as e:
            # A TensorRT engine built at a shape's first run failed: under
            # `tensorrt.enable: auto` the predictor is rebuilt without it and
            # every shape runs again; otherwise the replica does not start.
            fall_back = getattr(self.predictor, "fall_back_from_tensorrt", None)
            if fall_back is None or not fall_back(e):
                raise
            for fn, arg in calls:
                fn(arg)
        if self.canary is not None and self._probe is not None:
            self.canary.run(self._probe)
            self.canary.raise_if_failed()  # never ready: Serve starts another replica
        self.warm_seconds = time.perf_counter() - t0
        if self.trimmer is not None:
            trim()  # the warm-up's freed buffers go back to the OS before ready
        # Every shape has run: whatever TensorRT engines this replica built are
        # written; the next replica of this stage on the node may build/read.
        release = getattr(self.predictor, "release_build_lock", None)
        if release is not None:
            release()
        self.metrics.first_inference_s.set(self.warm_seconds)
        self.ready_at = time.time()
        import logging

        trt = getattr(self.predictor, "tensorrt_status", None) or {}
        logging.getLogger("ray.serve").info(
            "%s replica ready: load %.2fs, warm-up %.2fs over %d shapes, cores %s, device %s%s", self.stage,
            self.predictor.load_seconds, self.warm_seconds, len(calls), self.predictor.options.cpu_affinity,
            self.predictor.options.device,
            f", TensorRT {'on' if trt.get('on') else 'off'} ({trt.get('reason')})" if trt.get("enable") is not None
            else "")

    def reconfigure(self, user_config: Optional[dict], batched) -> BatchKnobs:
        """New batch knobs (validated) applied to the `@serve.batch` method:
        the user_config laid over the code's defaults, so it says all that
        differs (a knob it leaves out is the default again, as the file says)."""
        self.knobs = self.defaults.updated(user_config)
        if self.canary is not None and self.health_checked:  # at the start, the warm-up's canary has just run
            self.canary.mark_due()
        batched.set_max_batch_size(self.knobs.max_batch_size)
        batched.set_batch_wait_timeout_s(self.knobs.batch_wait_timeout_s)
        return self.knobs

    @property
    def pending(self) -> int:
        """Calls waiting for (or in) a batch: images, at the detector."""
        return self._pending

    def crops(self, crops: list) -> Crops:
        return Crops(crops, max(1, min(len(crops), self.knobs.max_batch_size)))

    def use_lanes(self, max_wait_s: float, metrics: Any = None, bulk_capacity: Optional[int] = None) -> None:
        """Gate the batch queue: at most max_batch_size (weighted) items in
        it at once, interactive first, bulk by age (serve_app.core.lanes), so an
        interactive item waits behind at most the batch being run, not
        behind every bulk item queued before it (`@serve.batch` is FIFO);
        bulk items at most bulk_capacity of them (None: no own cap)."""
        self.gate = PriorityGate(lambda: self.knobs.max_batch_size, max_wait_s, metrics=metrics,
                                 bulk_capacity=bulk_capacity)

    async def queued(self, batched: Callable[[Any], Awaitable], item: Any, lane: Optional[str] = None,
                     weight: int = 1, client: Optional[str] = None):
        """`await batched(item)`, counted in the queue-depth gauge while it
        waits for (or is in) a batch; with a lane and a gate, after its turn
        at the gate (weight: what it counts against max_batch_size; client:
        whose turn it takes among bulk items, serve_app.core.lanes.PriorityGate)."""
        self._pending += 1
        self.metrics.queue_depth.set(self._pending)
        try:
            if self.gate is None or lane is None:
                return await batched(item)
            async with self.gate.hold(lane, weight, client or None):
                return await batched(item)
        finally:
            self._pending -= 1
            self.metrics.queue_depth.set(self._pending)

    async def isolated(self, fn: Callable[[list], Any], groups: Sequence[Sequence]) -> list:
        """fn over every group's items at once on the predictor's thread, one
        slice per group; a group whose items fail alone gets the exception
        (which Serve raises to that caller only)."""
        return await run_isolated(lambda items: self.predictor.call_async(fn, items), groups,
                                  lambda e: self.metrics.errors.inc())

    def record(self, requests: int, items: int, seconds: float) -> None:
        self._seq += 1
        self.recent_batches.append({"seq": self._seq, "t": round(time.time(), 3), "requests": requests,
                                    "items": items, "ms": round(seconds * 1000, 2)})
        self.metrics.batch_requests.observe(requests)
        self.metrics.batch_items.observe(items)
        self.metrics.latency.observe(seconds * 1000)

    def check_health(self) -> None:
        if self.ready_at is None:
            raise RuntimeError(f"{self.stage} model not warmed yet")

    async def check_health_async(self) -> None:
        """check_health, and the canary when it is due (on the predictor's
        thread, between batches); CanaryFailed once it has failed."""
        self.check_health()
        if self.canary is not None and self._probe is not None:
            if self.canary.due():
                await self.predictor.call_async(self.canary.run, self._probe)
            self.canary.raise_if_failed()
        self.health_checked = True

    def stats(self) -> dict[str, Any]:
        """For operators and tests: who this replica is and what it batched."""
        opts = self.predictor.options
        return {
            "stage": self.stage,
            "pid": os.getpid(),
            "queue_depth": self._pending,
            "max_batch_size": self.knobs.max_batch_size,
            "batch_wait_timeout_s": self.knobs.batch_wait_timeout_s,
            "cpu_affinity": sorted(os.sched_getaffinity(0)),
            "load_seconds": self.predictor.load_seconds,
            "warm_seconds": self.warm_seconds,
            "process_started_at": process_started_at(),
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "recent_batches": list(self.recent_batches),
            "canary": self.canary.stats() if self.canary is not None else None,
            "pending_calls": self._pending,
            "gpu_ids": _ray_context("gpu_ids") or [],
            # What this process's CUDA (and so Paddle) can see: "" for a stage without a GPU share.
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpus_seen_by_paddle": getattr(self.predictor, "gpus_seen", None),
            "node_id": _ray_context("node_id"),
            "rss_mb": rss_mb(),
            "device": opts.device,
            "openvino_precision": opts.openvino_precision,
            "compile_cache": getattr(self.predictor, "cache", None),
            "precision_check": self.precision_check,
            "deferred_shapes": self.deferred.stats() if self.deferred is not None else None,
            "heap": self.trimmer.stats() if self.trimmer is not None else None,  # the process's (serve_app.serving.heap)
            **gpu_stats(self.predictor),
        }


def gpu_stats(predictor: Predictor) -> dict[str, Any]:
    """What the replica asked of the GPU (options as placed, before the
    device was settled: on a CPU fallback they show what a GPU would get)
    and what Paddle enforces. `gpu_memory_limit_mb` is the limit read back
    from Paddle after setting it, None where none is enforced (on the CPU)."""
    asked: PredictorOptions = getattr(predictor, "requested", predictor.options)
    bound = getattr(predictor, "gpu_memory", None)
    trt = asked.tensorrt
    trt_stats = None
    if trt is not None:
        from serve_app.inference.shape_ranges import range_of

        status = getattr(predictor, "tensorrt_status", None) or {}
        trt_stats = {
            "enabled": predictor.options.tensorrt is not None,
            "enable": trt.enable,  # as configured: auto, true (required) or false
            "why": status.get("reason"),  # why it is on or off in this replica
            "libraries": status.get("libraries"),
            "precision": trt.precision,
            "max_batch_size": trt.max_batch_size,
            "cache_dir": trt.cache_dir,
            "input_shapes": len(trt.input_shapes or []),
            "input_range": range_of(trt.input_shapes).as_dict() if trt.input_shapes else None,
            "tuned_shapes": getattr(predictor, "tuned_shapes", None),
            "int8_calibration": getattr(predictor, "int8_calibration", None),  # table made or reused
        }
    return {
        "requested_device": asked.device,
        "gpu_memory_fraction": asked.gpu_memory_fraction,
        "gpu_memory_reserve_mb": asked.gpu_memory_reserve_mb if asked.device == "gpu" else None,
        "gpu_memory_limit_mb": bound.limit_mb if bound is not None else None,
        "gpu_memory": bound.as_dict() if bound is not None else None,
        "tensorrt": trt_stats,
    }


def process_started_at() -> Optional[float]:
    """This process's start (time.time()), from /proc: now less the
    process's age (system uptime less its start in clock ticks since boot;
    10 ms resolution). None without /proc."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _replica_rank() -> int:
    """This replica's index on its node; 0 outside a replica."""
    if "ray" not in sys.modules:
        return 0
    try:
        from ray import serve

        return serve.get_replica_context().rank.local_rank
    except Exception:
        return 0


def _ray_context(what: str):
    """The GPU share Ray assigned this process, its GPU ids, or its node id;
    None outside Ray (which is then not imported)."""
    if "ray" not in sys.modules:
        return None
    try:
        import ray

        if what == "gpu_share":
            return ray.get_runtime_context().get_assigned_resources().get("GPU") or None
        if what == "gpu_ids":
            return [str(g) for g in ray.get_gpu_ids()]
        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None
