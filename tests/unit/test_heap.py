"""A model process's heap (serve_app/serving/heap.py): the idle trimmer on a
fake clock, the settings on a stand-in C library, and malloc_trim on a real
glibc in a child process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from serve_app.core.app_args import ModelArgs, RecognizerArgs
from serve_app.serving.heap import IdleTrimmer, set_mmap_threshold, trim


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def trimmer(idle_s=1.0):
    clock, trims = Clock(), []
    return IdleTrimmer(idle_s, clock=clock, trim_fn=lambda: trims.append(clock.t)), clock, trims


def test_nothing_is_trimmed_before_any_work_ran():
    t, clock, trims = trimmer()
    clock.t += 60
    assert t.step() is False and trims == []


def test_the_heap_is_trimmed_once_idle_for_idle_s_after_the_last_call_ended_and_only_once():
    t, clock, trims = trimmer(1.0)
    t.begin()
    clock.t += 5  # a long call: never trimmed while it runs
    assert t.step() is False
    t.end()
    clock.t += 0.9
    assert t.step() is False  # idle, but not for 1 s yet
    clock.t += 0.1
    assert t.step() is True and trims == [clock.t]
    clock.t += 10
    assert t.step() is False and t.trims == 1  # nothing ran since


def test_a_call_beginning_meanwhile_puts_the_trim_off():
    t, clock, trims = trimmer(1.0)
    t.begin()
    t.end()
    clock.t += 0.8
    t.begin()  # another request
    clock.t += 0.8
    assert t.step() is False  # one in flight
    t.end()
    clock.t += 0.5
    assert t.step() is False  # 0.5 s since it ended
    clock.t += 0.5
    assert t.step() is True and len(trims) == 1


def test_the_settings_reach_mallopt_and_are_left_alone_when_null_or_not_glibc():
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

        def malloc_trim(self, pad):
            calls.append(("trim", pad))
            return 1

    assert set_mmap_threshold(None, Libc()) is False and calls == []
    assert set_mmap_threshold(1 << 20, Libc()) is True
    assert trim(Libc()) is True
    assert calls == [(-3, 1 << 20), ("trim", 0)]
    assert trim(object()) is False  # a C library without them
    assert set_mmap_threshold(131072, object()) is False


def test_the_defaults_are_glibcs_own_threshold_and_a_trim_after_1_s_idle():
    for args in (ModelArgs(), RecognizerArgs()):
        assert (args.malloc_mmap_threshold, args.malloc_trim_idle_s) == (None, 1.0)


def test_the_arena_limit_as_an_arg_is_refused_naming_its_home():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="set MALLOC_ARENA_MAX in the deployment's ray_actor_options"):
        RecognizerArgs(malloc_arena_max=1)


@pytest.mark.parametrize("field, value", [("malloc_trim_idle_s", 0), ("malloc_trim_idle_s", -1)])
def test_an_idle_time_out_of_range_is_refused(field, value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=field):
        ModelArgs(**{field: value})


TRIM_PROBE = """
import ctypes, sys
from serve_app.serving.heap import set_mmap_threshold, trim

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

set_mmap_threshold(32 << 20)  # 1 MB buffers from the heap, as glibc's risen threshold gives them
bufs = [libc.malloc(1 << 20) for _ in range(200)]
for b in bufs:
    libc.memset(b, 1, 1 << 20)
for b in bufs[:-1]:  # the last one stays: the heap's top cannot shrink past it
    libc.free(b)
before = rss_mb()
if sys.argv[1] == "trim":
    assert trim()
print(before - rss_mb())
"""


@pytest.mark.parametrize("mode, freed_back", [("trim", True), ("none", False)])
def test_a_trim_gives_freed_pages_in_the_middle_of_the_heap_back_to_the_os(mode, freed_back):
    """199 MB of freed 1 MB buffers below a live one stay in the process
    (glibc's own trimming only shrinks the heap's top); malloc_trim(0) gives
    them back, which is what the idle trimmer relies on."""
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (float(out.stdout) > 150) is freed_back, out.stdout


def test_every_call_on_a_predictors_thread_counts_as_work_while_it_runs():
    import asyncio

    from serve_app.serving.heap import counted_calls

    t, clock, trims = trimmer(1.0)
    seen = []

    class Predictor:
        async def call_async(self, fn, *args):
            return fn(*args)

    p = Predictor()
    counted_calls(p, t)

    def work(x):
        seen.append(t.active)
        return x * 2

    assert asyncio.run(p.call_async(work, 21)) == 42
    assert seen == [1] and t.active == 0 and t.dirty  # counted while it ran; done now
    clock.t += 1
    assert t.step() is True


def test_threads_put_in_sched_idle_pass_it_to_threads_they_start_and_leave_the_others_alone():
    """A model replica's predictor thread (serve_app.serving.replica) is put
    in SCHED_IDLE; the threads it starts later (the engine's) inherit it;
    the process's other threads keep their policy."""
    import os
    import threading

    from serve_app.serving.heap import idle_threads

    policies, go, done = {}, threading.Event(), threading.Event()

    def child():
        policies["child"] = os.sched_getscheduler(0)

    def worker():
        go.wait(10)
        t = threading.Thread(target=child)
        t.start()
        t.join()
        policies["worker"] = os.sched_getscheduler(0)
        done.set()

    w = threading.Thread(target=worker)
    w.start()
    assert idle_threads({w.native_id}) == 1
    go.set()
    assert done.wait(10)
    w.join()
    assert policies == {"child": os.SCHED_IDLE, "worker": os.SCHED_IDLE}
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # this (the loop's) thread: untouched


def test_a_predictor_on_the_gpu_keeps_its_threads_priority_and_one_on_the_cpu_yields():
    import os
    import threading
    from types import SimpleNamespace

    from serve_app.serving.heap import idle_on_cpu

    got = {}

    def on_thread(device):
        got[device] = (idle_on_cpu(SimpleNamespace(options=SimpleNamespace(device=device))), os.sched_getscheduler(0))

    for device in ("gpu", "cpu"):
        t = threading.Thread(target=on_thread, args=(device,))
        t.start()
        t.join()
    assert got == {"gpu": (False, os.SCHED_OTHER), "cpu": (True, os.SCHED_IDLE)}
