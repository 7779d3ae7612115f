"""PDF work in processes that can be killed (issue 24, item 1).

PDFium runs in a small pool of child processes (`python -m
serve_app.flow.pdf_worker`), never in the serving process: a page that draws for
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
from typing import Any, Optional


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


class _Child:
    def __init__(self, memory_mb: int):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where serve_app is
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "PYTHONPATH": root + (os.pathsep + path if path else "")}
        self.proc = subprocess.Popen([sys.executable, "-m", "serve_app.flow.pdf_worker", str(memory_mb)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        self.reader = _Reader(self.proc.stdout.fileno())
        self.key: Optional[str] = None  # the document it holds open

    def alive(self) -> bool:
        return self.proc.poll() is None

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

    def _checkout(self, key: Optional[str], wait_s: float) -> _Child:
        deadline = time.monotonic() + wait_s
        with self.cond:
            while True:
                self.idle = [c for c in self.idle if c.alive() or self._drop(c)]
                if self.idle:
                    # prefer a child that holds this document already
                    for k, c in enumerate(self.idle):
                        if key is not None and c.key == key:
                            return self.idle.pop(k)
                    return self.idle.pop()
                if self.started < self.workers:
                    self.started += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolBusy()
                self.cond.wait(left)
        try:
            return self._spawner.submit(_Child, self.memory_mb).result()
        except BaseException:
            with self.cond:
                self.started -= 1
                self.cond.notify()
            raise

    def _drop(self, child: _Child) -> bool:
        child.kill()
        self.started -= 1
        return False

    def _give_back(self, child: _Child, ok: bool) -> None:
        if not ok:
            child.kill()
        with self.cond:
            if ok:
                self.idle.append(child)
            else:
                self.started -= 1
            self.cond.notify()

    def call(self, op: str, key: str, data: bytes, args: dict, budget_s: float, wait_s: float) -> tuple[dict, bytes]:
        """Run `op` on document `key` (its bytes `data`, sent only to a child
        that does not hold it) within budget_s seconds; a free child is
        waited for at most wait_s (PoolBusy). WorkerTimeout (the child was
        killed), WorkerDied, WorkerError (the child's own refusal)."""
        child = self._checkout(key, wait_s)
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
                self.killed += 1
                raise
            ok = True  # the child answered: it can serve again
            if "error" in header:
                if header["error"] in ("memory",):  # its heap may be fragmented: start afresh
                    ok = False
                raise WorkerError(header["error"], header.get("message", ""), header)
            return header, body
        finally:
            self._give_back(child, ok)

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


# -- the child's side ---------------------------------------------------------------------


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


class _Server:
    def __init__(self):
        import numpy  # noqa: F401  (imported before the address-space limit: to_numpy() needs it)
        import pypdfium2 as pdfium

        self.pdfium = pdfium
        self.key: Optional[str] = None
        self.doc = None

    def handle(self, req: dict, payload: bytes) -> tuple[dict, bytes]:
        pdfium = self.pdfium
        if req.get("has_data"):
            if self.doc is not None:
                self.doc.close()
                self.doc, self.key = None, None
            try:
                self.doc = pdfium.PdfDocument(payload)
            except pdfium.PdfiumError as e:
                if getattr(e, "err_code", None) == pdfium.raw.FPDF_ERR_PASSWORD:
                    return {"error": "encrypted", "message": "encrypted"}, b""
                return {"error": "bad_pdf", "message": str(e)}, b""
            self.key = req["key"]
        elif self.key != req["key"] or self.doc is None:
            return {"error": "bad_pdf", "message": "document not held"}, b""
        op = req["op"]
        if op == "open":
            n = len(self.doc)
            first = self._size(0) if n else None
            return {"pages": n, "first": first}, b""
        index = int(req["index"])
        if op == "size":
            return {"size": self._size(index)}, b""
        if op == "render":
            return self._render(index, int(req["width"]), int(req["height"]))
        if op == "text":
            return self._text(index, int(req["width"]), int(req["height"]), bool(req.get("chars")),
                              int(req["max_chars"]))
        return {"error": "bad_pdf", "message": f"unknown op {op!r}"}, b""

    def _page(self, index: int):
        try:
            return self.doc[index]
        except Exception as e:  # a /Count that lies, a broken page tree
            raise _PageError(index, f"page {index + 1} cannot be loaded ({e}); the PDF says it has "
                                    f"{len(self.doc)} pages") from None

    def _size(self, index: int) -> Optional[list[float]]:
        """The page's size in points, without loading the page (loading
        parses its content: forms and all, which is what a hostile page
        makes slow)."""
        import ctypes

        pdfium = self.pdfium
        size = pdfium.raw.FS_SIZEF()
        if not pdfium.raw.FPDF_GetPageSizeByIndexF(self.doc, index, ctypes.byref(size)):
            raise _PageError(index, f"page {index + 1} cannot be loaded (no size); the PDF says it has "
                                    f"{len(self.doc)} pages")
        return [float(size.width), float(size.height)]

    def _render(self, index: int, width: int, height: int) -> tuple[dict, bytes]:
        pdfium = self.pdfium
        page = self._page(index)
        try:
            # A bitmap of exactly the caller's size (pypdfium2's render() would
            # take the ceil of float32 noise).
            try:
                bitmap = pdfium.PdfBitmap.new_native(width, height, pdfium.raw.FPDFBitmap_BGR)
            except Exception:
                return {"error": "memory", "message": f"no memory for a {width}x{height} bitmap"}, b""
            try:
                bitmap.fill_rect((255, 255, 255, 255), 0, 0, width, height)
                pdfium.raw.FPDF_RenderPageBitmap(bitmap, page, 0, 0, width, height, 0, pdfium.raw.FPDF_ANNOT)
                import numpy as np

                arr = bitmap.to_numpy()
                if arr.ndim == 2:
                    arr = np.repeat(arr[..., None], 3, axis=2)
                data = np.ascontiguousarray(arr[..., :3]).tobytes()  # BGR, PDFium's own order
            finally:
                bitmap.close()
        finally:
            page.close()
        return {"shape": [height, width, 3]}, data

    def _text(self, index: int, width: int, height: int, return_chars: bool, max_chars: int) -> tuple[dict, bytes]:
        pdfium = self.pdfium
        page = self._page(index)
        try:
            textpage = page.get_textpage()
            try:
                n = textpage.count_chars()
                if n > max_chars:
                    return {"error": "text_too_long", "message": "", "chars": n}, b""
                chars = list(_page_chars(pdfium, textpage))
            finally:
                textpage.close()
            conv = pdfium.PdfPosConv(page, (0, 0, width, height, 0))
            lines = [_line(run, conv, return_chars) for run in _runs(chars)]
        finally:
            page.close()
        return {"lines": [ln for ln in lines if ln[0]]}, b""


class _PageError(Exception):
    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


Char = tuple  # (text, (left, bottom, right, top) in points, or None)


def _page_chars(pdfium, textpage):
    """(character, box or None) for each character PDFium reports; None for
    spaces and line breaks it generated (they have no box)."""
    for k in range(textpage.count_chars()):
        code = pdfium.raw.FPDFText_GetUnicode(textpage, k)
        if not code or 0xD800 <= code <= 0xDFFF:  # none, or half of a surrogate pair
            continue
        ch = chr(code)
        box = None
        if not ch.isspace():
            try:
                l, b, r, t = textpage.get_charbox(k)
            except pdfium.PdfiumError:
                l = r = 0.0
                b = t = 0.0
            box = (l, b, r, t) if r > l and t > b else None
        yield ch, box


def _runs(chars: list) -> list[list]:
    """Characters split into lines: at a line break, or where a character's
    vertical centre leaves the current line's height."""
    runs: list[list] = []
    cur: list = []
    lo = hi = None
    for ch, box in chars:
        if ch in "\r\n":
            if cur:
                runs.append(cur)
            cur, lo, hi = [], None, None
            continue
        if box is not None:
            mid = (box[1] + box[3]) / 2
            if lo is not None and not lo <= mid <= hi:
                runs.append(cur)
                cur, lo, hi = [], None, None
            lo = box[1] if lo is None else min(lo, box[1])
            hi = box[3] if hi is None else max(hi, box[3])
        cur.append((ch, box))
    if cur:
        runs.append(cur)
    return runs


def _quad(conv, box) -> list[list[float]]:
    """A box in points -> its axis-aligned pixel box, clockwise from top-left."""
    l, b, r, t = box
    pts = [conv.to_bitmap(x, y) for x, y in ((l, t), (r, t), (r, b), (l, b))]
    xs = [float(p[0]) for p in pts]
    ys = [float(p[1]) for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def _line(run: list, conv, return_chars: bool) -> list:
    """[text, box, chars or None] of one run of characters ("" when it has no box)."""
    boxes = [b for _, b in run if b is not None]
    text = "".join(ch for ch, _ in run).strip()
    if not boxes:
        return ["", [], None]
    union = (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))
    chars = [[ch, _quad(conv, b)] for ch, b in run if b is not None] if return_chars else None
    return [text, _quad(conv, union), chars]


def _die_with_parent() -> None:
    """SIGKILL this child when its parent dies (Linux prctl PR_SET_PDEATHSIG):
    a replica killed mid-render leaves no orphan drawing for minutes."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the parent's pipe closing still ends it between calls
        pass


def main(argv: list[str]) -> None:
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the signal was armed
        return
    memory_mb = int(argv[1]) if len(argv) > 1 else 3072
    # The protocol owns the real stdout; anything else printed goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = os.fdopen(os.dup(0), "rb")
    server = _Server()
    if memory_mb > 0:
        import resource

        limit = _vm_bytes() + memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        try:
            req, payload = _read_frame_blocking(inp)
        except EOFError:
            return
        try:
            header, body = server.handle(req, payload)
        except _PageError as e:
            header, body = {"error": "page", "message": str(e), "index": e.index}, b""
        except MemoryError:
            header, body = {"error": "memory", "message": "out of memory"}, b""
        except Exception as e:  # a PDFium failure on this document
            header, body = {"error": "bad_pdf", "message": f"{type(e).__name__}: {e}"}, b""
        del payload
        _write_frame(out, header, body)


if __name__ == "__main__":
    main(sys.argv)
