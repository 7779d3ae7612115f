"""The per-replica GPU memory bound, on the CPU: the arithmetic, the
once-per-process flag with paddle's set_flags/get_flags stood in, and what a
replica reports. No paddle, no Ray."""

from __future__ import annotations

import pytest

from serve_app.core.engine_config import PredictorOptions
from serve_app.core.errors import ConfigError
from serve_app.inference.gpu import GpuMemoryBound, GpuMemoryLimiter, gpu_memory_limit_mb
from serve_app.serving.replica import gpu_stats, placed_options


class FakeFlags:
    """paddle.set_flags / paddle.get_flags over a dict, with Paddle's defaults."""

    def __init__(self):
        self.flags = {"FLAGS_gpu_memory_limit_mb": 0, "FLAGS_allocator_strategy": "auto_growth"}
        self.sets: list[dict] = []

    def set_flags(self, d: dict) -> None:
        self.sets.append(dict(d))
        self.flags.update(d)

    def get_flags(self, name: str) -> dict:
        return {name: self.flags[name]}


# --- arithmetic ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fraction, total, reserve, limit",
    [
        (0.25, 143771, 768, 35174),   # H200 (140.4 GiB): floor(35942.75) - 768
        (0.25, 81559, 768, 19621),    # A100/H100 80 GB: floor(20389.75) - 768
        (0.25, 24564, 768, 5373),     # L4 / A10 24 GB
        (0.1, 24564, 768, 1688),      # the classifier's 0.1 on 24 GB
        (1.0, 16384, 0, 16384),
    ],
)
def test_limit_is_the_share_of_device_memory_less_the_reserve(fraction, total, reserve, limit):
    assert gpu_memory_limit_mb(fraction, total, reserve) == limit


def test_a_share_too_small_for_a_model_is_refused_saying_what_to_raise():
    with pytest.raises(ConfigError, match="raise the deployment's num_gpus") as err:
        gpu_memory_limit_mb(0.1, 8192, 768)  # 819 - 768 = 51 MiB
    assert "51 MiB" in str(err.value)


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_a_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ConfigError):
        gpu_memory_limit_mb(fraction, 16384, 0)


# --- the flag: set once per process, before the first GPU predictor --------------------------


def test_the_flag_is_set_before_the_first_predictor_and_read_back():
    f = FakeFlags()
    lim = GpuMemoryLimiter(f.set_flags, f.get_flags)
    bound = lim.apply(0.25, 81559, 768)
    assert f.sets == [{"FLAGS_gpu_memory_limit_mb": 19621}]
    assert bound == GpuMemoryBound(81559, 0.25, 768, 19621, "auto_growth")


def test_the_reported_limit_is_what_paddle_holds_not_what_was_asked():
    f = FakeFlags()
    f.set_flags = lambda d: None  # a paddle that ignores the flag: nothing enforced, nothing claimed
    lim = GpuMemoryLimiter(f.set_flags, f.get_flags)
    assert lim.apply(0.25, 81559, 768).limit_mb is None


def test_a_second_predictor_in_the_process_keeps_the_first_limit_and_says_so():
    f = FakeFlags()
    lim = GpuMemoryLimiter(f.set_flags, f.get_flags)
    lim.apply(0.25, 81559, 768)
    lim.created()
    again = lim.apply(0.5, 81559, 768)
    assert len(f.sets) == 1  # Paddle read it once (gpu_info.cc): a new value would not be enforced
    assert again.limit_mb == 19621 and "not applied" in again.note


def test_a_limit_after_an_unlimited_gpu_predictor_is_not_claimed():
    f = FakeFlags()
    lim = GpuMemoryLimiter(f.set_flags, f.get_flags)
    assert lim.apply(None, 81559, 768).limit_mb is None
    lim.created()
    late = lim.apply(0.25, 81559, 768)
    assert f.sets == [] and late.limit_mb is None and "no limit is enforced" in late.note


# --- a replica's share -> its options -> its stats ---------------------------------------------


class StandIn:
    """What gpu_stats reads off a PaddlePredictor."""

    def __init__(self, requested: PredictorOptions, options: PredictorOptions, bound=None):
        self.requested = requested
        self.options = options
        self.gpu_memory = bound


def test_ray_share_becomes_the_memory_share_and_stats_report_the_enforced_limit():
    asked = placed_options(PredictorOptions(device="gpu"), None, 0.25)
    assert asked.gpu_memory_fraction == 0.25
    f = FakeFlags()
    bound = GpuMemoryLimiter(f.set_flags, f.get_flags).apply(asked.gpu_memory_fraction, 81559,
                                                             asked.gpu_memory_reserve_mb)
    s = gpu_stats(StandIn(asked, asked, bound))
    assert s["requested_device"] == "gpu"
    assert s["gpu_memory_fraction"] == 0.25
    assert s["gpu_memory_limit_mb"] == 19621
    assert s["gpu_memory"]["device_total_mb"] == 81559 and s["gpu_memory"]["allocator_strategy"] == "auto_growth"


def test_on_a_cpu_fallback_stats_show_the_share_asked_for_and_no_enforced_limit():
    asked = placed_options(PredictorOptions(device="gpu", allow_cpu_fallback=True), None, 0.25)
    ran = asked.model_copy(update={"device": "cpu", "enable_openvino_engine": True})
    s = gpu_stats(StandIn(asked, ran))
    assert (s["requested_device"], s["gpu_memory_fraction"], s["gpu_memory_limit_mb"]) == ("gpu", 0.25, None)


def test_cpu_replicas_report_no_gpu_share():
    cpu = PredictorOptions()
    s = gpu_stats(StandIn(placed_options(cpu, [0], 0.25), cpu))
    assert s["gpu_memory_fraction"] is None and s["gpu_memory_limit_mb"] is None and s["tensorrt"] is None
