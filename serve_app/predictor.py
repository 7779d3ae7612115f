"""The one seam to Paddle Inference: the only module that imports `paddle`.

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
from typing import Any, Callable, Optional, Protocol, Sequence, TypeVar

import numpy as np

from .config import PredictorOptions
from .errors import ConfigError, ModelError
from .weights import ModelFiles

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


def gpu_available() -> bool:
    import paddle

    return bool(paddle.is_compiled_with_cuda()) and paddle.device.cuda.device_count() > 0


def resolve_device(options: PredictorOptions) -> PredictorOptions:
    """Refuse a GPU config on a build or machine without one, unless the
    config allows falling back to the CPU; settle "auto" precision."""
    if options.openvino_precision == "auto":
        options = options.model_copy(update={"openvino_precision": "bf16" if cpu_has_bf16() else "fp32"})
    if options.device != "gpu" or gpu_available():
        return options
    if not options.allow_cpu_fallback:
        raise ConfigError(
            "device: gpu was asked for, but this paddle build has no CUDA or no GPU is "
            "visible (install the `gpu` extra, paddlepaddle-gpu, on a GPU machine); "
            "set allow_cpu_fallback: true to run this profile on the CPU instead"
        )
    log.warning("device: gpu requested but unavailable; falling back to the CPU (allow_cpu_fallback)")
    # The CPU engine that ran fastest and leanest here (Paddle's OpenVINO).
    return options.model_copy(update={"device": "cpu", "tensorrt": None, "enable_openvino_engine": True})


def build_paddle_config(files: ModelFiles, options: PredictorOptions):
    from paddle import inference

    cfg = inference.Config(str(files.program), str(files.params))
    if options.device == "gpu" and options.gpu_memory_fraction is not None:
        import paddle

        paddle.set_flags({"FLAGS_fraction_of_gpu_memory_to_use": options.gpu_memory_fraction})
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
            if trt.shape_range_info_path:
                cfg.enable_tuned_tensorrt_dynamic_shape(trt.shape_range_info_path, True)
    else:
        cfg.disable_gpu()
        cfg.set_cpu_math_library_num_threads(options.cpu_math_library_num_threads)
        if options.enable_openvino_engine:
            cfg.enable_openvino_engine(_precision(inference, options.openvino_precision))
        elif options.enable_mkldnn:
            cfg.enable_mkldnn()
            cfg.set_mkldnn_cache_capacity(options.mkldnn_cache_capacity)
        else:
            cfg.disable_mkldnn()
    if options.enable_memory_optim:
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

    def __init__(self, files: ModelFiles, options: PredictorOptions, name: Optional[str] = None):
        self.name = name or files.name
        self.options = resolve_device(options)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"paddle-{self.name}")
        self._closed = False
        t0 = time.perf_counter()
        try:
            self._executor.submit(self._build, files).result()
        except Exception as e:
            self._executor.shutdown(wait=False)
            if isinstance(e, (ConfigError, ModelError)):
                raise
            raise ModelError(f"could not load {self.name} model from {files.program}: {e}") from e
        self.load_seconds = time.perf_counter() - t0

    def _build(self, files: ModelFiles) -> None:
        from paddle import inference

        if self.options.cpu_affinity is not None:
            pin_process(self.options.cpu_affinity)
        self._predictor = inference.create_predictor(build_paddle_config(files, self.options))
        self._input = self._predictor.get_input_handle(self._predictor.get_input_names()[0])
        self._output = self._predictor.get_output_handle(self._predictor.get_output_names()[0])
        self._thread_id = threading.get_ident()

    def _run(self, x: np.ndarray) -> np.ndarray:
        assert threading.get_ident() == self._thread_id
        self._input.reshape(list(x.shape))
        self._input.copy_from_cpu(np.ascontiguousarray(x, dtype=np.float32))
        self._predictor.run()
        return self._output.copy_to_cpu()

    def submit(self, x: np.ndarray) -> Future:
        if self._closed:
            raise RuntimeError(f"predictor {self.name} is closed")
        return self._executor.submit(self._run, x)

    def run(self, x: np.ndarray) -> np.ndarray:
        if threading.get_ident() == self._thread_id:  # already on our thread (inside call_async)
            return self._run(x)
        return self.submit(x).result()

    async def call_async(self, fn, *args):
        """Run `fn(*args)` (pre-processing, predictor runs, post-processing)
        on this predictor's thread, without blocking the event loop."""
        if self._closed:
            raise RuntimeError(f"predictor {self.name} is closed")
        return await asyncio.wrap_future(self._executor.submit(fn, *args))

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True)

    def __del__(self):  # best effort; close() is the contract
        try:
            self._executor.shutdown(wait=False)
        except Exception:
            pass
