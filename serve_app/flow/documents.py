"""PDF input: open a PDF (refusing encrypted, broken and over-long ones),
render a page to a BGR array at the configured DPI, or read a page's text
layer as lines. No Ray import: unit-tested on PDFs made in the tests.

Rendered with pypdfium2 (PyPI; Apache-2.0 / BSD-3-Clause): its wheels bundle
PDFium, the PDF engine of Chromium, so there is no system dependency, it is
well kept (releases follow PDFium's), and it is fast: a peer photo's page
renders in 1-11 ms here. PDFium runs in child processes
(serve_app.flow.pdf_worker), each call within a time budget (the child is killed
past it) and a memory bound: a hostile page costs one child, never the
replica. No lock is held across requests (a call checks out one child)."""

from __future__ import annotations

import asyncio
import functools
import math
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import numpy as np

from serve_app.core.engine_config import DocumentLimits
from serve_app.core.errors import BadRequest, ConfigError, DeadlineExceeded, Overloaded, PageOverBudget, TooLarge
from serve_app.flow.page_geometry import PageGeometry
from serve_app.flow.pdf_worker import (
    PoolBusy, WorkerCannotStart, WorkerDied, WorkerError, WorkerPool, WorkerTimeout, shared_pool,
)
from serve_app.core.results import CharBox, TextLine

PDF_MAGIC = b"%PDF-"
# PDF readers accept a header anywhere in the first 1024 bytes (PDF 1.7,
# implementation note 13); so does PDFium.
HEADER_WINDOW = 1024


def is_pdf(data: Any) -> bool:
    """Whether `data` (bytes, or a path) is a PDF, by its magic bytes."""
    if isinstance(data, (str, Path)):
        try:
            with open(data, "rb") as f:
                head = f.read(HEADER_WINDOW)
        except OSError:
            return False
        return PDF_MAGIC in head
    if isinstance(data, (bytes, bytearray, memoryview)):
        return PDF_MAGIC in bytes(data[:HEADER_WINDOW])
    return False


def page_geometry(width_pt: float, height_pt: float, dpi: int, max_pixels: int,
                  max_aspect: float = math.inf, page: int = 0) -> PageGeometry:
    """The render size of a page of width_pt x height_pt points: `dpi`,
    scaled down so that the page stays within max_pixels, counted in whole
    pixels (after rounding up: the bitmap's real size). A page whose size
    is a whole number of pixels at this DPI renders to exactly that size
    (float noise does not add a pixel). A page over max_aspect (long side
    over short side) is a BadRequest naming it (`page`, 1-based; 0: unnamed)."""
    name = f"page {page}" if page else "a PDF page"
    if not (width_pt > 0 and height_pt > 0 and math.isfinite(width_pt * height_pt)):
        raise BadRequest(f"{name} has no area ({width_pt} x {height_pt} points)")
    if max(width_pt, height_pt) / min(width_pt, height_pt) > max_aspect:
        raise BadRequest(f"{name} is {width_pt:g} x {height_pt:g} points, over {max_aspect:g} times as long as "
                         f"it is wide (engine.documents.max_page_aspect): not a page that can be read")
    scale = dpi / 72.0
    w, h = max(1, _whole(width_pt * scale)), max(1, _whole(height_pt * scale))
    for _ in range(64):  # on whole pixels: a 1e9 x 1e-8 pt page is 2e9 x 1 px, not 40
        if w * h <= max_pixels:
            break
        scale *= math.sqrt(max_pixels / (w * h))
        w, h = max(1, _down(width_pt * scale)), max(1, _down(height_pt * scale))
        if w * h > max_pixels:
            scale *= 1 - 1e-7
    else:
        w, h = (min(w, max_pixels // h), h) if w >= h else (w, min(h, max_pixels // w))
    return PageGeometry(scale, w, h)


def _whole(x: float) -> int:
    """Pixels covering x: ceil, but a size within float noise of a whole
    number is that number (PDFium keeps page sizes as float32: a page of
    430 px at 200 DPI is 154.8 pt, read back as 154.80000305)."""
    return round(x) if abs(x - round(x)) < 1e-3 else math.ceil(x)


def _down(x: float) -> int:
    """Whole pixels within x: floor, but a size within float noise of a
    whole number is that number."""
    return round(x) if abs(x - round(x)) < 1e-6 else math.floor(x)


class PdfFile:
    """An open PDF: its bytes here, PDFium's work in the worker pool
    (serve_app.flow.pdf_worker). Thread-safe; close() it when done. Each page
    call has a budget: `budget_s`, else limits.page_timeout_s; past it the
    child is killed and the call raises PageOverBudget naming the page (or
    DeadlineExceeded when the budget was the request's own time left:
    pass `deadline`, a time.time())."""

    kind = "pdf"

    def __init__(self, data: bytes, limits: DocumentLimits, max_pixels: Optional[int] = None,
                 pool: Optional[WorkerPool] = None, deadline: Optional[float] = None):
        self.limits = limits
        self.max_pixels = min(limits.max_page_pixels, max_pixels or limits.max_page_pixels)
        self.pool = pool or shared_pool(limits.workers, limits.worker_memory_mb)
        self.deadline = deadline
        self.key = uuid.uuid4().hex
        if len(data) == 0:
            raise BadRequest("the PDF is empty (0 bytes)")
        self._data: Optional[bytes] = bytes(data)
        header, _ = self._call("open", {}, None, limits.open_timeout_s)
        self.pages = int(header["pages"])
        self._first = header.get("first")
        if self.pages == 0:
            self.close()
            raise BadRequest("the PDF has no pages")
        if self.pages > limits.max_pages:
            self.close()
            raise TooLarge(f"the PDF has {self.pages} pages, over the limit of {limits.max_pages}; "
                           f"split it, or raise engine.documents.max_pages")

    def _budget(self, budget_s: Optional[float]) -> tuple[float, bool]:
        """(seconds, whether the request's deadline is what bounds them)."""
        budget = budget_s if budget_s is not None else self.limits.page_timeout_s
        if self.deadline is not None:
            left = self.deadline - time.time()
            if left <= 0:
                raise DeadlineExceeded("the request's deadline passed before its PDF was read")
            if left < budget:
                return left, True
        return budget, False

    def _call(self, op: str, args: dict, index: Optional[int], budget_s: Optional[float] = None):
        if self._data is None:
            raise BadRequest("the PDF was closed")  # a page read cancelled while its document closed
        budget, by_deadline = self._budget(budget_s)
        what = "the PDF" if index is None else f"page {index + 1}"
        try:
            # A free child is waited for up to another call's budget and a child's start (the
            # child a slow page held is killed and started again), within the deadline.
            wait = budget if by_deadline else 2 * budget
            return self.pool.call(op, self.key, self._data, args, budget, wait_s=wait,
                                  share=self.limits.worker_share or max(1, self.pool.workers // 2))
        except WorkerTimeout:
            if by_deadline:
                raise DeadlineExceeded(f"the request's deadline passed while reading {what} of its PDF") from None
            raise PageOverBudget(f"{what} took over {budget:g} s (engine.documents."
                                 f"{'open' if index is None else 'page'}_timeout_s) and was stopped; "
                                 f"simplify it, or send the page as an image") from None
        except WorkerCannotStart as e:
            raise ConfigError(str(e)) from None
        except PoolBusy:
            if by_deadline:
                raise DeadlineExceeded(f"the request's deadline passed waiting to read {what} of its PDF") from None
            raise Overloaded("every PDF worker here is busy; retry shortly", retry_after_s=1) from None
        except WorkerDied:
            if index is None:
                raise BadRequest("the PDF engine stopped while opening the PDF; it is broken, or needs more "
                                 "memory than a PDF worker has") from None
            raise PageOverBudget(f"the PDF engine stopped while reading {what}: the page needs more memory than "
                                 f"a PDF worker has (engine.documents.worker_memory_mb = "
                                 f"{self.limits.worker_memory_mb}), or is broken") from None
        except WorkerError as e:
            if e.kind == "encrypted":
                raise BadRequest("the PDF is encrypted with a password; send it decrypted "
                                 "(for example `qpdf --decrypt --password=... in.pdf out.pdf`)") from None
            if e.kind == "bad_pdf":
                raise BadRequest(f"not a readable PDF ({e.message}); send a complete, unencrypted PDF") from None
            if e.kind == "memory":
                raise PageOverBudget(f"{what} needs more memory than a PDF worker has "
                                     f"(engine.documents.worker_memory_mb = {self.limits.worker_memory_mb})") from None
            if e.kind == "text_too_long":
                raise TooLarge(f"{what}'s text layer has {e.extra.get('chars')} characters, over the limit of "
                               f"{self.limits.max_page_chars} (engine.documents.max_page_chars)") from None
            raise BadRequest(e.message) from None

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.pages:
            raise BadRequest(f"page {index + 1} is not in this PDF of {self.pages} pages")

    def geometry(self, index: int, budget_s: Optional[float] = None) -> PageGeometry:
        self._check_index(index)
        if index == 0 and self._first is not None:
            w, h = self._first
        else:
            header, _ = self._call("size", {"index": index}, index, budget_s)
            w, h = header["size"]
        return page_geometry(w, h, self.limits.render_dpi, self.max_pixels, self.limits.max_page_aspect, index + 1)

    def page_sizes(self, budget_s: Optional[float] = None) -> list[tuple[int, int]]:
        """Every page's (width, height) in pixels as it would be rendered
        (PDFium's page sizes, no page loaded): a page without area or too
        long is its BadRequest here, a page that cannot be found too."""
        header, _ = self._call("sizes", {}, None, budget_s)
        out = []
        for i, (w, h) in enumerate(header["sizes"]):
            g = page_geometry(w, h, self.limits.render_dpi, self.max_pixels, self.limits.max_page_aspect, i + 1)
            out.append((g.width, g.height))
        return out

    def render(self, index: int, budget_s: Optional[float] = None) -> np.ndarray:
        """Page `index` (0-based) as a BGR uint8 array at its geometry."""
        geo = self.geometry(index, budget_s)
        header, body = self._call("render", {"index": index, "width": geo.width, "height": geo.height}, index,
                                  budget_s)
        h, w, c = header["shape"]
        if (h, w) != (geo.height, geo.width) or len(body) != h * w * c:
            raise BadRequest(f"page {index + 1} did not render to its size")
        return np.frombuffer(body, dtype=np.uint8).reshape(h, w, c)

    def text_lines(self, index: int, return_chars: bool = False,
                   budget_s: Optional[float] = None) -> Optional[tuple[PageGeometry, tuple[TextLine, ...]]]:
        """Page `index`'s text layer as lines (in the page's content order),
        boxes in the pixels of its rendering; None when the page has no
        text layer (a scan, or only whitespace). A page of more than
        limits.max_page_chars characters is a TooLarge naming it."""
        geo = self.geometry(index, budget_s)
        header, _ = self._call("text", {"index": index, "width": geo.width, "height": geo.height,
                                        "chars": return_chars, "max_chars": self.limits.max_page_chars},
                               index, budget_s)
        lines = []
        for text, box, chars in header["lines"]:
            cb = tuple(CharBox(ch, q) for ch, q in chars) if chars is not None else None
            lines.append(TextLine(text, 1.0, box, cb))
        return (geo, tuple(lines)) if lines else None

    async def run(self, method, *args, **kwargs):
        """`await pdf.run(pdf.render, 3)`: a call on the pool's own threads
        (waiting for a child never holds a thread of the default executor)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool.executor, functools.partial(method, *args, **kwargs))

    def close(self) -> None:
        """Done with it: a page call of it still waiting for a child, or
        running in one, is stopped (a document given up after pages over
        their budget)."""
        if self._data is not None:
            self.pool.forget(self.key)
        self._data = None

    def __enter__(self) -> "PdfFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- documents: every multi-page container ----------------------------------------
# A PDF, or a TIFF of more than one page (serve_app.flow.tiff_pages). Both are
# page sources with the same interface (pages, kind, geometry, render,
# text_lines, run, close), read by the pipeline's one document path.


def is_document(data: Any) -> bool:
    """Whether `data` (bytes, or a path) is read as a document: a PDF, or a
    TIFF of two pages or more (a one-page TIFF is an image)."""
    from serve_app.flow.tiff_pages import TIFF_MAGICS, is_multipage_tiff

    if is_pdf(data):
        return True
    if isinstance(data, (str, Path)):
        try:
            with open(data, "rb") as f:
                if f.read(4) not in TIFF_MAGICS:
                    return False
                f.seek(0)
                data = f.read()
        except OSError:
            return False
    return is_multipage_tiff(data)


def open_document(data: bytes, limits: DocumentLimits, max_pixels: Optional[int] = None,
                  exif_transpose: bool = True, deadline: Optional[float] = None):
    """The page source of a document's bytes: a PdfFile (PDFium's work in
    the worker pool) or a TiffPages."""
    if is_pdf(data):
        return PdfFile(data, limits, max_pixels, deadline=deadline)
    from serve_app.flow.tiff_pages import TiffPages

    return TiffPages(data, limits, max_pixels, exif_transpose, deadline=deadline)


async def open_pdf(data: bytes, limits: DocumentLimits, max_pixels: Optional[int] = None,
                   deadline: Optional[float] = None) -> PdfFile:
    """PdfFile(...) opened on the worker pool's own threads."""
    pool = shared_pool(limits.workers, limits.worker_memory_mb)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(pool.executor, functools.partial(
        PdfFile, data, limits, max_pixels, pool, deadline))


async def open_document_async(data: bytes, limits: DocumentLimits, max_pixels: Optional[int] = None,
                              exif_transpose: bool = True, deadline: Optional[float] = None):
    """open_document off the event loop (a PDF on the worker pool's threads)."""
    if is_pdf(data):
        return await open_pdf(data, limits, max_pixels, deadline)
    return await asyncio.to_thread(open_document, data, limits, max_pixels, exif_transpose, deadline)


def check_document(data: bytes, limits: DocumentLimits) -> int:
    """A document's page count, after the checks reading it would make; no
    page is rendered."""
    with open_document(data, limits) as doc:
        if doc.kind == "tiff":
            doc.geometry(0)  # its first page's pixel count, from its directory
        return doc.pages


def check_pdf(data: bytes, limits: DocumentLimits) -> int:
    """Its page count, after the checks reading it would make (encrypted,
    broken: BadRequest; too many pages: TooLarge); no page is rendered."""
    with PdfFile(data, limits) as pdf:
        return pdf.pages


