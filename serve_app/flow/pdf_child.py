"""The PDF worker's child process (`python -m serve_app.flow.pdf_child
MEMORY_MB`, started by serve_app/flow/pdf_worker.py's pool): PDFium in its
own address space, limited (RLIMIT_AS) to what it had after start-up plus
MEMORY_MB; it answers one framed request at a time (open a document, a
page's size, render, text layer; a multi-page TIFF's page decoded) with a
JSON header and raw bytes, and dies with its parent. No Ray import."""

from __future__ import annotations

import os
import sys
from typing import Optional

from serve_app.flow.pdf_worker import _read_frame_blocking, _write_frame


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
        from PIL import Image, ImageOps, TiffImagePlugin  # noqa: F401  (a TIFF's pages: _Tiff)

        self.pdfium = pdfium
        self.key: Optional[str] = None
        self.doc = None

    def handle(self, req: dict, payload: bytes) -> tuple[dict, bytes]:
        pdfium = self.pdfium
        if req.get("has_data"):
            if self.doc is not None:
                self.doc.close()
                self.doc, self.key = None, None
            if payload[:4] in _TIFF_MAGICS:  # a multi-page TIFF's pages are decoded here too
                try:
                    self.doc = _Tiff(payload)
                except Exception as e:  # noqa: BLE001
                    return {"error": "bad_tiff", "message": f"{type(e).__name__}"}, b""
                self.key = req["key"]
                return self.doc.handle(req)
            try:
                self.doc = pdfium.PdfDocument(payload)
            except pdfium.PdfiumError as e:
                if getattr(e, "err_code", None) == pdfium.raw.FPDF_ERR_PASSWORD:
                    return {"error": "encrypted", "message": "encrypted"}, b""
                return {"error": "bad_pdf", "message": str(e)}, b""
            self.key = req["key"]
        elif self.key != req["key"] or self.doc is None:
            return {"error": "bad_pdf", "message": "document not held"}, b""
        if isinstance(self.doc, _Tiff):
            return self.doc.handle(req)
        op = req["op"]
        if op == "open":
            n = len(self.doc)
            first = self._size(0) if n else None
            if n > 1:
                # The page count prices the request at the door: a /Count that
                # lies (or a broken page tree) is a 400 here, before it is priced.
                # The last page's size is read from its dictionary, not loaded.
                self._size(n - 1)
            return {"pages": n, "first": first}, b""
        if op == "sizes":  # every page's size (for its price), none loaded
            return {"sizes": [self._size(i) for i in range(len(self.doc))]}, b""
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


_TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


class _Tiff:
    """A TIFF held open: its pages decoded one at a time, each within the
    parent's budget (a tile-heavy page decodes for most of a second)."""

    def __init__(self, data: bytes):
        import io

        from PIL import Image

        Image.MAX_IMAGE_PIXELS = None  # the parent checked each page's size from its directory
        self.img = Image.open(io.BytesIO(data), formats=("TIFF",))

    def handle(self, req: dict) -> tuple[dict, bytes]:
        if req["op"] != "render":
            return {"error": "bad_tiff", "message": f"op {req['op']!r} is not for a TIFF"}, b""
        import warnings

        from PIL import ImageOps

        index = int(req["index"])
        try:
            self.img.seek(index)
        except Exception as e:  # noqa: BLE001
            raise _PageError(index, f"page {index + 1} of the TIFF cannot be read ({type(e).__name__})") from None
        w, h = self.img.size
        if w * h > int(req["max_pixels"]):
            raise _PageError(index, f"page {index + 1} of the TIFF is {w}x{h} pixels, over the limit")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.img.load()
                page = ImageOps.exif_transpose(self.img) if req.get("exif") else self.img.copy()
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001
            raise _PageError(index, f"page {index + 1} of the TIFF is corrupt or truncated "
                                    f"({type(e).__name__})") from None
        # Modes whose meaning is not in their bytes alone (a palette, ink)
        # become RGB(A) here, as serve_app.ocr.decode.to_bgr would make them.
        if page.mode == "P":
            page = page.convert("RGBA" if "transparency" in page.info else "RGB")
        elif page.mode in ("CMYK", "YCbCr", "LAB", "HSV"):
            page = page.convert("RGB")
        elif page.mode == "PA":
            page = page.convert("RGBA")
        return {"mode": page.mode, "size": list(page.size)}, page.tobytes()

    def close(self) -> None:
        self.img.close()


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
    try:
        server = _Server()
    except (MemoryError, ImportError, OSError) as e:  # a low address-space limit inherited from the service
        said = [line for line in str(e).splitlines() if line.strip()]  # numpy's is a page: its last line
        _write_frame(out, {"ready": False, "message": f"its start-up failed ({type(e).__name__}: "
                                                      f"{said[-1].strip() if said else ''}) with "
                                                      f"{_vm_bytes() >> 20} MB of address space"})
        return
    if memory_mb > 0:
        import resource

        limit = _vm_bytes() + memory_mb * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)  # a limit over the inherited hard one cannot be set (it was a crash)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _write_frame(out, {"ready": True})  # started: what follows is timed per call by the parent
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
