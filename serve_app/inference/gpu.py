"""What a GPU process settles before its first predictor: whether TensorRT is
on (where its library loads: serve_app/inference/tensorrt_libs.py) and the
bound on the GPU memory its Paddle may allocate. Part of the Paddle seam
(serve_app/inference/predictor.py builds the predictors)."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from serve_app.core.engine_config import PredictorOptions
from serve_app.core.errors import ConfigError
from serve_app.inference.tensorrt_libs import paddle_location, trt_compile_version

log = logging.getLogger(__name__)


# --- TensorRT: on where its library loads (serve_app/inference/tensorrt_libs.py) -------------------


def tensorrt_decision(enable: Any, usable: bool, reason: str) -> tuple[bool, str]:
    """(use TensorRT, why) for `tensorrt.enable` and what the library probe
    found; `enable: true` without a usable TensorRT is a ConfigError (the
    replica refuses to start), "auto" falls back to Paddle's GPU kernels."""
    if enable is False:
        return False, "tensorrt.enable: false"
    if usable:
        return True, reason
    if enable is True:
        raise ConfigError(f"tensorrt.enable: true, but TensorRT cannot be used here: {reason}; or set "
                          "tensorrt.enable: auto to run on Paddle's own GPU kernels without it")
    return False, f"tensorrt.enable: auto, running on Paddle's GPU kernels without TensorRT: {reason}"


def resolve_tensorrt(options: PredictorOptions,
                     locate: Optional[Callable[[], Any]] = None) -> tuple[PredictorOptions, dict[str, Any]]:
    """Settle `tensorrt.enable` on this GPU process: the options to build
    with (tensorrt None where it is off) and the status for logs and stats."""
    trt = options.tensorrt
    if trt is None:
        return options, {"on": False, "enable": None, "reason": "no tensorrt in the config", "libraries": None}
    if options.device != "gpu":
        return options, {"on": False, "enable": trt.enable, "libraries": None,
                         "reason": "no GPU in this process (CPU fallback): TensorRT needs one"}
    if locate is None:
        from serve_app.inference.tensorrt_libs import locate as find

        def locate():
            return find(trt_compile_version(), paddle_location())
    libs = locate()
    on, reason = tensorrt_decision(trt.enable, libs.usable, libs.reason)
    status = {"on": on, "enable": trt.enable, "reason": reason, "libraries": libs.as_dict()}
    return (options if on else options.model_copy(update={"tensorrt": None})), status


def tensorrt_fallback(options: PredictorOptions, status: dict, error: BaseException
                      ) -> Optional[tuple[PredictorOptions, dict]]:
    """What to rebuild with after a TensorRT engine build failed (at
    creation or at a shape's first run): under `tensorrt.enable: auto`, the
    same options without TensorRT and a status saying why; None where the
    error stands (TensorRT off already, `enable: true`, or a ConfigError:
    a configuration mistake is reported, not run around)."""
    trt = options.tensorrt
    if trt is None or trt.enable != "auto" or isinstance(error, ConfigError):
        return None
    why = (f"tensorrt.enable: auto, but the TensorRT engine build failed ({type(error).__name__}: "
           f"{str(error).strip()[:300]}): running on Paddle's GPU kernels without TensorRT")
    return options.model_copy(update={"tensorrt": None}), {**status, "on": False, "reason": why,
                                                           "engine_build_failed": True}


def gpu_status() -> tuple[bool, int]:
    """(this paddle is a CUDA build, GPUs visible to this process). Counting
    devices allocates nothing on them (cudaGetDeviceCount)."""
    import paddle

    if not paddle.is_compiled_with_cuda():
        return False, 0
    return True, int(paddle.device.cuda.device_count())


def gpu_available() -> bool:
    cuda, count = gpu_status()
    return cuda and count > 0


def _gpu_missing_message(cuda_build: bool) -> str:
    where = (f"this replica's process (pid {os.getpid()}, CUDA_VISIBLE_DEVICES="
             f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!s})")
    if not cuda_build:
        why = ("the paddle installed here is the CPU build (paddlepaddle): install paddlepaddle-gpu from "
               "Paddle's package index on every GPU node (`make install-gpu`, docs/deploy.md)")
    else:
        why = ("paddle is a CUDA build (paddlepaddle-gpu) but sees no GPU: give the deployment "
               "ray_actor_options.num_gpus > 0 so that Ray places it on a node with a GPU and sets "
               "CUDA_VISIBLE_DEVICES, and check the node's driver (nvidia-smi)")
    return (f"device: gpu was asked for, but {where} has none: {why}; "
            "or set allow_cpu_fallback: true to run this profile on the CPU instead")


def library_versions(gpu: bool) -> dict[str, str]:
    """What a compiled engine depends on besides the model: Paddle (which
    bundles its OpenVINO) and, on a GPU, CUDA, cuDNN and TensorRT."""
    import paddle

    out = {"paddle": paddle.__version__, "paddle_commit": getattr(paddle.version, "commit", "")}
    if gpu:
        for lib in ("cuda", "cudnn"):
            fn = getattr(paddle.version, lib, None)
            out[lib] = str(fn()) if callable(fn) else ""
        trt = getattr(paddle.inference, "get_trt_compile_version", None)
        out["tensorrt"] = str(trt()) if callable(trt) else ""
    return out


# --- GPU memory bound --------------------------------------------------------------------
#
# What Paddle enforces (Paddle 3.x source; not yet run on a GPU here):
# - FLAGS_gpu_memory_limit_mb (paddle/common/flags.cc) is read once per
#   process, when RecordedGpuMallocHelper::Instance() first runs
#   (paddle/phi/core/platform/device/gpu/gpu_info.cc, std::call_once); from
#   then on every cudaMalloc Paddle's allocators make goes through
#   RecordedGpuMallocHelper::Malloc, which returns out-of-memory once the
#   process's total would pass the limit, whatever the allocator strategy
#   (auto_growth, the default, or naive_best_fit: both sit on CUDAAllocator,
#   paddle/phi/core/memory/allocation/allocator_facade.cc).
# - Instance() first runs at the latest when the first GPU predictor is
#   created: CreatePaddlePredictor<AnalysisConfig> calls
#   AnalysisConfig::fraction_of_gpu_memory_for_pool(), which queries memory
#   through it (paddle/fluid/inference/api/analysis_predictor.cc,
#   analysis_config.cc). So the flag must be set before that, and is: below,
#   before create_predictor, on the predictor's thread.
# - That same call overwrites FLAGS_fraction_of_gpu_memory_to_use with
#   memory_pool_init_size_mb / total, once per process; and the auto_growth
#   allocator does not read that flag at all. That is why the old
#   per-replica fraction flag bounded nothing.


@dataclass(frozen=True)
class GpuMemoryBound:
    """What this process's Paddle may allocate on its GPU, as enforced."""

    device_total_mb: int
    fraction: float
    reserve_mb: int
    limit_mb: Optional[int]  # FLAGS_gpu_memory_limit_mb as read back; None = not enforced
    allocator_strategy: str
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_memory_limit_mb(fraction: float, device_total_mb: int, reserve_mb: int) -> int:
    """floor(fraction x device memory) - reserve, in MiB; refused when
    nothing would be left for the model."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"gpu_memory_fraction must be in (0, 1]; got {fraction}")
    share = int(fraction * device_total_mb)
    limit = share - int(reserve_mb)
    if limit < 256:
        raise ConfigError(
            f"a GPU share of {fraction} of {device_total_mb} MiB is {share} MiB; less "
            f"gpu_memory_reserve_mb ({reserve_mb}) leaves {limit} MiB for Paddle, too little to run a model: "
            "raise the deployment's num_gpus (or gpu_memory_fraction), or lower gpu_memory_reserve_mb")
    return limit


class GpuMemoryLimiter:
    """Sets FLAGS_gpu_memory_limit_mb once per process, before its first GPU
    predictor, and reports what is in force. `set_flags` / `get_flags` are
    paddle's (stand-ins in tests)."""

    def __init__(self, set_flags: Callable[[dict], None], get_flags: Callable[[str], dict]):
        self._set = set_flags
        self._get = get_flags
        self.gpu_predictors_created = 0
        self.applied: Optional[int] = None

    def _read(self, name: str) -> Any:
        return self._get(name).get(name)

    def apply(self, fraction: Optional[float], device_total_mb: int, reserve_mb: int) -> GpuMemoryBound:
        strategy = str(self._read("FLAGS_allocator_strategy"))
        if fraction is None:
            return GpuMemoryBound(device_total_mb, 1.0, 0, None, strategy, "no gpu_memory_fraction: no limit")
        want = gpu_memory_limit_mb(fraction, device_total_mb, reserve_mb)
        if self.applied is None and self.gpu_predictors_created == 0:
            self._set({"FLAGS_gpu_memory_limit_mb": want})
            self.applied = int(self._read("FLAGS_gpu_memory_limit_mb"))
            return GpuMemoryBound(device_total_mb, fraction, reserve_mb, self.applied or None, strategy)
        # Paddle has read the flag already (gpu_info.cc, once per process):
        # a new value would be reported but not enforced.
        note = (f"this process's limit was fixed by its first GPU predictor ({self.applied} MiB); "
                f"{want} MiB asked for here is not applied" if self.applied is not None else
                "a GPU predictor without a limit was created first in this process: no limit is enforced")
        log.warning("gpu memory limit: %s", note)
        return GpuMemoryBound(device_total_mb, fraction, reserve_mb, self.applied, strategy, note)

    def created(self) -> None:
        self.gpu_predictors_created += 1


_limiter: Optional[GpuMemoryLimiter] = None


def _process_limiter() -> GpuMemoryLimiter:
    global _limiter
    if _limiter is None:
        import paddle

        _limiter = GpuMemoryLimiter(paddle.set_flags, paddle.get_flags)
    return _limiter


def device_total_mb(device_id: int) -> int:
    """The GPU's memory (cudaGetDeviceProperties: allocates nothing and does
    not touch Paddle's memory bookkeeping, so the limit can still be set)."""
    import paddle

    return int(paddle.device.cuda.get_device_properties(device_id).total_memory // (1 << 20))
