"""The cheapest, costliest requests a stranger can send (issue 24), each with
what the service answers: the cases the hostile-costs test sends and the
soak's hostile share (`python -m load_tests soak --hostile`) sends in turn."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

from harness.pdfs import blank_pdf, lying_count_pdf, mediabox_pdf, nested_forms_pdf, shared_text_pdf


def png_strip(w: int, h: int) -> bytes:
    """A white w x h greyscale PNG, as small as zlib makes it."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (w, h), 255).save(buf, "PNG", optimize=True)
    return buf.getvalue()


def long_png_40m() -> bytes:
    """A 1 x 40,000,000 px PNG (~39 KB): one row, written directly (Pillow
    would allocate the whole image first)."""
    w, h = 1, 40_000_000
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    raw = zlib.compress(b"\x00\xff" * h, 9)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def empty_chunks_png(mib: float) -> bytes:
    """A 1x1 PNG with `mib` MiB of empty private chunks before its image data."""
    real = png_strip(1, 1)
    c = struct.pack(">I", 0) + b"prVt" + struct.pack(">I", zlib.crc32(b"prVt"))
    return real[:33] + c * int(mib * 1024 * 1024 / len(c)) + real[33:]


def _png_chunk(kind: bytes, data: bytes = b"") -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def chunks_after_idat_png(mib: float) -> bytes:
    """A 1x1 PNG with `mib` MiB of empty private chunks after its image
    data (the bound on chunks before it did not count these)."""
    real = png_strip(1, 1)
    end = real.rindex(b"IEND") - 4
    return real[:end] + _png_chunk(b"prVt") * int(mib * 1024 * 1024 / 12) + real[end:]


def empty_idats_png(mib: float) -> bytes:
    """A 1x1 PNG whose image data is followed by `mib` MiB of empty IDAT chunks."""
    real = png_strip(1, 1)
    end = real.rindex(b"IEND") - 4
    return real[:end] + _png_chunk(b"IDAT") * int(mib * 1024 * 1024 / 12) + real[end:]


def gif_frames(n: int) -> bytes:
    """A 1x1 GIF of `n` frames (14 bytes each)."""
    head = b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return head + frame * n + b"\x3b"


def jpeg_comments(mib: float) -> bytes:
    """A small JPEG with `mib` MiB of empty comment segments after its start."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (64, 64), 255).save(buf, "JPEG")
    real = buf.getvalue()
    return real[:2] + b"\xff\xfe\x00\x02" * int(mib * 1024 * 1024 / 4) + real[2:]


@dataclass(frozen=True)
class Case:
    name: str  # what is sent, for the table
    make: Callable[[], bytes]
    ctype: str  # image/png, application/pdf, or application/json (then `options` go with it)
    status: int  # what the service answers
    code: str  # its error code
    options: Optional[dict] = None

    def request(self) -> tuple[bytes, str]:
        """(body, Content-Type) as sent."""
        data = self.make()
        if self.options is None:
            return data, self.ctype
        return json.dumps({"image": {"base64": base64.b64encode(data).decode()},
                           "options": self.options}).encode(), "application/json"


CASES = (
    Case("PDF page of nested form XObjects (10^7 fills)", lambda: nested_forms_pdf(depth=7), "application/pdf",
         413, "page_over_budget"),
    # 20 pages: under admission's one-request share (100 such pages are priced
    # at ~30 s, at the share's edge: a 503 naming the jobs API instead).
    Case("PDF text layer: 20 pages share one 200,000-character stream",
         lambda: shared_text_pdf(20, 200_000), "application/pdf", 413, "too_large", {"pdf_text_layer": True}),
    Case("PDF page with MediaBox 1e9 x 0.1 pt", lambda: mediabox_pdf((0, 0, 1e9, 0.1)), "application/pdf",
         400, "bad_request"),
    Case("PDF whose /Count says 100 pages, with 1", lambda: lying_count_pdf(100), "application/pdf",
         400, "bad_request"),
    Case("PNG of 1 x 300,000 px", lambda: png_strip(300_000, 1), "image/png", 400, "bad_image"),
    Case("PNG of 1 x 40,000,000 px", long_png_40m, "image/png", 400, "bad_image"),
    Case("PNG with 19 MiB of empty chunks", lambda: empty_chunks_png(19), "image/png", 400, "bad_image"),
    Case("blank PDF of 500 A4 pages", lambda: blank_pdf(500, (595, 842)), "application/pdf", 503, "overloaded"),
    Case("PNG with 19 MiB of empty chunks after its image data", lambda: chunks_after_idat_png(19), "image/png",
         400, "bad_image"),
    Case("PNG with 19 MiB of empty IDAT chunks", lambda: empty_idats_png(19), "image/png", 400, "bad_image"),
    Case("GIF of 1,000,000 one-pixel frames (14 MiB)", lambda: gif_frames(1_000_000), "image/gif", 400, "bad_image"),
    Case("JPEG with 19 MiB of empty comments", lambda: jpeg_comments(19), "image/jpeg", 400, "bad_image"),
)
