"""Answers written as text, hOCR or ALTO (serve_app.flow.formats) off the
event loop and out of the serving process, in a bounded pool: at most
`workers` renders run at once, each in a child process of its own
(serve_app/flow/render_child.py), and `max_waiting` wait; past that a
request gets Overloaded (503, Retry-After) instead of a place of its own.
A 60-page hOCR is ~2.7 s of pure-Python XML building: in a thread of the
ingress it held the GIL that the ingress's event loop needs (/healthz took
0.5 s beside 16 readers of it), and its element tree (hundreds of MB) was
the ingress's. A result comes as a dict (a sync answer, written to JSON
here) or as its stored JSON bytes (serve_app.jobs.state.Job.view_raw),
which go to the child as they are; the answer comes back as bytes.

A render that its request no longer waits for (the client left) still
holds its slot until it ends: what is counted is what runs. Also a gate for
reads of large stored results (`read_place(nbytes)`): at most
`max_large_reads` of them fetched, made and sent at once, a few more
waiting briefly for a place. No Ray import."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable, Optional, Union

from serve_app.core.errors import BadRequest, OcrError, Overloaded
from serve_app.flow.formats import render
from serve_app.flow.pdf_worker import WorkerDied, WorkerTimeout, _Reader, _write_frame

Body = Union[dict, bytes, bytearray, memoryview]
Renderer = Callable[[Body, str], tuple[bytes, str]]

CHILD_START_S = 30.0
RENDER_BUDGET_S = 120.0  # one render at most (then its child is killed): a 500-page hOCR is ~25 s


def json_bytes(body: Body) -> bytes:
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def render_here(body: Body, fmt: str) -> tuple[bytes, str]:
    """In this process (the unit tier's renderer; the pool's is a child)."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        body = json.loads(bytes(body))
    text, media = render(body, fmt)
    return text.encode(), media


class _Child:
    """One render child and its pipes."""

    def __init__(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where serve_app is
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "PYTHONPATH": root + (os.pathsep + path if path else "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "serve_app.flow.render_child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, close_fds=True)
        self.reader = _Reader(self.proc.stdout.fileno())
        try:
            header, _ = self.reader.frame(time.monotonic() + CHILD_START_S)
        except (WorkerTimeout, WorkerDied, ValueError):
            header = {}
        if not header.get("ready"):
            self.kill()
            raise Overloaded("the answer writer could not start; retry shortly, or fetch the JSON (format=json)",
                             retry_after_s=5)

    def call(self, fmt: str, payload: bytes, budget_s: float) -> tuple[bytes, str]:
        _write_frame(self.proc.stdin, {"fmt": fmt}, payload)
        header, body = self.reader.frame(time.monotonic() + budget_s)
        if "error" in header:
            if header["error"] == "bad_request":
                raise BadRequest(header.get("message", "bad format"))
            raise OcrError(f"the answer could not be written: {header.get('message', '')}")
        return body, header["media_type"]

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()


class ChildRenderer:
    """Renders in up to `workers` children, started when first needed; a
    child that fails or passes its budget is killed and replaced by the next
    call. Called from the pool's threads (blocking pipe I/O: the GIL is free)."""

    def __init__(self, budget_s: float = RENDER_BUDGET_S):
        self.budget_s = budget_s
        self._idle: list[_Child] = []
        self._all: list[_Child] = []
        self._lock = threading.Lock()

    def __call__(self, body: Body, fmt: str) -> tuple[bytes, str]:
        payload = json_bytes(body)
        with self._lock:
            child = self._idle.pop() if self._idle else None
        if child is None or child.proc.poll() is not None:
            child = _Child()
            with self._lock:
                self._all.append(child)
        ok = False
        try:
            out = child.call(fmt, payload, self.budget_s)
            ok = True
            return out
        except (WorkerTimeout, WorkerDied, BrokenPipeError, OSError, ValueError):
            raise Overloaded("writing this answer took too long or failed; retry later, or fetch the JSON "
                             "(format=json)", retry_after_s=5) from None
        except OcrError:
            ok = True  # the child answered: it is fine
            raise
        finally:
            with self._lock:
                if ok:
                    self._idle.append(child)
                else:
                    self._all.remove(child)
            if not ok:
                child.kill()

    def close(self) -> None:
        with self._lock:
            children, self._all, self._idle = self._all, [], []
        for child in children:
            child.kill()


class Place:
    """A held place (RenderPool.read_place): given back by release(), once,
    or when the place is dropped (its request's answer gone however it ended)."""

    def __init__(self, give: Optional[Callable[[], None]]):
        self._give = give

    def release(self) -> None:
        give, self._give = self._give, None
        if give is not None:
            give()

    def __del__(self):
        self.release()


class RenderPool:
    READ_WAITERS = 16  # readers of large results waiting for a place at once, at most (more: 503 at once)

    def __init__(self, workers: int = 1, max_waiting: int = 4, large_bytes: int = 4 << 20,
                 max_large_reads: int = 2, retry_after_s: int = 5, renderer: Optional[Renderer] = None,
                 read_wait_s: float = 2.0):
        self.workers = workers
        self.slots = workers + max_waiting
        self.large_bytes = large_bytes
        self.max_large_reads = max_large_reads
        self.retry_after_s = retry_after_s
        self.held = 0  # renders running or waiting (including ones whose request has left)
        self.large_reads = 0
        self.read_wait_s = read_wait_s
        self._read_waiters: collections.deque[asyncio.Future] = collections.deque()
        self.renderer: Renderer = renderer or ChildRenderer()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="render")

    def full(self) -> bool:
        return self.held >= self.slots

    async def render(self, body: Body, fmt: str) -> tuple[bytes, str]:
        """(document bytes, media type) of `body` (a result dict, or its
        JSON bytes) in `fmt`; Overloaded when the pool is full."""
        if self.full():
            raise Overloaded(f"{self.held} answers are being written as text/hOCR/ALTO here; retry shortly, "
                             f"or fetch the JSON (format=json)", retry_after_s=self.retry_after_s)
        self.held += 1
        done = asyncio.get_running_loop().run_in_executor(self._executor, self.renderer, body, fmt)
        done.add_done_callback(self._release)  # when it ends, whether or not anyone still waits
        return await asyncio.shield(done)

    def _release(self, _future: asyncio.Future) -> None:
        self.held -= 1

    async def read_place(self, nbytes: int) -> "Place":
        """A place to fetch, make and send a stored result of `nbytes`: a
        large one (at least large_bytes) takes one of max_large_reads
        places, waiting up to READ_WAIT_S for one (at most READ_WAITERS
        wait), else Overloaded (503, Retry-After); a small one passes.
        The caller releases it (Place.release, once; also when the place
        is dropped) after the answer's last byte is sent: what is counted
        is what is sent."""
        if nbytes < self.large_bytes:
            return Place(None)
        if self.large_reads < self.max_large_reads and not self._read_waiters:
            self.large_reads += 1
            return Place(self._give_read)
        if len(self._read_waiters) >= self.READ_WAITERS or self.read_wait_s <= 0:
            raise self._reads_full()
        turn = asyncio.get_running_loop().create_future()
        self._read_waiters.append(turn)
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.read_wait_s)
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._give_read()  # handed over just as it gave up: passed on
            else:
                turn.cancel()
            if turn in self._read_waiters:
                self._read_waiters.remove(turn)
            raise self._reads_full() from None
        return Place(self._give_read)

    def _reads_full(self) -> Overloaded:
        return Overloaded(f"{self.large_reads} large job results are being sent from here and "
                          f"{len(self._read_waiters)} wait; retry shortly", retry_after_s=self.retry_after_s)

    def _give_read(self) -> None:
        while self._read_waiters:  # the place passes to the first still waiting (the count stays)
            turn = self._read_waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.large_reads -= 1

    @contextlib.asynccontextmanager
    async def reading(self, nbytes: int) -> AsyncIterator[None]:
        """read_place held for the block."""
        place = await self.read_place(nbytes)
        try:
            yield
        finally:
            place.release()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.renderer, "close", None)
        if close is not None:
            close()
