"""A serving replica's CPU predictor yields the CPU to the front (issue 49):
built with serve_app.serving.heap.idle_on_cpu as its thread_init, the
predictor's own thread and every thread the engine starts from it run in
SCHED_IDLE, while the process's other threads keep theirs. A real Paddle
predictor (the default set's detector) in this process, no Ray."""

from __future__ import annotations

import os
import threading

import numpy as np

from serve_app.core.predictor_options import PredictorOptions
from serve_app.inference.predictor import PaddlePredictor
from serve_app.inference.weights import model_files
from serve_app.serving.heap import idle_on_cpu


def policies() -> dict[int, int]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[int(tid)] = os.sched_getscheduler(int(tid))
        except OSError:  # ended meanwhile
            pass
    return out


def test_a_cpu_predictors_thread_and_the_engine_threads_it_starts_run_in_sched_idle():
    before = policies()
    p = PaddlePredictor(model_files("det"), PredictorOptions(device="cpu", cpu_math_library_num_threads=2), "det",
                        thread_init=idle_on_cpu)
    try:
        p.run(np.zeros((1, 3, 64, 64), np.float32))
        own = p._executor.submit(threading.get_native_id).result()
        new = {tid: policy for tid, policy in policies().items() if tid not in before}
    finally:
        p.close()
    assert new.get(own) == os.SCHED_IDLE
    assert new and set(new.values()) == {os.SCHED_IDLE}, new  # the engine's threads too
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's thread: untouched
