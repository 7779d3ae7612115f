"""Paddle Inference predictor options (`engine.predictor`, a stage's `predictor`)
and TensorRT's, and the strict base of every engine config model. Pydantic,
no Paddle import: every invalid value is refused at construction."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorRTOptions(_Strict):
    """Paddle Inference `enable_tensorrt_engine` and friends (GPU only)."""

    enable: Union[Literal["auto"], bool] = Field(
        "auto",
        description="\"auto\": TensorRT where Paddle can load its library (serve_app/inference/tensorrt_libs.py), else "
        "Paddle's own GPU kernels; the replica's start-up log and stats say which and why. true: a "
        "replica without a loadable TensorRT refuses to start, saying what to install. false: off (as no "
        "`tensorrt:` at all). `tensorrt: auto` / `tensorrt: true` is short for this field alone.")
    workspace_size: int = Field(1 << 30, description="TensorRT's builder workspace in bytes")
    max_batch_size: int = Field(
        8,
        description="The largest batch the engine takes. In a Serve replica it is set from the stage's closed set of "
        "input shapes (serve_app.inference.shape_ranges), so it always equals the batch dimension's max.")
    min_subgraph_size: int = Field(
        3,
        description="subgraphs with fewer ops than this stay on Paddle's GPU kernels instead of TensorRT")
    precision: Literal["fp32", "fp16", "int8"] = Field(
        "fp16",
        description="The engines' precision. Below fp32 a replica is checked against fp32 on real images at start and "
        "serves at fp32 when outside the bound (serve_app/inference/precision_check.py); int8 is first "
        "calibrated on them (serve_app/inference/int8_calibration.py).")
    use_static: bool = Field(
        True,
        description="serialize the built engines into cache_dir and reuse them on the next start")
    cache_dir: Optional[str] = Field(
        None,
        description="Serialized engines and the tuned shape-range file land here (`set_optim_cache_dir`). Replicas of "
        "a stage take a file lock (flock) in it, so one at a time builds and writes while the others wait "
        "and then read what it wrote: node-local, or shared storage whose flock works across clients (the "
        "KubeRay claim of --trt-cache-claim, deploy/kuberay/trt-cache-pvc.yaml).")
    input_shapes: Optional[list[tuple[int, int, int, int]]] = Field(
        None,
        description="Every input shape this predictor can be given (N, C, H, W). In a Serve replica the app builder "
        "fills it from the stage's closed set (detector ladder x batch sizes, recogniser width ladder x "
        "batch limits); the predictor then collects every tensor's range over these shapes without "
        "TensorRT, once per cache_dir, and builds the engines from that.")
    shape_range_info_path: Optional[str] = Field(
        None,
        description="A tuned shape-range file made elsewhere (Paddle's `collect_shape_range_info`); used instead of "
        "collecting from input_shapes when set.")
    allow_build_at_runtime: bool = Field(
        False,
        description="False: an input outside the collected ranges is an error instead of an engine rebuild on the "
        "request path (none can happen when input_shapes is the stage's closed set; a replica runs every "
        "one in its warm-up).")


class PredictorOptions(_Strict):
    """Paddle Inference options, named as Paddle names them."""

    device: Literal["cpu", "gpu"] = Field(
        "cpu",
        description="where the predictor runs; gpu needs paddlepaddle-gpu (or allow_cpu_fallback)")
    gpu_device_id: int = Field(
        0,
        description="the GPU's index among those visible to the process (Ray sets CUDA_VISIBLE_DEVICES: 0 is the GPU "
        "it gave)")
    # Paddle's `memory_pool_init_size_mb`. Under Paddle's default allocator
    # (auto_growth) it bounds nothing: Paddle only turns it into
    # FLAGS_fraction_of_gpu_memory_to_use, which auto_growth does not read
    # (docs/deploy.md, "GPU memory").
    gpu_mem_mb: int = Field(500, ge=1, description="memory_pool_init_size_mb")
    gpu_memory_fraction: Optional[float] = Field(
        None, gt=0, le=1,
        description="Share of the GPU's memory this predictor's process may allocate through Paddle: "
        "FLAGS_gpu_memory_limit_mb = floor(fraction x the device's memory) - gpu_memory_reserve_mb, set "
        "before the process's first GPU predictor (Paddle reads it once per process). None in a Serve "
        "replica = the GPU fraction Ray assigned it (ray_actor_options.num_gpus); None outside one = no "
        "limit.")
    gpu_memory_reserve_mb: int = Field(
        768, ge=0,
        description="Held back from the share for what the process holds on the GPU outside Paddle's allocator (CUDA "
        "context, cuBLAS/cuDNN, TensorRT's own engine memory): not counted by the limit. Not measured "
        "here (no GPU run yet): load_tests/gpu_run.sh prints each replica's real GPU memory next to its "
        "limit, which is the figure to set this from.")
    cpu_math_library_num_threads: int = Field(
        1, ge=1, le=256,
        description="inference threads (a replica with cpu_cores gets one per core it is given)")
    enable_mkldnn: bool = Field(True, description="oneDNN (MKLDNN) kernels on the CPU when the OpenVINO engine is off")
    mkldnn_cache_capacity: int = Field(
        20, ge=0, description="oneDNN kernel cache entries (input shapes); 0 = unbounded"
    )
    enable_openvino_engine: bool = Field(
        False,
        description="Paddle's bundled OpenVINO engine on the CPU (faster than oneDNN: docs/architecture.md, \"Why the "
        "choices\")")
    openvino_precision: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto",
        description="\"auto\": bf16 on CPUs with native bf16 (avx512_bf16 or AMX), else fp32 (docs/architecture.md, "
        "\"Why the choices\"; `python -m load_tests engine precision` compares a precision with fp32). fp32 "
        "for bit-for-bit reproducibility across machines.")
    switch_ir_optim: bool = Field(True, description="Paddle's IR graph optimisation passes")
    enable_memory_optim: bool = Field(True, description="Paddle's memory reuse between tensors")
    tensorrt: Optional[TensorRTOptions] = Field(
        None,
        description="TensorRT engine options (section below); null: no TensorRT")
    cache_dir: Optional[str] = Field(
        "/tmp/ocr-serve-{uid}/cache",
        description="Compiled engines kept between replica starts (serve_app/inference/compile_cache.py): OpenVINO's "
        "compiled model on the CPU, TensorRT engines on a GPU (under tensorrt.cache_dir when that is "
        "set). One folder per (model files' sha256, engine, precision, threads, input shapes, library "
        "versions, CPU/GPU); `{uid}` is this user's id, the folder is made 0700. null: no cache (a "
        "throwaway folder per predictor; Paddle would otherwise write ./__cache__).")
    cpu_affinity: Optional[list[int]] = Field(
        None,
        description="Cores this process's inference threads may run on (os.sched_setaffinity). None leaves the "
        "process's affinity as it is.")
    enable_profile: bool = Field(False, description="Paddle's profiler (prints per-op timings)")
    allow_cpu_fallback: bool = Field(
        False,
        description="With the CPU build of paddle, a GPU config is refused unless this is set, in which case the "
        "predictor falls back to the CPU with a warning.")

    @model_validator(mode="before")
    @classmethod
    def _tensorrt_shorthand(cls, data: Any) -> Any:
        """`tensorrt: auto | true` = TensorRTOptions(enable=...); `tensorrt:
        false` or `enable: false` = no TensorRT."""
        if not isinstance(data, dict) or "tensorrt" not in data:
            return data
        trt = data["tensorrt"]
        if trt is False or (isinstance(trt, dict) and trt.get("enable") is False) or (
                isinstance(trt, TensorRTOptions) and trt.enable is False):
            return {**data, "tensorrt": None}
        if trt is True or trt == "auto":
            return {**data, "tensorrt": {"enable": trt}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "PredictorOptions":
        if self.tensorrt is not None and self.device != "gpu":
            raise ValueError("tensorrt needs device: gpu (TensorRT runs on NVIDIA GPUs only)")
        if self.enable_openvino_engine and self.device != "cpu":
            raise ValueError("enable_openvino_engine is a CPU engine; set device: cpu or turn it off")
        if self.cpu_affinity is not None and not self.cpu_affinity:
            raise ValueError("cpu_affinity must list at least one core, or be null")
        return self
