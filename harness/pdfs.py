"""PDFs made in code for the tests and load_tests/bench_pdf.py: pages from
images (lossless, sized so that a page renders back to the image's own
pixels at a given DPI), pages with a text layer, blank pages, and a PDF
encrypted with a user password (the standard security handler, RC4 40-bit,
written here: no PDF library can encrypt without a new dependency)."""

from __future__ import annotations

import hashlib
import io
from typing import Iterable, Optional, Sequence

import cv2
import numpy as np
from PIL import Image


def image_pdf(images: Iterable[np.ndarray], dpi: int = 144, jpeg_quality: int = 0) -> bytes:
    """One page per BGR image, the image stored losslessly and the page
    sized so that rendering at `dpi` gives the image's own pixel size (and
    its own pixels, where the page size in points is exact in float32, as
    at 72, 144 or 288 DPI: PDFium resamples an image whose size is off by
    float noise). jpeg_quality > 0 stores each page as a JPEG of that
    quality instead, as a scanner would (smaller; PDFium decodes it)."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument.new()
    for bgr in images:
        h, w = bgr.shape[:2]
        wp, hp = w * 72.0 / dpi, h * 72.0 / dpi
        page = pdf.new_page(wp, hp)
        obj = pdfium.PdfImage.new(pdf)
        if jpeg_quality:
            ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
            obj.load_jpeg(io.BytesIO(buf.tobytes()), inline=True)
        else:
            obj.set_bitmap(pdfium.PdfBitmap.from_pil(Image.fromarray(np.ascontiguousarray(bgr[..., ::-1]))))
        obj.set_matrix(pdfium.PdfMatrix().scale(wp, hp))
        page.insert_obj(obj)
        page.gen_content()
        page.close()
    buf = io.BytesIO()
    pdf.save(buf)
    pdf.close()
    return buf.getvalue()


def blank_pdf(pages: int, size_pt: tuple[float, float] = (200, 100)) -> bytes:
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument.new()
    for _ in range(pages):
        pdf.new_page(*size_pt).close()
    buf = io.BytesIO()
    pdf.save(buf)
    pdf.close()
    return buf.getvalue()


def sized_pdf(sizes_pt: Sequence[tuple[float, float]]) -> bytes:
    """Blank pages, each of its own size in points (a sliver first page, then full pages, say)."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument.new()
    for w, h in sizes_pt:
        pdf.new_page(w, h).close()
    buf = io.BytesIO()
    pdf.save(buf)
    pdf.close()
    return buf.getvalue()


def _pdf(objects: Sequence[bytes], trailer_extra: bytes = b"") -> bytes:
    """A PDF file of these objects (numbered from 1; 1 is the catalog) with a correct xref."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R %s>>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, trailer_extra, xref)
    return bytes(out)


def _escape(text: str) -> bytes:
    return text.encode("latin-1").replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")


def text_pdf(pages: Sequence[Sequence[str]], size_pt: tuple[int, int] = (300, 200), font_pt: int = 20) -> bytes:
    """Pages whose lines are real text (Helvetica), each line at
    x = 20 pt, the first at 40 pt from the top, then every 1.8 x font_pt."""
    n = len(pages)
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>",
                            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
                                b" ".join(b"%d 0 R" % (4 + 2 * k) for k in range(n)), n),
                            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for lines in pages:
        page_no = len(objects) + 1
        ops = b"BT /F1 %d Tf 20 %d Td" % (font_pt, size_pt[1] - 40)
        for k, t in enumerate(lines):
            ops += (b" 0 %d Td" % -int(font_pt * 1.8) if k else b"") + b" (" + _escape(t) + b") Tj"
        ops += b" ET"
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] /Resources << /Font << /F1 3 0 R >> >> "
                       b"/Contents %d 0 R >>" % (size_pt[0], size_pt[1], page_no + 1))
        objects.append(b"<< /Length %d >>\nstream\n" % len(ops) + ops + b"\nendstream")
    return _pdf(objects)


def report_pdf(title: str, paragraph: Sequence[str], rows: Sequence[Sequence[str]]) -> bytes:
    """A born-digital report page (A4, real text in Helvetica): a title in
    22 pt bold, a paragraph in 11 pt, and a ruled table (0.8 pt rules) of
    `rows`, its first row the header in bold."""
    w, h = 595, 842
    ops = [b"BT /F2 22 Tf 60 760 Td (%s) Tj ET" % _escape(title)]
    ops += [b"BT /F1 11 Tf 60 %d Td (%s) Tj ET" % (720 - 16 * k, _escape(t)) for k, t in enumerate(paragraph)]
    x0, top, cw, rh = 60, 640, 118, 26
    for r, row in enumerate(rows):
        for c, t in enumerate(row):
            font = b"/F2" if r == 0 else b"/F1"
            ops.append(b"BT %s 11 Tf %d %d Td (%s) Tj ET" % (font, x0 + c * cw + 8, top - r * rh - 18, _escape(t)))
    x1, bottom = x0 + len(rows[0]) * cw, top - len(rows) * rh
    ops.append(b"0.8 w")
    ops += [b"%d %d m %d %d l S" % (x0, top - r * rh, x1, top - r * rh) for r in range(len(rows) + 1)]
    ops += [b"%d %d m %d %d l S" % (x0 + c * cw, top, x0 + c * cw, bottom) for c in range(len(rows[0]) + 1)]
    content = b"\n".join(ops)
    return _pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>",
                 b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
                 b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] /Resources << /Font << /F1 3 0 R /F2 6 0 R >> "
                 b">> /Contents 5 0 R >>" % (w, h),
                 b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
                 b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica-Bold >>"])


# -- encryption: PDF 1.7 (ISO 32000-1) 7.6.3, algorithms 2, 3 and 4, revision 2 ------

_PAD = bytes.fromhex("28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A")


def _rc4(key: bytes, data: bytes) -> bytes:
    s = list(range(256))
    j = 0
    for i in range(256):
        j = (j + s[i] + key[i % len(key)]) % 256
        s[i], s[j] = s[j], s[i]
    out = bytearray()
    i = j = 0
    for byte in data:
        i = (i + 1) % 256
        j = (j + s[i]) % 256
        s[i], s[j] = s[j], s[i]
        out.append(byte ^ s[(s[i] + s[j]) % 256])
    return bytes(out)


def _padded(password: str) -> bytes:
    return (password.encode("latin-1") + _PAD)[:32]


def encrypted_pdf(user_password: str = "secret", owner_password: str = "owner", text: str = "Secret text") -> bytes:
    """A one-page text PDF that opens only with `user_password`."""
    file_id = hashlib.md5(b"ocr-test-file").digest()
    permissions = -4
    o_key = hashlib.md5(_padded(owner_password)).digest()[:5]
    o_entry = _rc4(o_key, _padded(user_password))
    key = hashlib.md5(_padded(user_password) + o_entry + permissions.to_bytes(4, "little", signed=True)
                      + file_id).digest()[:5]
    u_entry = _rc4(key, _PAD)

    def obj_key(num: int) -> bytes:
        return hashlib.md5(key + num.to_bytes(3, "little") + (0).to_bytes(2, "little")).digest()[:10]

    ops = b"BT /F1 20 Tf 20 150 Td (" + _escape(text) + b") Tj ET"
    content = _rc4(obj_key(5), ops)
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Resources << /Font << /F1 4 0 R >> >> "
               b"/Contents 5 0 R >>",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
               b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
               b"<< /Filter /Standard /V 1 /R 2 /O <%s> /U <%s> /P %d >>" % (
                   o_entry.hex().encode(), u_entry.hex().encode(), permissions)]
    return _pdf(objects, b"/Encrypt 6 0 R /ID [<%s> <%s>] " % (file_id.hex().encode(), file_id.hex().encode()))


# -- hostile PDFs (issue 24): tiny files that cost much to read ----------------------


def nested_forms_pdf(depth: int = 7, fan: int = 10, pages: int = 1, slow: Optional[set[int]] = None) -> bytes:
    """Pages that draw form XObject X{depth}, each X{k} drawing X{k-1} `fan`
    times, X0 a filled rectangle: fan ** depth fills from a few hundred
    bytes (renders for minutes at depth 7). `slow`: the pages (0-based)
    that draw it (default all); the others are blank."""
    n_forms = depth + 1
    first_form = 3 + pages  # objects: 1 catalog, 2 pages, 3.. page objects, then forms, then the page content
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>",
                            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
                                b" ".join(b"%d 0 R" % (3 + k) for k in range(pages)), pages)]
    content_no = first_form + n_forms
    top = first_form + depth
    for k in range(pages):
        if slow is None or k in slow:
            objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 300] /Resources << /XObject << /X %d 0 R "
                           b">> >> /Contents %d 0 R >>" % (top, content_no))
        else:
            objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 300] >>")
    for k in range(n_forms):
        if k == 0:
            ops = b"0.5 g 10 10 280 280 re f"
            res = b""
        else:
            ops = b" ".join([b"q 0.99 0 0 0.99 1 1 cm /X Do Q"] * fan)
            res = b"/Resources << /XObject << /X %d 0 R >> >>" % (first_form + k - 1)
        objects.append(b"<< /Type /XObject /Subtype /Form /BBox [0 0 300 300] %s /Length %d >>\nstream\n"
                       % (res, len(ops)) + ops + b"\nendstream")
    ops = b"/X Do"
    objects.append(b"<< /Length %d >>\nstream\n" % len(ops) + ops + b"\nendstream")
    return _pdf(objects)


def shared_text_pdf(pages: int = 100, chars: int = 200_000) -> bytes:
    """`pages` pages whose /Contents is one shared, compressed stream
    showing `chars` characters: ~100 KB (or less) that a text-layer read
    would turn into pages x chars characters of JSON."""
    import zlib

    line = b"(" + b"A" * 100 + b") Tj 0 -1 Td "
    ops = b"BT /F1 1 Tf 10 290 Td " + line * (chars // 100) + b"ET"
    packed = zlib.compress(ops, 9)
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>",
                            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
                                b" ".join(b"%d 0 R" % (5 + k) for k in range(pages)), pages),
                            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
                            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + packed + b"\nendstream"]
    for _ in range(pages):
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 300] /Resources << /Font << /F1 3 0 R >> >> "
                       b"/Contents 4 0 R >>")
    return _pdf(objects)


def mediabox_pdf(box: tuple[float, float, float, float]) -> bytes:
    """One empty page with this MediaBox (an extreme one asks for a huge bitmap)."""
    mb = " ".join(repr(float(v)) for v in box).encode()
    return _pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                 b"<< /Type /Page /Parent 2 0 R /MediaBox [" + mb + b"] >>"])


def lying_count_pdf(count: int = 1000) -> bytes:
    """One real page, a page tree whose /Count says `count`."""
    return _pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count %d >>" % count,
                 b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 100] >>"])
