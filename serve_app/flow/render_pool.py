"""Answers written as text, hOCR or ALTO (serve_app.flow.formats) off the
event loop, in a bounded pool: at most `workers` renders run at once and
`max_waiting` wait; past that a request gets Overloaded (503, Retry-After)
instead of a thread of its own. A long document's hOCR took ~11 s and
~400 MB in the ingress, and each GET of it another. A stored job result
comes as its JSON bytes (serve_app.jobs.state.Job.view_raw) and is parsed
in the pool's thread, never on the loop.

A render that its request no longer waits for (the client left) still
holds its slot until it ends: what is counted is what runs. Also a gate for
reads of large stored results (`reading(nbytes)`): at most `max_large_reads`
of them at once. No Ray import."""

from __future__ import annotations

import asyncio
import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Union

from serve_app.core.errors import Overloaded
from serve_app.flow.formats import render


def _render(body: Union[dict, bytes], fmt: str) -> tuple[str, str]:
    if isinstance(body, (bytes, bytearray, memoryview)):
        body = json.loads(bytes(body))
    return render(body, fmt)


class RenderPool:
    def __init__(self, workers: int = 1, max_waiting: int = 4, large_bytes: int = 4 << 20,
                 max_large_reads: int = 2, retry_after_s: int = 5):
        self.workers = workers
        self.slots = workers + max_waiting
        self.large_bytes = large_bytes
        self.max_large_reads = max_large_reads
        self.retry_after_s = retry_after_s
        self.held = 0  # renders running or waiting (including ones whose request has left)
        self.large_reads = 0
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="render")

    async def render(self, body: Union[dict, bytes], fmt: str) -> tuple[str, str]:
        """(document, media type) of `body` (a result dict, or its JSON
        bytes) in `fmt`; Overloaded when the pool is full."""
        if self.held >= self.slots:
            raise Overloaded(f"{self.held} answers are being written as text/hOCR/ALTO here; retry shortly, "
                             f"or fetch the JSON (format=json)", retry_after_s=self.retry_after_s)
        self.held += 1
        done = asyncio.get_running_loop().run_in_executor(self._executor, _render, body, fmt)
        done.add_done_callback(self._release)  # when it ends, whether or not anyone still waits
        return await asyncio.shield(done)

    def _release(self, _future: asyncio.Future) -> None:
        self.held -= 1

    @contextlib.asynccontextmanager
    async def reading(self, nbytes: int) -> AsyncIterator[None]:
        """Held while a stored result of `nbytes` is sent: a large one (at
        least large_bytes) takes one of max_large_reads places, else
        Overloaded; a small one passes."""
        if nbytes < self.large_bytes:
            yield
            return
        if self.large_reads >= self.max_large_reads:
            raise Overloaded(f"{self.large_reads} large job results are being sent from here; retry shortly",
                             retry_after_s=self.retry_after_s)
        self.large_reads += 1
        try:
            yield
        finally:
            self.large_reads -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
