"""The unit tier's stand-ins for a model, one of each kind (no Ray, no
models): a predictor (what serve_app.inference.predictor gives a replica or
a runner), a batch function on one thread (what a crop scheduler calls), and
a Serve batcher's two knobs (what a replica's reconfigure sets)."""

from __future__ import annotations

import asyncio
from typing import Optional

import numpy as np

from serve_app.core.engine_config import PredictorOptions


class StandInPredictor:
    """`run(x)` answers `outputs[:len(x)]` (the identity without outputs) and
    records each input; `call_async` runs on the caller's loop."""

    load_seconds = 0.5

    def __init__(self, outputs: Optional[np.ndarray] = None, name: str = "fake"):
        self.name = name
        self.outputs = outputs
        self.options = PredictorOptions(cpu_affinity=[1])
        self.inputs: list = []

    def run(self, x):
        self.inputs.append(x)
        return x if self.outputs is None else self.outputs[: len(x)]

    async def call_async(self, fn, *args):
        return fn(*args)

    def close(self) -> None:
        pass


class OneThreadBatchFunction:
    """An async batch function that, like a predictor's one thread, runs one
    call at a time (calls queue FIFO): each item (key, value) answers
    value * 2 after `delay` s; a batch holding `fail_on` raises ValueError."""

    def __init__(self, fail_on=None, delay: float = 0.0):
        self.batches: list[list] = []
        self.fail_on = fail_on
        self.delay = delay
        self.running = 0
        self.lock: Optional[asyncio.Lock] = None

    async def __call__(self, items):
        self.lock = self.lock or asyncio.Lock()
        async with self.lock:
            self.running += 1
            assert self.running == 1, "predictor called concurrently"
            try:
                self.batches.append(list(items))
                await asyncio.sleep(self.delay)
                if self.fail_on is not None and any(v == self.fail_on for _, v in items):
                    raise ValueError("bad crop")
                return [v * 2 for _, v in items]
            finally:
                self.running -= 1


class StandInBatcher:
    """The two knobs of a @serve.batch method that a replica's reconfigure sets."""

    size: Optional[int] = None
    wait: Optional[float] = None

    def set_max_batch_size(self, n: int) -> None:
        self.size = n

    def set_batch_wait_timeout_s(self, s: float) -> None:
        self.wait = s
