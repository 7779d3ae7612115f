"""Device and precision resolution, with the GPU probe and /proc/cpuinfo
stood in for: no GPU needed, no paddle imported, no predictor built."""

from __future__ import annotations

import io
import os

import pytest

import serve_app.inference.predictor as predictor
from serve_app.core.engine_config import PredictorOptions, TensorRTOptions
from serve_app.core.errors import ConfigError
from serve_app.inference.predictor import cpu_has_bf16, resolve_device


def _gpu(cuda_build: bool, count: int):
    calls = []

    def probe() -> tuple[bool, int]:
        calls.append((cuda_build, count))
        return cuda_build, count

    return probe, calls


@pytest.fixture
def no_bf16(monkeypatch):
    monkeypatch.setattr(predictor, "cpu_has_bf16", lambda: False)


def _never():
    raise AssertionError("not to be called here")


# --- device: checked in the replica, with the device count stood in for ------------------


def test_cpu_is_taken_as_asked_without_probing_for_a_gpu(monkeypatch, no_bf16):
    monkeypatch.setattr(predictor, "gpu_status", _never)
    opts = PredictorOptions(device="cpu", openvino_precision="fp32")
    assert resolve_device(opts) is opts


@pytest.mark.parametrize("count", [1, 4])
def test_gpu_is_kept_when_one_is_there(monkeypatch, no_bf16, count):
    probe, calls = _gpu(True, count)
    monkeypatch.setattr(predictor, "gpu_status", probe)
    opts = PredictorOptions(device="gpu", tensorrt=TensorRTOptions())
    got = resolve_device(opts)
    assert calls == [(True, count)]
    assert got.device == "gpu"
    assert got.tensorrt == TensorRTOptions()
    assert got.enable_openvino_engine is False


def test_cpu_build_of_paddle_is_refused_naming_the_gpu_install(monkeypatch, no_bf16):
    monkeypatch.setattr(predictor, "gpu_status", lambda: (False, 0))
    with pytest.raises(ConfigError, match="set allow_cpu_fallback: true") as err:
        resolve_device(PredictorOptions(device="gpu"))
    msg = str(err.value)
    assert "device: gpu was asked for" in msg
    assert "CPU build (paddlepaddle)" in msg and "install paddlepaddle-gpu" in msg and "make install-gpu" in msg
    assert f"pid {os.getpid()}" in msg
    assert err.value.status == 500


def test_cuda_build_without_a_visible_gpu_is_refused_naming_num_gpus(monkeypatch, no_bf16):
    monkeypatch.setattr(predictor, "gpu_status", lambda: (True, 0))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError) as err:
        resolve_device(PredictorOptions(device="gpu"))
    msg = str(err.value)
    assert "sees no GPU" in msg and "ray_actor_options.num_gpus > 0" in msg
    assert "CUDA_VISIBLE_DEVICES=," in msg or "CUDA_VISIBLE_DEVICES=)" in msg
    assert "allow_cpu_fallback: true" in msg and "paddlepaddle-gpu" in msg


@pytest.mark.parametrize("status", [(False, 0), (True, 0)])
def test_gpu_asked_without_one_falls_back_to_openvino_on_the_cpu_when_allowed(monkeypatch, no_bf16, status):
    monkeypatch.setattr(predictor, "gpu_status", lambda: status)
    opts = PredictorOptions(device="gpu", tensorrt=TensorRTOptions(), allow_cpu_fallback=True, gpu_mem_mb=800)
    got = resolve_device(opts)
    assert got.device == "cpu"
    assert got.tensorrt is None  # TensorRT needs the GPU
    assert got.enable_openvino_engine is True
    assert got.gpu_mem_mb == 800  # everything else as configured
    assert opts.device == "gpu"  # the caller's options are not changed


def test_the_app_builder_checks_no_device(monkeypatch):
    """The builder runs on the head (maybe no GPU, num-cpus 0): a GPU
    profile must build there; only replicas check their own device."""
    import inspect

    import serve_app.app as app

    monkeypatch.setattr(predictor, "gpu_status", _never)
    assert "resolve_device(" not in inspect.getsource(app) and "gpu_status(" not in inspect.getsource(app)
    gpu = PredictorOptions(device="gpu", tensorrt=TensorRTOptions())
    from serve_app.core.engine_config import EngineConfig
    from serve_app.core.app_args import DetectorArgs

    got = app.with_shape_ranges("det", DetectorArgs(predictor=gpu), EngineConfig())
    assert got.predictor.device == "gpu" and got.predictor.tensorrt.input_shapes


# --- OpenVINO precision ------------------------------------------------------------------


@pytest.mark.parametrize("bf16, precision", [(True, "bf16"), (False, "fp32")])
def test_auto_precision_follows_the_cpu(monkeypatch, bf16, precision):
    monkeypatch.setattr(predictor, "cpu_has_bf16", lambda: bf16)
    got = resolve_device(PredictorOptions(device="cpu", enable_openvino_engine=True))
    assert got.openvino_precision == precision
    assert got.device == "cpu"


def test_auto_precision_is_settled_on_the_gpu_fallback_too(monkeypatch):
    monkeypatch.setattr(predictor, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(predictor, "gpu_status", lambda: (False, 0))
    got = resolve_device(PredictorOptions(device="gpu", allow_cpu_fallback=True))
    assert (got.device, got.enable_openvino_engine, got.openvino_precision) == ("cpu", True, "bf16")


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_explicit_precision_is_kept_without_reading_the_cpu(monkeypatch, precision):
    monkeypatch.setattr(predictor, "cpu_has_bf16", _never)
    got = resolve_device(PredictorOptions(openvino_precision=precision))
    assert got.openvino_precision == precision


# --- cpu_has_bf16 ------------------------------------------------------------------------

AVX512_CPU = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512vl\n"


@pytest.mark.parametrize(
    "cpuinfo, expected",
    [
        (AVX512_CPU, False),
        (AVX512_CPU.replace("avx512vl", "avx512vl avx512_bf16"), True),
        (AVX512_CPU.replace("avx512vl", "avx512vl amx_tile amx_bf16"), True),
        ("", False),
    ],
    ids=["avx512-without-bf16", "avx512_bf16", "amx_bf16", "empty"],
)
def test_cpu_has_bf16_reads_the_cpu_flags(monkeypatch, cpuinfo, expected):
    opened = []

    def fake_open(path, *args, **kwargs):
        opened.append(path)
        return io.StringIO(cpuinfo)

    # cpu_has_bf16 calls the builtin open(); a module global of that name shadows it.
    monkeypatch.setattr(predictor, "open", fake_open, raising=False)
    assert cpu_has_bf16() is expected
    assert opened == ["/proc/cpuinfo"]


def test_cpu_has_bf16_is_false_where_there_is_no_cpuinfo(monkeypatch):
    def unreadable(path, *args, **kwargs):
        raise FileNotFoundError(path)  # macOS, or a sandbox without /proc

    monkeypatch.setattr(predictor, "open", unreadable, raising=False)
    assert cpu_has_bf16() is False


@pytest.mark.parametrize("cap, expected", [("AVX2", False), ("avx512_core", False), ("AVX512_CORE_BF16", True),
                                           ("AVX512_CORE_AMX", True), ("ALL", True), ("", True)])
def test_cpu_has_bf16_follows_onednns_instruction_cap(monkeypatch, cap, expected):
    """ONEDNN_MAX_CPU_ISA below bf16's instructions: `auto` is fp32, as on a
    CPU without them (an AVX2 cap stands in for one: docs/performance.md)."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    monkeypatch.setattr(predictor, "open", lambda *a, **k: io.StringIO(AVX512_CPU + " avx512_bf16\n"), raising=False)
    assert cpu_has_bf16() is expected
