"""PDF input: open a PDF (refusing encrypted, broken and over-long ones),
render a page to a BGR array at the configured DPI, or read a page's text
layer as lines. No Ray import: unit-tested on PDFs made in the tests.

Rendered with pypdfium2 (PyPI; Apache-2.0 / BSD-3-Clause): its wheels bundle
PDFium, the PDF engine of Chromium, so there is no system dependency, it is
well kept (releases follow PDFium's), and it is fast: a peer photo's page
renders in 1-11 ms here. PDFium is not thread-safe, not even across
documents: every call into it here holds one process-wide lock."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .config import DocumentLimits
from .errors import BadRequest, TooLarge
from .results import CharBox, TextLine

PDF_MAGIC = b"%PDF-"
# PDF readers accept a header anywhere in the first 1024 bytes (PDF 1.7,
# implementation note 13); so does PDFium.
HEADER_WINDOW = 1024

_PDFIUM = threading.Lock()


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


@dataclass(frozen=True)
class PageGeometry:
    scale: float  # pixels per PDF point
    width: int  # pixels
    height: int


def page_geometry(width_pt: float, height_pt: float, dpi: int, max_pixels: int) -> PageGeometry:
    """The render size of a page of width_pt x height_pt points: `dpi`,
    scaled down so that the page stays within max_pixels. A page whose size
    is a whole number of pixels at this DPI renders to exactly that size
    (the scale is nudged down by 1e-9 so that float noise cannot make the
    renderer's ceil() add a pixel)."""
    if not (width_pt > 0 and height_pt > 0 and math.isfinite(width_pt * height_pt)):
        raise BadRequest(f"a PDF page has no area ({width_pt} x {height_pt} points)")
    scale = dpi / 72.0
    if width_pt * height_pt * scale * scale > max_pixels:
        scale = math.sqrt(max_pixels / (width_pt * height_pt))
        w, h = math.floor(width_pt * scale), math.floor(height_pt * scale)
    else:
        w, h = _whole(width_pt * scale), _whole(height_pt * scale)
    return PageGeometry(scale, max(1, w), max(1, h))


def _whole(x: float) -> int:
    """Pixels covering x: ceil, but a size within float noise of a whole
    number is that number (PDFium keeps page sizes as float32: a page of
    430 px at 200 DPI is 154.8 pt, read back as 154.80000305)."""
    return round(x) if abs(x - round(x)) < 1e-3 else math.ceil(x)


class PdfFile:
    """An open PDF. Thread-safe (every call holds the PDFium lock); close()
    it when done."""

    kind = "pdf"

    def __init__(self, data: bytes, limits: DocumentLimits, max_pixels: Optional[int] = None):
        import pypdfium2 as pdfium

        self._pdfium = pdfium
        self.limits = limits
        self.max_pixels = min(limits.max_page_pixels, max_pixels or limits.max_page_pixels)
        if len(data) == 0:
            raise BadRequest("the PDF is empty (0 bytes)")
        with _PDFIUM:
            try:
                self._pdf = pdfium.PdfDocument(bytes(data))
            except pdfium.PdfiumError as e:
                if getattr(e, "err_code", None) == pdfium.raw.FPDF_ERR_PASSWORD:
                    raise BadRequest("the PDF is encrypted with a password; send it decrypted "
                                     "(for example `qpdf --decrypt --password=... in.pdf out.pdf`)") from None
                raise BadRequest(f"not a readable PDF ({e}); send a complete, unencrypted PDF") from None
            self.pages = len(self._pdf)
        if self.pages == 0:
            self.close()
            raise BadRequest("the PDF has no pages")
        if self.pages > limits.max_pages:
            self.close()
            raise TooLarge(f"the PDF has {self.pages} pages, over the limit of {limits.max_pages}; "
                           f"split it, or raise engine.documents.max_pages")

    def geometry(self, index: int) -> PageGeometry:
        with _PDFIUM:
            page = self._page(index)
            try:
                w, h = page.get_size()
            finally:
                page.close()
        return page_geometry(w, h, self.limits.render_dpi, self.max_pixels)

    def render(self, index: int) -> np.ndarray:
        """Page `index` (0-based) as a BGR uint8 array at its geometry."""
        geo = self.geometry(index)
        pdfium = self._pdfium
        with _PDFIUM:
            page = self._page(index)
            try:
                # Rendered into a bitmap of exactly the geometry's size
                # (pypdfium2's render() would take the ceil of float32 noise).
                bitmap = pdfium.PdfBitmap.new_native(geo.width, geo.height, pdfium.raw.FPDFBitmap_BGR)
                try:
                    bitmap.fill_rect((255, 255, 255, 255), 0, 0, geo.width, geo.height)
                    pdfium.raw.FPDF_RenderPageBitmap(bitmap, page, 0, 0, geo.width, geo.height, 0,
                                                     pdfium.raw.FPDF_ANNOT)
                    arr = np.array(bitmap.to_numpy(), copy=True)  # the bitmap's buffer goes with it
                finally:
                    bitmap.close()
            finally:
                page.close()
        if arr.ndim == 2:
            arr = np.repeat(arr[..., None], 3, axis=2)
        return np.ascontiguousarray(arr[..., :3])  # BGR (PDFium's own order), without its padding byte

    def text_lines(self, index: int, return_chars: bool = False) -> Optional[tuple[PageGeometry, tuple[TextLine, ...]]]:
        """Page `index`'s text layer as lines (in the page's content order),
        boxes in the pixels of its rendering; None when the page has no
        text layer (a scan, or only whitespace)."""
        geo = self.geometry(index)
        pdfium = self._pdfium
        with _PDFIUM:
            page = self._page(index)
            try:
                textpage = page.get_textpage()
                try:
                    chars = list(_page_chars(pdfium, textpage))
                finally:
                    textpage.close()
                conv = pdfium.PdfPosConv(page, (0, 0, geo.width, geo.height, 0))
                lines = tuple(_line(run, conv, return_chars) for run in _runs(chars))
            finally:
                page.close()
        lines = tuple(line for line in lines if line.text)
        return (geo, lines) if lines else None

    def close(self) -> None:
        with _PDFIUM:
            pdf, self._pdf = getattr(self, "_pdf", None), None
            if pdf is not None:
                pdf.close()

    def _page(self, index: int):
        if self._pdf is None:
            raise BadRequest("the PDF was closed")  # a page read cancelled while its document closed
        if not 0 <= index < self.pages:
            raise BadRequest(f"page {index + 1} is not in this PDF of {self.pages} pages")
        return self._pdf[index]

    def __enter__(self) -> "PdfFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- documents: every multi-page container ----------------------------------------
# A PDF, or a TIFF of more than one page (serve_app.tiff_pages). Both are
# page sources with the same interface (pages, kind, geometry, render,
# text_lines, close), read by the pipeline's one document path.


def is_document(data: Any) -> bool:
    """Whether `data` (bytes, or a path) is read as a document: a PDF, or a
    TIFF of two pages or more (a one-page TIFF is an image)."""
    from .tiff_pages import TIFF_MAGICS, is_multipage_tiff

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
                  exif_transpose: bool = True):
    """The page source of a document's bytes: a PdfFile or a TiffPages."""
    if is_pdf(data):
        return PdfFile(data, limits, max_pixels)
    from .tiff_pages import TiffPages

    return TiffPages(data, limits, max_pixels, exif_transpose)


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


# -- the text layer -> lines ----------------------------------------------------

Char = tuple[str, Optional[tuple[float, float, float, float]]]  # text, (left, bottom, right, top) in points


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


def _runs(chars: list[Char]) -> list[list[Char]]:
    """Characters split into lines: at a line break, or where a character's
    vertical centre leaves the current line's height."""
    runs: list[list[Char]] = []
    cur: list[Char] = []
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


def _quad(conv, box: tuple[float, float, float, float]) -> list[list[float]]:
    """A box in points -> its axis-aligned pixel box, clockwise from top-left."""
    l, b, r, t = box
    pts = [conv.to_bitmap(x, y) for x, y in ((l, t), (r, t), (r, b), (l, b))]
    xs = [float(p[0]) for p in pts]
    ys = [float(p[1]) for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def _line(run: list[Char], conv, return_chars: bool) -> TextLine:
    boxes = [b for _, b in run if b is not None]
    text = "".join(ch for ch, _ in run).strip()
    if not boxes:
        return TextLine("", 1.0, [])
    union = (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))
    chars = tuple(CharBox(ch, _quad(conv, b)) for ch, b in run if b is not None) if return_chars else None
    return TextLine(text, 1.0, _quad(conv, union), chars)
