"""Multi-page TIFF input: a fax, a scanner's multi-page output, a TIFF made
by `tiffcp` or ImageMagick. Read as a document like a PDF (the same page
limits, pages[] in order, pages_done progress), through the page-source
interface the pipeline reads PDFs by (pages, geometry, render, text_lines,
close).

Pages are counted, and each page's size and the strips or tiles it is
stored in read, by walking the file's chain of image directories (IFDs) in
the bytes themselves (numpy over each directory's entries): PIL is never
opened in this process (its directory set-up loops in Python over every
tile: 0.2 s a page of 16 x 16 px tiles, holding the interpreter), only in
the children that decode. A chain that loops back on itself, or that is
longer than the page limit, costs a few reads per directory. Each page's
pixel count is checked from its directory before it is decoded (CCITT G4
packs a blank 1-bit page of 100 MP into a few hundred bytes), and its
strip or tile count prices its decoding at the door
(serve_app.http.policies.cost). No Ray import."""

from __future__ import annotations

import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from PIL import Image

from serve_app.core.engine_config import DocumentLimits
from serve_app.flow.page_geometry import PageGeometry
from serve_app.core.errors import (
    BadImage, BadRequest, ConfigError, DeadlineExceeded, Overloaded, PageOverBudget, TooLarge,
)
from serve_app.flow.pdf_worker import (
    PoolBusy, WorkerCannotStart, WorkerDied, WorkerError, WorkerPool, WorkerTimeout, shared_pool,
)
from serve_app.ocr.decode import to_bgr

TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


def is_tiff(data: Any) -> bool:
    return isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[:4]) in TIFF_MAGICS


@dataclass(frozen=True)
class TiffPage:
    """What a page's directory says: its size (0 where it does not say)
    and how many strips or tiles it is stored in (what a decoder walks)."""

    width: int
    height: int
    chunks: int


_WIDTH, _HEIGHT, _STRIP_OFFSETS, _TILE_OFFSETS = 256, 257, 273, 324


def _entries(data: bytes, at: int, n: int, e: str, big: bool) -> np.ndarray:
    """A directory's n entries (tag, type, count, value bytes), at most the file's rest."""
    size = 20 if big else 12
    n = min(n, (len(data) - at) // size)
    dtype = np.dtype([("tag", e + "u2"), ("type", e + "u2"), ("count", e + ("u8" if big else "u4")),
                      ("value", "V8" if big else "V4")])
    return np.frombuffer(data, dtype=dtype, count=max(0, n), offset=at)


def _value(entry: Any, e: str) -> int:
    """A SHORT, LONG or LONG8 entry's (first) value, held in the entry itself."""
    raw = bytes(entry["value"])
    fmt = {3: "H", 4: "I", 16: "Q"}.get(int(entry["type"]))
    if fmt is None or struct.calcsize(fmt) > len(raw):
        return 0
    return struct.unpack(e + fmt, raw[:struct.calcsize(fmt)])[0]


def tiff_pages(data: bytes, stop_after: int) -> list[TiffPage]:
    """Each page (top-level image directory) of the TIFF in `data`, at most
    stop_after + 1 of them. A chain that points outside the file, or back
    to a directory already seen, ends there. [] if not a TIFF."""
    data = bytes(data[:]) if not isinstance(data, bytes) else data
    if len(data) < 8 or data[:4] not in TIFF_MAGICS:
        return []
    e = "<" if data[:2] == b"II" else ">"
    big = data[2:4] in (b"+\x00", b"\x00+")
    if big:
        if len(data) < 16:
            return []
        offset = struct.unpack(e + "Q", data[8:16])[0]
        count_fmt, count_size, entry_size, next_fmt, next_size = "Q", 8, 20, "Q", 8
    else:
        offset = struct.unpack(e + "I", data[4:8])[0]
        count_fmt, count_size, entry_size, next_fmt, next_size = "H", 2, 12, "I", 4
    seen: set[int] = set()
    pages: list[TiffPage] = []
    while offset and offset not in seen and len(pages) <= stop_after:
        if offset + count_size > len(data):
            break
        seen.add(offset)
        n = struct.unpack(e + count_fmt, data[offset:offset + count_size])[0]
        entries = _entries(data, offset + count_size, n, e, big)
        found = {int(t): k for k, t in enumerate(entries["tag"])}
        w, h = (_value(entries[found[t]], e) if t in found else 0 for t in (_WIDTH, _HEIGHT))
        chunks = max((int(entries[found[t]]["count"]) for t in (_STRIP_OFFSETS, _TILE_OFFSETS) if t in found),
                     default=0)
        pages.append(TiffPage(w, h, chunks))
        at = offset + count_size + n * entry_size
        if at + next_size > len(data):
            break  # a last directory cut short: the child's decoder decides whether its page reads
        offset = struct.unpack(e + next_fmt, data[at:at + next_size])[0]
    return pages


def tiff_page_count(data: bytes, stop_after: int) -> int:
    """How many pages the TIFF in `data` has, counting at most stop_after + 1 (tiff_pages)."""
    return len(tiff_pages(data, stop_after))


def is_multipage_tiff(data: Any) -> bool:
    return is_tiff(data) and tiff_page_count(bytes(data), 1) > 1


class TiffPages:
    """An open multi-page TIFF, read page by page (each decoded in a worker
    child). Thread-safe; close() it when done."""

    kind = "tiff"

    def __init__(self, data: bytes, limits: DocumentLimits, max_pixels: Optional[int] = None,
                 exif_transpose: bool = True, pool: Optional[WorkerPool] = None, deadline: Optional[float] = None):
        self.limits = limits
        self.max_pixels = min(limits.max_page_pixels, max_pixels or limits.max_page_pixels)
        self.exif_transpose = exif_transpose
        self.deadline = deadline
        # Pages are decoded in the PDF worker pool's killable children
        # (serve_app.flow.pdf_worker), with a page's budget and the
        # documents' shares: a tile-heavy page decodes for most of a second.
        self.pool = pool or shared_pool(limits.workers, limits.worker_memory_mb)
        self.key = uuid.uuid4().hex
        self._data = bytes(data)
        if len(data) == 0:
            raise BadRequest("the TIFF is empty (0 bytes)")
        self.layout = tiff_pages(self._data, limits.max_pages)
        self.pages = len(self.layout)
        if self.pages == 0:
            raise BadImage("not a readable TIFF (no image directory); send a complete TIFF")
        if self.pages > limits.max_pages:
            raise TooLarge(f"the TIFF has more than {limits.max_pages} pages, over the limit of {limits.max_pages}; "
                           f"split it, or raise engine.documents.max_pages")
        self._closed = False

    def size(self, index: int) -> tuple[int, int]:
        """(width, height) of page `index` from its directory; TooLarge past
        the pixel limit. Nothing decoded."""
        w, h = self._page(index).width, self._page(index).height
        if w < 1 or h < 1:
            raise BadImage(f"page {index + 1} of the TIFF has no pixels ({w}x{h})")
        if w * h > self.max_pixels:
            raise TooLarge(f"page {index + 1} of the TIFF is {w}x{h} = {w * h} pixels, over the limit of "
                           f"{self.max_pixels}")
        return w, h

    def page_sizes(self) -> list[tuple[int, int]]:
        """Every page's (width, height), from its directory (size's checks on each)."""
        return [self.size(i) for i in range(self.pages)]

    def page_chunks(self) -> list[int]:
        """Every page's strip or tile count, from its directory (what decoding it walks)."""
        return [p.chunks for p in self.layout]

    def geometry(self, index: int) -> PageGeometry:
        """Page `index`'s size in pixels (a TIFF page is read at its own resolution)."""
        w, h = self.size(index)
        return PageGeometry(1.0, w, h)

    def render(self, index: int) -> np.ndarray:
        """Page `index` (0-based) as a BGR uint8 array, decoded in a PDF
        worker child within engine.documents.page_timeout_s (or the
        request's time left)."""
        self.size(index)
        budget, by_deadline = self._budget()
        what = f"page {index + 1} of the TIFF"
        try:
            header, body = self.pool.call(
                "render", self.key, self._data, {"index": index, "exif": self.exif_transpose,
                                                 "max_pixels": self.max_pixels},
                budget, wait_s=budget if by_deadline else 2 * budget,  # as PdfFile's
                share=self.limits.worker_share or max(1, self.pool.workers // 2))
        except WorkerTimeout:
            if by_deadline:
                raise DeadlineExceeded(f"the request's deadline passed while decoding {what}") from None
            raise PageOverBudget(f"{what} took over {budget:g} s to decode (engine.documents.page_timeout_s) "
                                 f"and was stopped; send it as an image of its own, or simpler") from None
        except WorkerCannotStart as e:
            raise ConfigError(str(e)) from None
        except PoolBusy:
            if by_deadline:
                raise DeadlineExceeded(f"the request's deadline passed waiting to decode {what}") from None
            raise Overloaded("every document worker here is busy; retry shortly", retry_after_s=1) from None
        except WorkerDied:
            raise PageOverBudget(f"{what} needs more memory than a document worker has "
                                 f"(engine.documents.worker_memory_mb = {self.limits.worker_memory_mb}), "
                                 f"or is broken") from None
        except WorkerError as e:
            if e.kind == "memory":
                raise PageOverBudget(f"{what} needs more memory than a document worker has "
                                     f"(engine.documents.worker_memory_mb = {self.limits.worker_memory_mb})") from None
            raise BadImage(e.message or f"{what} is corrupt or truncated") from None
        w, h = header["size"]
        page = Image.frombytes(header["mode"], (int(w), int(h)), body)
        del body
        return to_bgr(page)

    def _budget(self) -> tuple[float, bool]:
        """(seconds for one page, whether the request's deadline is what bounds them)."""
        budget = self.limits.page_timeout_s
        if self.deadline is not None:
            left = self.deadline - time.time()
            if left <= 0:
                raise DeadlineExceeded("the request's deadline passed before its TIFF was read")
            if left < budget:
                return left, True
        return budget, False

    def text_lines(self, index: int, return_chars: bool = False) -> None:
        """A TIFF has no text layer."""
        return None

    async def run(self, method, *args, **kwargs):
        """`await pages.run(pages.render, 3)`, as PdfFile.run: on the worker
        pool's own threads (waiting for a child holds no thread of the
        event loop's default executor)."""
        import asyncio
        import functools

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool.executor, functools.partial(method, *args, **kwargs))

    def close(self) -> None:
        """Done with it: a page of it waiting for a child, or decoding, is stopped (as PdfFile.close)."""
        if not getattr(self, "_closed", True):
            self.pool.forget(self.key)
        self._data = b""
        self._closed = True

    def _page(self, index: int) -> TiffPage:
        if getattr(self, "_closed", True):
            raise BadRequest("the TIFF was closed")
        if not 0 <= index < self.pages:
            raise BadRequest(f"page {index + 1} is not in this TIFF of {self.pages} pages")
        return self.layout[index]

    def __enter__(self) -> "TiffPages":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
