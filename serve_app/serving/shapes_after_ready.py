"""The recogniser's input shapes built after it is ready (`recognizer.warm:
core`), without stalling a request.

With `warm: core` a recogniser replica warms only the widths of its ladder
up to `recognizer.warm_core_max_width` at batch size 1 before it is ready (9
shapes of 71 by default: widths 320-1024). The rest (the wider widths at
batch size 1 first, then each larger batch size at each width) are built
after ready, one at a time,
on the predictor's own thread (predictors are not thread-safe; the same
FIFO executor the batches use), and only while the crop scheduler has
nothing queued or running: a build is handed to the thread only when the
scheduler is idle, and on the thread it is skipped if a batch was queued
meanwhile (it waits for the next idle moment). A request arriving while a
build runs waits for that one build at most (OpenVINO's first run at a new
input shape: ~35 ms here, `startup cold`, removed; commit 3f6bfa3 has it), never for the rest. The
builds do take CPU from the other stages' replicas on the same cores (the
recogniser is idle while the detector reads the next image): the first
requests after ready are slower than with `warm: full` (measured there).

Meanwhile a predictor batch of n crops at width w whose shape (n, w) is not
built yet runs as batches of built shapes of the same width (the largest
built size that fits, repeatedly; at a width with none built, batches of 1,
the first of which builds (1, w): a shape a batch has run is built). With bucket padding
every crop of a batch is padded to its own bucket's width either way, so
what is read is the same (serve_app.inference.runners.TextRecognizer).

No Ray import: unit-tested with stand-in predictors (tests/unit/test_shapes_after_ready.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Awaitable, Callable, Iterable, Optional, Sequence

Shape = tuple[int, int]  # (batch size, width)

log = logging.getLogger("ray.serve")


def core_shapes(shapes: Sequence[Shape], max_width: Optional[int] = None) -> tuple[list[Shape], list[Shape]]:
    """(before ready, after ready): every width up to `max_width` (None:
    all) at batch size 1; then the wider widths at batch size 1 (a lone
    crop of any width needs one), then the rest."""
    def core(s: Shape) -> bool:
        return s[0] == 1 and (max_width is None or s[1] <= max_width)
    return ([s for s in shapes if core(s)],
            [s for s in shapes if s[0] == 1 and not core(s)] + [s for s in shapes if s[0] != 1])


def kept_shapes(shapes: Sequence[Shape], sizes: Optional[Sequence[int]]) -> list[Shape]:
    """The shapes a replica builds with `recognizer.batch_sizes`: at each
    width the sizes listed and the width's largest (a full batch); None:
    all. A batch at any other size runs as built ones (DeferredShapes.sizes)."""
    if sizes is None:
        return list(shapes)
    top: dict[int, int] = {}
    for n, w in shapes:
        top[w] = max(top.get(w, 0), n)
    return [(n, w) for n, w in shapes if n in sizes or n == top[w]]


class DeferredShapes:
    """Which shapes are built, the split of a batch into built shapes, and
    the background build of the rest (`start`)."""

    def __init__(self, built: Iterable[Shape], later: Sequence[tuple[Shape, Callable, Any]]):
        self.built: set[Shape] = set(built)  # changed on the predictor's thread only
        self._left: deque = deque(later)
        self.total = len(self.built) + len(self._left)
        self.failed = 0
        self.yielded = 0  # builds skipped on the thread because a batch was queued meanwhile
        self.split_batches = 0  # predictor batches run as several built shapes
        self.build_seconds = 0.0
        self.finished_at: Optional[float] = None if self._left else time.time()  # nothing left: done now
        self.task: Optional[asyncio.Task] = None

    @property
    def left(self) -> int:
        return len(self._left)

    def sizes(self, n: int, width: int) -> list[int]:
        """n crops at `width` as predictor batch sizes of built shapes: [n]
        when (n, width) is built, else the largest built size that fits,
        repeatedly (1 when none is: it is then built by this batch, and
        counted built: run_split)."""
        if (n, width) in self.built:
            return [n]
        out, rest = [], n
        while rest:
            m = max((k for k in range(1, rest + 1) if (k, width) in self.built), default=1)
            out.append(m)
            rest -= m
        return out

    def run_split(self, fn: Callable[[list], list], items: list, width: int) -> list:
        """fn over `items` (one predictor batch at `width`) as batches of
        built shapes; the answers in the items' order. On the predictor's thread."""
        sizes = self.sizes(len(items), width)
        if len(sizes) == 1:
            out = fn(items)
            self.built.add((sizes[0], width))  # run once: built (the background build skips it)
            return out
        self.split_batches += 1
        out = []
        start = 0
        for m in sizes:
            out += fn(items[start:start + m])
            self.built.add((m, width))
            start += m
        return out

    def build_next(self, busy: Callable[[], bool]) -> bool:
        """On the predictor's thread: build the next shape, unless a batch
        is waiting (busy()); False when it gave way."""
        while self._left and self._left[0][0] in self.built:  # a batch ran it meanwhile
            self._left.popleft()
        if not self._left:
            if self.finished_at is None:
                self.finished_at = time.time()
            return False
        if busy():
            self.yielded += 1
            return False
        shape, fn, arg = self._left.popleft()
        t0 = time.perf_counter()
        try:
            fn(arg)
        except Exception as e:  # stays unbuilt: batches at it keep being split
            self.failed += 1
            log.warning("recogniser shape %s not built: %s", shape, e)
        else:
            self.built.add(shape)
        self.build_seconds += time.perf_counter() - t0
        if not self._left:
            self.finished_at = time.time()
        return True

    def batches(self, submit: Callable[..., Awaitable], read: Callable[[list], list],
                width_of: Callable[[list], int]) -> Callable[[list], Awaitable[list]]:
        """The crop scheduler's run_batch: read(items) on the predictor's
        thread (submit: its call_async), split into built shapes."""
        return lambda items: submit(self.run_split, read, items, width_of(items))

    async def build(self, submit: Callable[..., Awaitable], scheduler: Any,
                    others_busy: Callable[[], bool] = lambda: False, poll_s: float = 0.05) -> None:
        """Every shape left, one per idle moment of `scheduler` (a
        CropScheduler: wait_idle(), active) while `others_busy()` is false
        too (the other stages in this process: their requests first; polled
        every poll_s meanwhile). submit(fn, *args): fn on the predictor's
        thread (call_async)."""
        busy = lambda: scheduler.active or others_busy()  # noqa: E731 (read on the predictor's thread)
        while self._left:
            await scheduler.wait_idle()
            if others_busy():
                await asyncio.sleep(poll_s)
                continue
            # Handed over in the same step as the idle check: a batch queued
            # from now on is behind this one build on the thread, or makes it
            # give way (busy() there).
            await submit(self.build_next, busy)

    def start(self, submit: Callable[..., Awaitable], scheduler: Any,
              others_busy: Callable[[], bool] = lambda: False) -> bool:
        """Start `build` on the running event loop, once; False without one
        (the caller tries again from a coroutine)."""
        if self.task is not None or not self._left:
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self.task = loop.create_task(self.build(submit, scheduler, others_busy))
        self.task.add_done_callback(_log_failure)
        return True

    def stats(self) -> dict[str, Any]:
        return {"built": len(self.built), "left": len(self._left), "total": self.total, "failed": self.failed,
                "yielded": self.yielded, "split_batches": self.split_batches,
                "build_seconds": round(self.build_seconds, 3), "finished_at": self.finished_at}


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("recogniser background shape build stopped: %s", task.exception())
