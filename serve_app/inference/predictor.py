"""The one seam to Paddle Inference: with serve_app/inference/gpu.py (what a
GPU process settles before its first predictor) and ov_slots.py (which
program file each CPU predictor loads), the only module that imports `paddle`.

A `PaddlePredictor` owns one Paddle predictor and one thread. The predictor
is built on that thread and every run happens on it: Paddle predictors are
not thread-safe (PaddleOCR#8640, Paddle#56524), and oneDNN primitives created
on one thread failed here with "could not execute a primitive" when a thread
pool called them from another. Callers on any thread (or an asyncio loop)
hand work to that thread and wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from functools import partialmethod
from typing import Any, Callable, Optional, Protocol, Sequence, TypeVar

import numpy as np

from serve_app.core.engine_config import PredictorOptions, TensorRTOptions
from serve_app.core.errors import ConfigError, ModelError
from serve_app.inference.weights import ModelFiles, model_digest
from serve_app.inference import compile_cache, ov_slots
from serve_app.inference.compile_cache import file_lock
from serve_app.inference.int8_calibration import set_digest
from serve_app.inference.gpu import (GpuMemoryBound, _gpu_missing_message, _process_limiter, device_total_mb,  # noqa: F401
                                     gpu_available, gpu_status, library_versions, resolve_tensorrt, tensorrt_fallback)

log = logging.getLogger(__name__)
T = TypeVar("T")


class Predictor(Protocol):
    """What the rest of the package calls on an inference engine (and what a
    test double must provide)."""

    name: str
    options: PredictorOptions
    load_seconds: float

    def run(self, x: np.ndarray) -> np.ndarray:
        """One forward pass; callable from any thread."""

    def run_all(self, x: np.ndarray) -> list[np.ndarray]: ...  # every output, in order (the structure models)

    async def call_async(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the predictor's own thread (where `run` is direct),
        awaited without blocking the event loop."""

    def close(self) -> None: ...


def pin_process(cores: Sequence[int]) -> None:
    """Pin every thread of this process (and threads created later, which
    inherit it) to `cores`. Paddle's OpenVINO engine binds its threads to CPU 0
    unless the process is pinned, so each replica must be pinned to its own."""
    available = os.sched_getaffinity(0)
    wanted = {int(c) for c in cores}
    if not wanted <= available:
        # On a smaller machine than the config was written for: fall back to
        # what exists rather than refusing to start.
        log.warning("cpu_affinity %s not all available (have %s); using %s",
                    sorted(wanted), sorted(available), sorted(wanted & available) or sorted(available))
        wanted = (wanted & available) or available
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), wanted)
        except OSError:  # a thread that ended meanwhile
            pass


def cpu_has_bf16() -> bool:
    """The cores have native bf16 and oneDNN's cap on instructions (ONEDNN_MAX_CPU_ISA, which OpenVINO's CPU kernels
    honour too) allows it: `ONEDNN_MAX_CPU_ISA=AVX2` stands in for a CPU without it (`auto`: fp32 then)."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    if cap != "ALL" and not any(isa in cap for isa in ("BF16", "AMX", "AVX10")):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _precision(inference, name: str):
    return {
        "fp32": inference.PrecisionType.Float32,
        "fp16": inference.PrecisionType.Half,
        "bf16": inference.PrecisionType.Bfloat16,
        "int8": inference.PrecisionType.Int8,
    }[name]


def resolve_device(options: PredictorOptions) -> PredictorOptions:
    """Refuse a GPU config where this process has no GPU (a CPU build of
    paddle, or none visible), unless the config allows falling back to the
    CPU; settle "auto" precision. Runs where the predictor is built (in a
    Serve replica: on the node Ray placed it on), never in the app builder."""
    if options.openvino_precision == "auto":
        options = options.model_copy(update={"openvino_precision": "bf16" if cpu_has_bf16() else "fp32"})
    if options.device != "gpu":
        return options
    cuda_build, count = gpu_status()
    if cuda_build and count > 0:
        return options
    if not options.allow_cpu_fallback:
        raise ConfigError(_gpu_missing_message(cuda_build))
    log.warning("device: gpu requested but unavailable; falling back to the CPU (allow_cpu_fallback)")
    # The CPU engine that ran fastest and leanest here (Paddle's OpenVINO).
    return options.model_copy(update={"device": "cpu", "tensorrt": None, "enable_openvino_engine": True})


# --- TensorRT shape ranges ---------------------------------------------------------------


def tuned_shape_file(files: ModelFiles, trt: TensorRTOptions) -> Optional[str]:
    """Where this stage's collected shape ranges live: the configured file,
    or one per (model, shape set, precision) in the engine cache directory."""
    if trt.shape_range_info_path:
        return trt.shape_range_info_path
    if not trt.input_shapes:
        return None
    from serve_app.inference.shape_ranges import shapes_key

    folder = trt.cache_dir or os.path.join(os.path.dirname(str(files.program)), "_trt")
    # "opt=served": collected with the opt runs (older files were not).
    key = shapes_key(trt.input_shapes, str(files.program), f"{trt.precision}|opt=served")
    return os.path.join(folder, f"shape_range_{files.name}_{key}.pbtxt")


def collect_shape_ranges(files: ModelFiles, options: PredictorOptions, shapes: Sequence[Sequence[int]],
                         out: str) -> None:
    """Run the model once per shape without TensorRT, then the set's opt
    (serve_app.inference.shape_ranges.range_of: the configured batch) as often again,
    so Paddle records it as every tensor's opt; every tensor's range into
    `out` (written to a temporary name, then renamed, so a reader never sees
    half a file)."""
    from paddle import inference

    from serve_app.inference.shape_ranges import collection_runs, range_of

    shapes = collection_runs([tuple(s) for s in shapes], range_of(shapes).opt)

    plain = options.model_copy(update={"tensorrt": None})
    tmp = f"{out}.{os.getpid()}.tmp"
    cfg = build_paddle_config(files, plain)
    cfg.collect_shape_range_info(tmp)
    predictor = inference.create_predictor(cfg)
    inp = predictor.get_input_handle(predictor.get_input_names()[0])
    for shape in shapes:
        inp.reshape(list(shape))
        inp.copy_from_cpu(np.zeros(tuple(shape), dtype=np.float32))
        predictor.run()
    del inp, predictor  # Paddle writes the file when the predictor is destroyed
    os.replace(tmp, out)


# --- compiled-engine cache (serve_app/inference/compile_cache.py) ---------------------------------


def openvino_cache_plan(files: ModelFiles, options: PredictorOptions,
                        name: str) -> compile_cache.CachePlan:
    """The folder OpenVINO compiles this model into: the published entry
    for this key, a private one to publish, or a throwaway one (no cache)."""
    if not options.cache_dir:
        return compile_cache.plan(None, "")
    try:
        with open("/proc/cpuinfo") as f:
            cpu = compile_cache.cpu_signature(f.read())
    except OSError:
        cpu = "unknown"
    parts = {"model": model_digest(files), "precision": options.openvino_precision,
             "threads": options.cpu_math_library_num_threads, "cpu": cpu, **library_versions(False)}
    root = compile_cache.resolve_root(options.cache_dir)
    return compile_cache.plan(root, compile_cache.entry_name(name, "openvino", parts))


def tensorrt_cache_dir(files: ModelFiles, options: PredictorOptions, name: str) -> Optional[str]:
    """The keyed folder for this stage's TensorRT engines and shape ranges,
    under tensorrt.cache_dir (or the predictor's cache_dir); None: neither
    is set (Paddle's default, beside the model)."""
    trt = options.tensorrt
    assert trt is not None
    base = trt.cache_dir or (compile_cache.resolve_root(options.cache_dir) if options.cache_dir else None)
    if base is None:
        return None
    import paddle

    parts = {"model": model_digest(files), "precision": trt.precision, "max_batch_size": trt.max_batch_size,
             "min_subgraph_size": trt.min_subgraph_size, "input_shapes": sorted(map(list, trt.input_shapes or [])),
             "shape_range_info_path": trt.shape_range_info_path, "opt": "served",  # engines tuned at the served batch
             "gpu": paddle.device.cuda.get_device_properties(options.gpu_device_id).name,
             **({"int8_set": set_digest()} if trt.precision == "int8" else {}), **library_versions(True)}
    return os.path.join(base, compile_cache.entry_name(name, "tensorrt", parts))


def build_paddle_config(files: ModelFiles, options: PredictorOptions, tuned_shapes: Optional[str] = None,
                        optim_cache_dir: Optional[str] = None):
    """optim_cache_dir: where OpenVINO writes (and looks for) its compiled
    model (Paddle's default is ./__cache__ in the working directory)."""
    from paddle import inference

    cfg = inference.Config(str(files.program), str(files.params))
    if options.device == "gpu":
        cfg.enable_use_gpu(options.gpu_mem_mb, options.gpu_device_id)
        trt = options.tensorrt
        if trt is not None:
            cfg.enable_tensorrt_engine(
                workspace_size=trt.workspace_size,
                max_batch_size=trt.max_batch_size,
                min_subgraph_size=trt.min_subgraph_size,
                precision_mode=_precision(inference, trt.precision),
                use_static=trt.use_static,
                use_calib_mode=trt.precision == "int8",
            )
            if trt.cache_dir:
                os.makedirs(trt.cache_dir, exist_ok=True)
                cfg.set_optim_cache_dir(trt.cache_dir)
            if tuned_shapes:
                cfg.enable_tuned_tensorrt_dynamic_shape(tuned_shapes, trt.allow_build_at_runtime)
    else:
        cfg.disable_gpu()
        cfg.set_cpu_math_library_num_threads(options.cpu_math_library_num_threads)
        if options.enable_openvino_engine:
            cfg.enable_openvino_engine(_precision(inference, options.openvino_precision))
            if optim_cache_dir:
                cfg.set_optim_cache_dir(optim_cache_dir)
        elif options.enable_mkldnn:
            cfg.enable_mkldnn()
            cfg.set_mkldnn_cache_capacity(options.mkldnn_cache_capacity)
        else:
            cfg.disable_mkldnn()
    if options.enable_memory_optim and str(files.program).endswith(".pdmodel"):  # Paddle 3.3.1 fails a .json with it
        cfg.enable_memory_optim()
    cfg.switch_ir_optim(options.switch_ir_optim)
    if options.enable_profile:
        cfg.enable_profile()
    cfg.disable_glog_info()
    cfg.switch_use_feed_fetch_ops(False)
    # The same two passes PaddleOCR and RapidOCR delete: they mis-fuse these models.
    cfg.delete_pass("conv_transpose_eltwiseadd_bn_fuse_pass")
    cfg.delete_pass("matmul_transpose_reshape_fuse_pass")
    return cfg


class PaddlePredictor:
    """One Paddle Inference predictor, run only on its own thread."""

    def __init__(self, files: ModelFiles, options: PredictorOptions, name: Optional[str] = None,
                 int8_inputs: Optional[Callable[[tuple], list]] = None, thread_init: Optional[Callable] = None):
        """thread_init: run on the predictor's own thread before the build
        (the engine's threads, started from it, inherit what it sets there:
        a serving replica's CPU priority, serve_app.serving.heap)."""
        self.name = name or files.name
        self._int8_inputs = int8_inputs  # TensorRT int8: real calibration batches (serve_app/inference/int8_calibration.py)
        self.int8_calibration: Optional[dict[str, Any]] = None
        self.requested = options  # as configured and placed, before the device was settled
        self.options = resolve_device(options)
        if options.tensorrt is not None and self.options.device != "gpu":  # fell back to the CPU
            self.tensorrt_status = {"on": False, "enable": options.tensorrt.enable, "libraries": None,
                                    "reason": "no GPU in this process (CPU fallback): TensorRT needs one"}
        else:
            self.options, self.tensorrt_status = resolve_tensorrt(self.options)
        if options.tensorrt is not None:
            (log.info if self.tensorrt_status["on"] else log.warning)(
                "%s: TensorRT %s: %s", self.name, "on" if self.tensorrt_status["on"] else "off",
                self.tensorrt_status["reason"])
        # GPUs this process's Paddle sees (0 for a stage without a GPU share: serve_app.serving.replica).
        self.gpus_seen = gpu_status()[1]
        self.gpu_memory: Optional[GpuMemoryBound] = None
        self.tuned_shapes: Optional[str] = None
        # The compiled-engine cache entry this predictor used: its folder,
        # whether it was already there (hit), whether this one published it.
        self.cache: Optional[dict[str, Any]] = None
        self._build_lock: Optional[ExitStack] = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"paddle-{self.name}",
                                            initializer=thread_init, initargs=(self,))
        self._closed = False
        self._files = files
        self._slot: Optional[ov_slots.Slot] = None
        t0 = time.perf_counter()
        try:
            try:
                self._executor.submit(self._build, files).result()
            except Exception as e:
                if not self.fall_back_from_tensorrt(e):
                    raise
        except Exception as e:
            self.release_build_lock()
            self._executor.shutdown(wait=False)
            if isinstance(e, (ConfigError, ModelError)):
                raise
            raise ModelError(f"could not load {self.name} model from {files.program}: {e}") from e
        self.load_seconds = time.perf_counter() - t0

    def use_precision(self, precision: str) -> None:
        """Rebuild this predictor with TensorRT at `precision` (a stage whose
        fp16/int8 answers missed their bound against fp32 goes to fp32; the
        engine cache entry is keyed by precision, so its own engines are
        built or read)."""
        trt = self.options.tensorrt
        assert trt is not None
        self.release_build_lock()
        base = self.requested.tensorrt or trt
        self.options = self.options.model_copy(update={"tensorrt": base.model_copy(update={"precision": precision})})
        self.tuned_shapes = None
        self.int8_calibration = None
        self._executor.submit(self._build, self._files).result()

    def fall_back_from_tensorrt(self, error: BaseException) -> bool:
        """After a failed TensorRT engine build: under `tensorrt.enable:
        auto`, rebuild this predictor without TensorRT (on its thread; the
        log and stats say why) and return True; False where the error
        stands. Raises what the rebuild raises."""
        fallback = tensorrt_fallback(self.options, self.tensorrt_status, error)
        if fallback is None:
            return False
        self.release_build_lock()
        self.options, self.tensorrt_status = fallback
        self.tuned_shapes = None
        log.warning("%s: TensorRT off: %s", self.name, self.tensorrt_status["reason"])
        self._executor.submit(self._build, self._files).result()
        return True

    def _build(self, files: ModelFiles) -> None:
        from paddle import inference

        if self.options.cpu_affinity is not None:
            pin_process(self.options.cpu_affinity)
        opts = self.options
        if opts.device == "gpu":
            # Before anything of this process allocates on the GPU.
            limiter = _process_limiter()
            self.gpu_memory = limiter.apply(opts.gpu_memory_fraction, device_total_mb(opts.gpu_device_id),
                                            opts.gpu_memory_reserve_mb)
            log.info("%s: GPU memory bound %s", self.name, self.gpu_memory)
            if opts.tensorrt is not None:
                trt_dir = tensorrt_cache_dir(files, opts, self.name)
                if trt_dir is not None:
                    opts = self.options = opts.model_copy(
                        update={"tensorrt": opts.tensorrt.model_copy(update={"cache_dir": trt_dir})})
                    self.cache = {"dir": trt_dir, "hit": os.path.isdir(trt_dir), "published": False}
                self._prepare_tensorrt(files, opts.tensorrt)
        self._release_slot()
        if opts.enable_openvino_engine and opts.device != "gpu":  # a key of its own (serve_app/inference/ov_slots.py)
            self._slot = ov_slots.acquire(files, opts.openvino_precision)
            files = self._slot.files
        cache = openvino_cache_plan(files, opts, self.name) if opts.enable_openvino_engine else None
        try:
            self._predictor = inference.create_predictor(
                build_paddle_config(files, opts, self.tuned_shapes, cache.workdir if cache else None))
        except BaseException:
            if cache is not None:
                cache.abandon()
            self._release_slot()
            raise
        if cache is not None:
            self.cache = cache.finish()
        if opts.device == "gpu":
            _process_limiter().created()
        self._input = self._predictor.get_input_handle(self._predictor.get_input_names()[0])
        self._outputs = [self._predictor.get_output_handle(n) for n in self._predictor.get_output_names()]
        self._thread_id = threading.get_ident()

    def _prepare_tensorrt(self, files: ModelFiles, trt: TensorRTOptions) -> None:
        """One writer per engine cache: take the stage's lock in cache_dir
        (held until `release_build_lock`, i.e. through the replica's warm-up,
        which meets every input shape, so whatever Paddle builds and
        serializes, at creation or at a shape's first run, is written by this
        replica alone); collect the tuned shape ranges if no replica has."""
        if trt.cache_dir:
            stack = ExitStack()
            stack.enter_context(file_lock(os.path.join(trt.cache_dir, f".{self.name}.build.lock")))
            self._build_lock = stack
        self.tuned_shapes = tuned_shape_file(files, trt)
        if self.tuned_shapes is None:
            log.warning("%s: TensorRT without input_shapes or shape_range_info_path: no dynamic-shape ranges",
                        self.name)
        elif not os.path.exists(self.tuned_shapes):
            if not trt.input_shapes:
                raise ConfigError(f"tensorrt.shape_range_info_path {self.tuned_shapes} does not exist")
            t0 = time.perf_counter()
            collect_shape_ranges(files, self.options, trt.input_shapes, self.tuned_shapes)
            log.info("%s: shape ranges of %d input shapes collected in %.1fs -> %s", self.name,
                     len(trt.input_shapes), time.perf_counter() - t0, self.tuned_shapes)
        if trt.precision == "int8":  # its table from real images first, under this lock
            from serve_app.inference.int8_calibration import ensure_table
            from paddle import inference

            self.int8_calibration = ensure_table(
                files, self.options, self.name, self._int8_inputs,
                lambda copy: inference.create_predictor(build_paddle_config(copy, self.options, self.tuned_shapes)))
            log.info("%s: TensorRT int8 calibration table %s", self.name, self.int8_calibration)

    def release_build_lock(self) -> None:
        """Let the next replica of this stage on this node build (or read
        what this one built). Called after warm-up; harmless twice."""
        lock, self._build_lock = self._build_lock, None
        if lock is not None:
            lock.close()

    def _run(self, x: np.ndarray, every: bool = False):
        assert threading.get_ident() == self._thread_id
        self._input.reshape(list(x.shape))
        self._input.copy_from_cpu(np.ascontiguousarray(x, dtype=np.float32))
        self._predictor.run()
        return [o.copy_to_cpu() for o in self._outputs] if every else self._outputs[0].copy_to_cpu()

    def submit(self, x: np.ndarray, every: bool = False) -> Future:
        if self._closed:
            raise RuntimeError(f"predictor {self.name} is closed")
        return self._executor.submit(self._run, x, every)

    def run(self, x: np.ndarray, every: bool = False):
        if threading.get_ident() == self._thread_id:  # already on our thread (inside call_async)
            return self._run(x, every)
        return self.submit(x, every).result()

    run_all = partialmethod(run, every=True)  # every output, in the model's order

    async def call_async(self, fn, *args):
        """`fn(*args)` (pre-, post-processing, runs) on this predictor's thread, not blocking the loop."""
        if self._closed:
            raise RuntimeError(f"predictor {self.name} is closed")
        return await asyncio.wrap_future(self._executor.submit(fn, *args))

    def _release_slot(self) -> None:
        slot, self._slot = getattr(self, "_slot", None), None
        slot and slot.release()

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True)
        self.release_build_lock()
        self._release_slot()

    def __del__(self):  # best effort; close() is the contract
        try:
            self._executor.shutdown(wait=False)
            self._release_slot()
        except Exception:
            pass
