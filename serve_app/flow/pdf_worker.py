"""PDF work in processes that can be killed (issue 24, item 1).

PDFium runs in a small pool of child processes (`python -m
serve_app.flow.pdf_child`, serve_app/flow/pdf_child.py), never in the serving process: a page that draws for
minutes (nested form XObjects), or asks for more memory than it should, costs
one child, which is killed when its call's time budget passes and started
again for the next call. No lock is held across requests: each call (open a
document, one page's size, render, text layer) checks out one idle child for
its own duration. A child keeps the last document it was sent open (keyed by
the caller), so the pages of one PDF do not send its bytes again to a child
that has it.

The child's address space is limited (RLIMIT_AS: what it had after start-up
plus `memory_mb`), so an allocation over it fails in the child (a 4xx for the
page), not in the service. Answers come back as a small JSON header and raw
bytes (a rendered page's pixels): nothing from the child is unpickled, so a
child subverted by a hostile PDF cannot run code in the service.

Frames, both ways: 4-byte big-endian header length, the JSON header, 8-byte
payload length, the payload. No Ray import."""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional


class WorkerError(Exception):
    """A call the child answered with an error: `kind` (bad_pdf, encrypted,
    page, memory, text_too_long) and its message."""

    def __init__(self, kind: str, message: str, extra: Optional[dict] = None):
        super().__init__(message)
        self.kind, self.message, self.extra = kind, message, extra or {}


class WorkerTimeout(Exception):
    """The call ran past its budget; the child was killed."""


class WorkerDied(Exception):
    """The child exited during the call (a crash in PDFium, or killed)."""


class PoolBusy(Exception):
    """No child became free within the wait allowed."""


class WorkerCannotStart(Exception):
    """A child could not start at all (it said why, or exited at once): a
    limit of this machine or process, not the document's fault, and not
    cured by retrying (a low hard RLIMIT_AS inherited from the service)."""


# -- framing ---------------------------------------------------------------------


def _write_frame(f, header: dict, payload: bytes = b"") -> None:
    h = json.dumps(header).encode()
    f.write(struct.pack(">I", len(h)) + h + struct.pack(">Q", len(payload)))
    if payload:
        f.write(payload)
    f.flush()


def _read_exact_blocking(f, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _read_frame_blocking(f) -> tuple[dict, bytes]:
    (hl,) = struct.unpack(">I", _read_exact_blocking(f, 4))
    header = json.loads(_read_exact_blocking(f, hl))
    (pl,) = struct.unpack(">Q", _read_exact_blocking(f, 8))
    return header, _read_exact_blocking(f, pl) if pl else b""


# The largest answer a child may send (a rendered page): bounded by the
# caller's pixel limit times 3 bytes; this is a backstop against a broken child.
MAX_ANSWER_BYTES = 1 << 31
MAX_HEADER_BYTES = 64 << 20


class _Reader:
    """Reads frames from a child's stdout, each within a deadline (select)."""

    def __init__(self, fd: int):
        self.fd = fd

    def _exact(self, n: int, deadline: float) -> bytes:
        parts, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerTimeout()
            r, _, _ = select.select([self.fd], [], [], left)
            if not r:
                raise WorkerTimeout()
            chunk = os.read(self.fd, min(n - got, 1 << 22))
            if not chunk:
                raise WorkerDied()
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def frame(self, deadline: float) -> tuple[dict, bytes]:
        (hl,) = struct.unpack(">I", self._exact(4, deadline))
        if hl > MAX_HEADER_BYTES:
            raise WorkerDied()
        header = json.loads(self._exact(hl, deadline))
        (pl,) = struct.unpack(">Q", self._exact(8, deadline))
        if pl > MAX_ANSWER_BYTES:
            raise WorkerDied()
        return header, self._exact(pl, deadline) if pl else b""


# -- the parent's side ---------------------------------------------------------------


CHILD_START_S = 30.0  # a child's start-up at most this long (0.2-0.5 s on an idle core)


def _limit_hint() -> str:
    """What to check when a child cannot start: this process's address-space
    limit, which the child inherits."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    shown = "unlimited" if hard == resource.RLIM_INFINITY else f"{hard >> 20} MB"
    return (f"the service's hard address-space limit (RLIMIT_AS, `ulimit -v`) is {shown}: a worker needs a few "
            f"hundred MB to start plus up to engine.documents.worker_memory_mb; raise the limit")


class _Child:
    def __init__(self, memory_mb: int):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where serve_app is
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "PYTHONPATH": root + (os.pathsep + path if path else "")}
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "serve_app.flow.pdf_child", str(memory_mb)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        except OSError as e:  # no memory to start a process at all
            raise WorkerCannotStart(f"the document worker cannot start ({e}); {_limit_hint()}") from None
        self.reader = _Reader(self.proc.stdout.fileno())
        self.key: Optional[str] = None  # the document it holds open
        # Wait for its start-up (imports, memory limit) here, so a page's or an
        # open's budget times PDFium's work and not a Python start beside a busy core.
        try:
            header, _ = self.reader.frame(time.monotonic() + CHILD_START_S)
        except (WorkerTimeout, WorkerDied, ValueError, struct.error):
            header = {}
        if not header.get("ready"):  # a server problem, not the document's
            code = self.proc.poll()
            if code is None:
                try:
                    code = self.proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    code = None
            self.kill()
            if "message" in header:
                raise WorkerCannotStart(f"the document worker cannot start: {header['message']}; {_limit_hint()}")
            if code is not None:
                raise WorkerCannotStart(f"the document worker exited at start-up (code {code}); {_limit_hint()}")
            raise PoolBusy()  # slow to start beside a busy core: a 503 to retry

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Killed from another thread than its call's: the call reads its end
        (WorkerDied) and gives it back, closing its pipes there."""
        try:
            self.proc.kill()
        except OSError:
            pass

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class WorkerPool:
    """`workers` children, started when first needed. `call()` blocks its
    thread (use `executor`, the pool's own threads, from async code: a call
    waiting here never takes a thread of the event loop's default executor)."""

    def __init__(self, workers: int = 2, memory_mb: int = 3072):
        self.workers = workers
        self.memory_mb = memory_mb
        self.idle: list[_Child] = []
        self.started = 0  # children alive or checked out
        self.cond = threading.Condition()
        self.executor = ThreadPoolExecutor(max_workers=max(4, 4 * workers), thread_name_prefix="pdf")
        # Children are started from one long-lived thread: their parent-death
        # signal fires when the thread that started them ends, not the process.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdf-spawn")
        self.killed = 0  # children killed past their budget (for tests and stats)
        self.in_use: dict[Optional[str], int] = {}  # document key -> children it holds now
        self.waiting: dict[Optional[str], int] = {}  # document key -> its calls waiting for a child
        self.shares: dict[Optional[str], int] = {}  # document key (waiting) -> its share
        # Documents held to their share even while nobody else waits (a page of theirs ran past its
        # budget: the rest of the children are kept for everyone else), until they are closed.
        self.strict: set[Optional[str]] = set()
        self.calls: dict[_Child, Optional[str]] = {}  # child -> the document its call is for
        self.closed_keys: set[Optional[str]] = set()  # closed documents whose calls still wait: they give up

    def _checkout(self, key: Optional[str], wait_s: float, share: int = 0) -> _Child:
        """An idle child (or a new one, up to `workers`), waited for at most
        wait_s (PoolBusy). With `share`, document `key` already holding that
        many children gets none while another document waits for one: a
        document of slow pages cannot hold every child (work-conserving:
        alone, it may use them all)."""
        deadline = time.monotonic() + wait_s
        with self.cond:
            self.waiting[key] = self.waiting.get(key, 0) + 1
            self.shares[key] = share
            try:
                while True:
                    if key in self.closed_keys:
                        raise PoolBusy()  # its document was closed (given up) while this call waited
                    self.idle = [c for c in self.idle if c.alive() or self._drop(c)]
                    if self._may_take(key, share):
                        if self.idle:
                            # prefer a child that holds this document already
                            at = next((k for k, c in enumerate(self.idle) if key is not None and c.key == key), -1)
                            self._hold(key)
                            return self.idle.pop(at)
                        if self.started < self.workers:
                            self.started += 1
                            self._hold(key)
                            break
                    if key in self.strict and not self._under_share(key, share):
                        # held to its share and waiting for its own pages: not the pool being busy
                        # (they end within their budget, and it is given up after a few of them)
                        deadline = max(deadline, time.monotonic() + wait_s)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise PoolBusy()
                    self.cond.wait(left)
            finally:
                self.waiting[key] -= 1
                if not self.waiting[key]:
                    del self.waiting[key], self.shares[key]
                    self.closed_keys.discard(key)
        try:
            return self._spawner.submit(_Child, self.memory_mb).result()
        except BaseException:
            with self.cond:
                self.started -= 1
                self._release(key)
                self.cond.notify_all()
            raise

    def _under_share(self, key: Optional[str], share: int) -> bool:
        return not share or self.in_use.get(key, 0) < share

    def _may_take(self, key: Optional[str], share: int) -> bool:
        if self._under_share(key, share):
            return True
        if key in self.strict:
            return False
        # over its share: only while no other document within its own waits
        # (a free child is never kept idle)
        return not any(k != key and self._under_share(k, self.shares.get(k, 0)) for k in self.waiting)

    def _hold(self, key: Optional[str]) -> None:
        self.in_use[key] = self.in_use.get(key, 0) + 1

    def _release(self, key: Optional[str]) -> None:
        n = self.in_use.get(key, 0) - 1
        if n > 0:
            self.in_use[key] = n
        else:
            self.in_use.pop(key, None)

    def _drop(self, child: _Child) -> bool:
        child.kill()
        self.started -= 1
        return False

    def _give_back(self, child: _Child, ok: bool, key: Optional[str] = None) -> None:
        with self.cond:
            self.calls.pop(child, None)
        if not ok:
            child.kill()
        with self.cond:
            self._release(key)
            if ok:
                self.idle.append(child)
            else:
                self.started -= 1
            self.cond.notify_all()  # the waiter whose turn it is may not be the first

    def call(self, op: str, key: str, data: bytes, args: dict, budget_s: float, wait_s: float,
             share: int = 0) -> tuple[dict, bytes]:
        """Run `op` on document `key` (its bytes `data`, sent only to a child
        that does not hold it) within budget_s seconds; a free child is
        waited for at most wait_s (PoolBusy); `share`: see _checkout.
        WorkerTimeout (the child was killed; the document is held to its
        share from then on, whoever waits), WorkerDied, WorkerError (the
        child's own refusal)."""
        child = self._checkout(key, wait_s, share)
        with self.cond:
            self.calls[child] = key
        ok = False
        try:
            payload = b"" if child.key == key else bytes(data)
            deadline = time.monotonic() + budget_s
            try:
                _write_frame(child.proc.stdin, {"op": op, "key": key, "has_data": bool(payload), **args}, payload)
            except (BrokenPipeError, OSError):
                raise WorkerDied() from None
            child.key = key
            try:
                header, body = child.reader.frame(deadline)
            except WorkerTimeout:
                with self.cond:
                    # past its budget: this document's further calls get no child past its share,
                    # whoever waits (more such pages would take every core)
                    self.strict.add(key)
                    self.killed += 1
                raise
            ok = True  # the child answered: it can serve again
            if "error" in header:
                if header["error"] in ("memory",):  # its heap may be fragmented: start afresh
                    ok = False
                raise WorkerError(header["error"], header.get("message", ""), header)
            return header, body
        finally:
            self._give_back(child, ok, key)

    def forget(self, key: str) -> None:
        """Document `key` is closed: its calls waiting for a child give up
        (PoolBusy), a call of it still running has its child killed, and
        its share rule is dropped. (A document given up after pages over
        their budget stops at once, not after the pages it had queued.)"""
        with self.cond:
            self.strict.discard(key)
            if key in self.waiting:
                self.closed_keys.add(key)
            for child, k in self.calls.items():
                if k == key:
                    child.stop()
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            for c in self.idle:
                c.kill()
                self.started -= 1
            self.idle = []
        self.executor.shutdown(wait=False)
        self._spawner.shutdown(wait=False)


_POOLS: dict[tuple[int, int], WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(workers: int, memory_mb: int) -> WorkerPool:
    """This process's pool of that size (made on first use, never at import)."""
    with _POOLS_LOCK:
        pool = _POOLS.get((workers, memory_mb))
        if pool is None:
            pool = _POOLS[(workers, memory_mb)] = WorkerPool(workers, memory_mb)
        return pool


