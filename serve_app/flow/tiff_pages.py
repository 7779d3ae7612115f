"""Multi-page TIFF input: a fax, a scanner's multi-page output, a TIFF made
by `tiffcp` or ImageMagick. Read as a document like a PDF (the same page
limits, pages[] in order, pages_done progress), through the page-source
interface the pipeline reads PDFs by (pages, geometry, render, text_lines,
close).

Pages are counted by walking the file's chain of image directories (IFDs)
in the bytes themselves, before PIL decodes anything: a chain that loops
back on itself, or that is longer than the page limit, costs a few reads
per directory. Each page's pixel count is checked from its directory before
it is decoded (CCITT G4 packs a blank 1-bit page of 100 MP into a few
hundred bytes). No Ray import."""

from __future__ import annotations

import io
import struct
import threading
import time
import uuid
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


def tiff_page_count(data: bytes, stop_after: int) -> int:
    """How many pages (top-level image directories) the TIFF in `data` has,
    counting at most stop_after + 1. A chain that points outside the file,
    or back to a directory already seen, ends there. 0 if not a TIFF."""
    data = bytes(data[:]) if not isinstance(data, bytes) else data
    if len(data) < 8 or data[:4] not in TIFF_MAGICS:
        return 0
    e = "<" if data[:2] == b"II" else ">"
    big = data[2:4] in (b"+\x00", b"\x00+")
    if big:
        if len(data) < 16:
            return 0
        offset = struct.unpack(e + "Q", data[8:16])[0]
        count_fmt, count_size, entry_size, next_fmt, next_size = "Q", 8, 20, "Q", 8
    else:
        offset = struct.unpack(e + "I", data[4:8])[0]
        count_fmt, count_size, entry_size, next_fmt, next_size = "H", 2, 12, "I", 4
    seen: set[int] = set()
    pages = 0
    while offset and offset not in seen and pages <= stop_after:
        if offset + count_size > len(data):
            break
        seen.add(offset)
        n = struct.unpack(e + count_fmt, data[offset:offset + count_size])[0]
        at = offset + count_size + n * entry_size
        if at + next_size > len(data):
            pages += 1  # a last directory cut short: PIL decides whether its page reads
            break
        pages += 1
        offset = struct.unpack(e + next_fmt, data[at:at + next_size])[0]
    return pages


def is_multipage_tiff(data: Any) -> bool:
    return is_tiff(data) and tiff_page_count(bytes(data), 1) > 1


class TiffPages:
    """An open multi-page TIFF, read page by page. Thread-safe (one lock
    around PIL's image, which seeks); close() it when done."""

    kind = "tiff"

    def __init__(self, data: bytes, limits: DocumentLimits, max_pixels: Optional[int] = None,
                 exif_transpose: bool = True, pool: Optional[WorkerPool] = None, deadline: Optional[float] = None):
        self.limits = limits
        self.max_pixels = min(limits.max_page_pixels, max_pixels or limits.max_page_pixels)
        self.exif_transpose = exif_transpose
        self.deadline = deadline
        self._lock = threading.Lock()
        # Pages are decoded in the PDF worker pool's killable children
        # (serve_app.flow.pdf_worker), with a page's budget and the
        # documents' shares: a tile-heavy page decodes for most of a second.
        self.pool = pool or shared_pool(limits.workers, limits.worker_memory_mb)
        self.key = uuid.uuid4().hex
        self._data = bytes(data)
        if len(data) == 0:
            raise BadRequest("the TIFF is empty (0 bytes)")
        self.pages = tiff_page_count(data, limits.max_pages)
        if self.pages == 0:
            raise BadImage("not a readable TIFF (no image directory); send a complete TIFF")
        if self.pages > limits.max_pages:
            raise TooLarge(f"the TIFF has more than {limits.max_pages} pages, over the limit of {limits.max_pages}; "
                           f"split it, or raise engine.documents.max_pages")
        try:
            self._img: Optional[Image.Image] = Image.open(io.BytesIO(bytes(data)), formats=("TIFF",))
        except Exception:
            raise BadImage("not a readable TIFF; send a complete TIFF") from None

    def size(self, index: int) -> tuple[int, int]:
        """(width, height) of page `index` from its directory; TooLarge past
        the pixel limit. Nothing decoded."""
        with self._lock:
            img = self._seek(index)
            w, h = img.size
        if w < 1 or h < 1:
            raise BadImage(f"page {index + 1} of the TIFF has no pixels ({w}x{h})")
        if w * h > self.max_pixels:
            raise TooLarge(f"page {index + 1} of the TIFF is {w}x{h} = {w * h} pixels, over the limit of "
                           f"{self.max_pixels}")
        return w, h

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
        self._data = b""
        with self._lock:
            img, self._img = getattr(self, "_img", None), None
        if img is not None:
            img.close()

    def _seek(self, index: int) -> Image.Image:
        if self._img is None:
            raise BadRequest("the TIFF was closed")
        if not 0 <= index < self.pages:
            raise BadRequest(f"page {index + 1} is not in this TIFF of {self.pages} pages")
        try:
            self._img.seek(index)
        except Exception as e:
            raise BadImage(f"page {index + 1} of the TIFF cannot be read ({type(e).__name__})") from None
        return self._img

    def __enter__(self) -> "TiffPages":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
