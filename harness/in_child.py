"""A call in a fresh Python process, for work whose memory this process
would keep: Paddle keeps most of what a predictor allocated after it is
closed (~1 GB an engine; the reference pipeline's predictors over the 60
peer images' shapes grew to ~11 GB), so a test that builds predictors of
its own builds them in a child, whose memory goes back with it."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable


def call_in_child(fn: Callable[..., Any], *args: Any, timeout_s: float = 900) -> Any:
    """fn(*args) in a new interpreter (spawn: nothing of this process's Paddle,
    threads or Ray is inherited; it starts in this process's working folder with its
    sys.path); its result (picklable) or its exception. fn must be importable
    by module and name."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result(timeout=timeout_s)
