"""What a model replica does around its predictor (serve_app.serving.replica) and the
one failure-isolation helper, with a stand-in predictor. No Ray, no models."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.core.engine_config import PredictorOptions
from serve_app.core.errors import ConfigError
from serve_app.serving.isolation import run_isolated
from serve_app.serving.replica import (
    Crops, ModelReplica, crops_weight, hide_gpus_without_share, placed_options, replica_cores,
)
from serve_app.core.app_args import BatchKnobs, ModelArgs
from harness.fakes import StandInBatcher, StandInPredictor


def double(items):
    if "bad" in items:
        raise ValueError("bad item")
    return [x * 2 for x in items]


@pytest.mark.parametrize("cores, threads, rank, want", [
    (None, 1, 0, None),
    ([1, 0], 1, 0, [1]), ([1, 0], 1, 1, [0]), ([1, 0], 1, 2, [1]),  # wraps
    ([0, 1], 2, 0, [0, 1]), ([0, 1, 2, 3], 2, 1, [2, 3]), ([0, 1, 2], 2, 1, [0, 2]),
])
def test_replica_cores(cores, threads, rank, want):
    assert replica_cores(ModelArgs(cpu_cores=cores, threads=threads), rank) == want


def test_placed_options_pin_threads_and_take_the_gpu_share():
    cpu = placed_options(PredictorOptions(), [2, 3], gpu_share=None)
    assert (cpu.cpu_affinity, cpu.cpu_math_library_num_threads) == ([2, 3], 2)
    gpu = PredictorOptions(device="gpu")
    assert placed_options(gpu, None, 0.25).gpu_memory_fraction == 0.25
    assert placed_options(gpu, None, 2.0).gpu_memory_fraction == 1.0
    assert placed_options(gpu.model_copy(update={"gpu_memory_fraction": 0.1}), None, 0.25).gpu_memory_fraction == 0.1
    assert placed_options(PredictorOptions(), None, 0.25).gpu_memory_fraction is None  # CPU: no share
    assert placed_options(gpu, None, None) is gpu


def test_run_isolated_gives_each_group_its_slice_or_its_own_error():
    errors = []
    out = asyncio.run(run_isolated(lambda xs: asyncio.sleep(0, double(xs)), [[1, 2], ["bad"], [], [3]],
                                   errors.append))
    assert out[0] == [2, 4] and out[2] == [] and out[3] == [6]
    assert isinstance(out[1], ValueError) and len(errors) == 1
    assert asyncio.run(run_isolated(lambda xs: asyncio.sleep(0, double(xs)), [[1], [2, 3]])) == [[2], [4, 6]]


def test_a_replica_is_ready_only_after_warm_up_and_reports_what_it_batched():
    r = ModelReplica("rec", StandInPredictor(), BatchKnobs(max_batch_size=4))
    with pytest.raises(RuntimeError):
        r.check_health()
    seen = []
    r.warm([(seen.append, 1), (seen.append, 2)])
    assert seen == [1, 2]
    r.check_health()
    r.record(2, 7, 0.01)
    st = r.stats()
    assert st["stage"] == "rec" and st["max_batch_size"] == 4 and st["batch_wait_timeout_s"] == 0.0
    assert [(b["seq"], b["requests"], b["items"]) for b in st["recent_batches"]] == [(1, 2, 7)]
    assert st["load_seconds"] == 0.5 and st["warm_seconds"] >= 0 and st["rss_mb"] > 0


def test_reconfigure_lays_valid_knobs_over_the_defaults_and_refuses_bad_ones_unchanged():
    r = ModelReplica("det", StandInPredictor(), BatchKnobs(max_batch_size=4))
    batched = StandInBatcher()
    r.reconfigure({"max_batch_size": 7, "batch_wait_timeout_s": 0.02}, batched)
    assert (batched.size, batched.wait) == (7, 0.02)
    for bad in ({"max_batch_size": 0}, {"max_batch_size": "8"}, {"batch_size": 8}, {"batch_wait_timeout_s": -1}):
        with pytest.raises(ConfigError):
            r.reconfigure(bad, batched)
    assert (r.knobs.max_batch_size, batched.size) == (7, 7)
    # A user_config says all that differs from the code: a knob it leaves out is the default again.
    r.reconfigure({"batch_wait_timeout_s": 0.01}, batched)
    assert (r.knobs.max_batch_size, r.knobs.batch_wait_timeout_s) == (4, 0.01) == (batched.size, batched.wait)
    r.reconfigure({}, batched)
    assert (r.knobs.max_batch_size, r.knobs.batch_wait_timeout_s) == (4, 0.0)


def test_crops_count_against_the_batch_up_to_a_full_batch():
    r = ModelReplica("rec", StandInPredictor(), BatchKnobs(max_batch_size=24))
    items = [r.crops([0] * 3), r.crops([]), r.crops([0] * 100)]
    assert [i.weight for i in items] == [3, 1, 24]
    assert crops_weight(items) == 28
    assert items[2] == Crops([0] * 100, 24)


def test_queued_counts_calls_waiting_for_a_batch():
    r = ModelReplica("det", StandInPredictor(), BatchKnobs(max_batch_size=4))
    depth = []

    async def batched(item):
        depth.append(r._pending)
        await asyncio.sleep(0.01)
        return item

    async def main():
        return await asyncio.gather(*(r.queued(batched, i) for i in range(3)))

    assert asyncio.run(main()) == [0, 1, 2]
    assert depth == [1, 2, 3] and r._pending == 0


def test_isolated_runs_on_the_predictor_and_fails_only_the_bad_caller():
    r = ModelReplica("cls", StandInPredictor(), BatchKnobs(max_batch_size=4))
    out = asyncio.run(r.isolated(double, [[1], ["bad"], [2, 3]]))
    assert out[0] == [2] and out[2] == [4, 6] and isinstance(out[1], ValueError)


def test_process_start_time_is_when_the_process_started():
    import subprocess
    import sys
    import time

    from serve_app.serving.replica import process_started_at

    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", "import time, serve_app.serving.replica as r; "
                          "print(r.process_started_at(), time.time())"], capture_output=True, text=True,
                         env={"PYTHONPATH": str(__import__("pathlib").Path(__file__).resolve().parents[2])},
                         check=True)
    started, then = map(float, out.stdout.split())
    assert t0 - 0.05 <= started <= then
    assert process_started_at() < t0


def test_the_lane_gate_lets_a_batch_worth_into_the_fifo_queue_interactive_first():
    r = ModelReplica("det", StandInPredictor(), BatchKnobs(max_batch_size=2))
    r.use_lanes(max_wait_s=60.0)
    entered = []  # the FIFO batch queue's arrival order

    async def batched(item):
        entered.append(item)
        await asyncio.sleep(0.01)
        return item

    async def main():
        calls = [r.queued(batched, f"b{k}", "bulk") for k in range(4)] + [r.queued(batched, "i", "interactive")]
        tasks = []
        for c in calls:
            tasks.append(asyncio.ensure_future(c))
            await asyncio.sleep(0)
        return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == ["b0", "b1", "b2", "b3", "i"]
    # two bulk images were already in (a batch's worth); the interactive one came next, not last
    assert entered == ["b0", "b1", "i", "b2", "b3"] and r.pending == 0
    r.reconfigure({"max_batch_size": 3}, StandInBatcher())
    assert r.gate.capacity() == 3  # the gate follows the live batch size


@pytest.mark.parametrize("share, before, after, hidden", [
    (None, "0,1", "", True),      # num_gpus: 0 on a GPU node: Ray 2.60 leaves the node's devices visible
    (0.0, None, "", True),
    (0.25, "1", "1", False),      # a GPU share: Ray's own CUDA_VISIBLE_DEVICES stays
    (1.0, "0", "0", False),
])
def test_a_stage_without_a_gpu_share_sees_no_gpu(share, before, after, hidden):
    env = {} if before is None else {"CUDA_VISIBLE_DEVICES": before}
    assert hide_gpus_without_share(share, env) is hidden
    assert env.get("CUDA_VISIBLE_DEVICES") == after


# -- the malloc threshold (ModelArgs.malloc_mmap_threshold) ---------------------------

MMAP_PROBE = """
import ctypes, sys
from serve_app.serving.heap import set_mmap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "set":
    assert set_mmap_threshold(131072)
libc.free(libc.malloc(4 << 20))  # a big buffer freed: glibc's own threshold rises past it
before = libc.mallinfo2().hblkhd
held = libc.malloc(1 << 20)  # a 1 MB buffer, as a shape's activation
print(libc.mallinfo2().hblkhd - before)  # bytes mapped for it
"""


@pytest.mark.parametrize("mode, mapped", [("set", True), ("default", False)])
def test_with_the_threshold_a_big_buffer_after_a_big_free_is_mapped_not_kept_in_the_heap(mode, mapped):
    """glibc raises its mmap threshold after a mapped buffer is freed, so the
    next buffers of that size come from the heap, which keeps their peak
    (the detector held ~300 MB of freed buffers that way); the threshold set
    keeps them mapped, so they go back to the OS when freed."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", MMAP_PROBE, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (int(out.stdout) >= 1 << 20) is mapped, out.stdout


@pytest.mark.parametrize("value", [0, 4096, 64 * 1024 * 1024])
def test_a_threshold_that_would_map_every_small_object_or_that_glibc_ignores_is_refused(value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="malloc_mmap_threshold"):
        ModelArgs(malloc_mmap_threshold=value)
    assert ModelArgs(malloc_mmap_threshold=None).malloc_mmap_threshold is None


def test_a_stage_that_misses_its_precision_bound_serves_at_fp32_and_says_so(caplog):
    """#39 item 4: fp16 reading over 1% of characters otherwise than fp32 is
    not a failed start: the predictor is rebuilt at fp32 (use_precision),
    a warning gives the figure, stats say which precision serves."""
    import logging

    from serve_app.core.engine_config import PredictorOptions

    p = StandInPredictor()
    p.options = PredictorOptions(device="gpu", tensorrt={"precision": "fp16"})
    p.needs_precision_check = True
    used = []

    def use_precision(precision):
        used.append(precision)
        p.options = p.options.model_copy(update={"tensorrt": p.options.tensorrt.model_copy(
            update={"precision": precision})})

    p.use_precision = use_precision
    r = ModelReplica("rec", p, BatchKnobs(max_batch_size=4, batch_wait_timeout_s=0.01))
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        got = r.judge_precision(["w1", "w2"], ["c1", "c2"], lambda c: ["GRAND", "HOTEL"], lambda c: ["GRAN", "H0TE1"])
    assert used == ["fp32"] and p.options.tensorrt.precision == "fp32"
    assert got["precision"] == "fp16" and got["serving"] == "fp32" and "CER" in got["fell_back"]
    assert r.stats()["precision_check"]["serving"] == "fp32"
    assert any("serving this stage with TensorRT at fp32" in rec.getMessage() for rec in caplog.records)
    ok = ModelReplica("rec", p, BatchKnobs(max_batch_size=4, batch_wait_timeout_s=0.01))
    p.options = PredictorOptions(device="gpu", tensorrt={"precision": "fp16"})
    assert ok.judge_precision(["w1"], ["c1"], lambda c: ["GRAND"], lambda c: ["GRAND"])["serving"] == "fp16"
    assert used == ["fp32"]


def test_a_model_replica_yields_the_cpu_to_the_front_on_every_thread():
    """yield_to_front (called once a model replica's predictor is built):
    every thread of the process, and those it starts later, MODEL_NICE_STEP
    nicer than it started (Ray starts workers at 15: the model's at 19, the
    front's stay at 15); a second call (another stage in the process) does
    not stack it."""
    import subprocess
    import sys

    code = (
        "import os, threading\n"
        "from serve_app.serving.heap import MODEL_NICE_STEP, yield_to_front\n"
        "nice = lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
        "start = nice()\n"
        "seen, later = [], []\n"
        "t = threading.Thread(target=lambda: (threading.Event().wait(0.5), seen.append(nice())))\n"
        "t.start()\n"
        "yield_to_front()\n"
        "u = threading.Thread(target=lambda: later.append(nice()))\n"
        "u.start(); u.join(); t.join()\n"
        "yield_to_front()\n"
        "print(start, MODEL_NICE_STEP, nice(), seen[0], later[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    start, step, main, before, after = map(int, out.stdout.split())
    assert step >= 1 and main == before == after == min(19, start + step)
