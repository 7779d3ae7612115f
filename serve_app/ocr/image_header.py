"""A cheap check of an encoded image at the door (job submits): its header
only, with the decoder's own rules (serve_app.ocr.decode), so that junk
is a 400 when it is sent rather than a failed job later. No Ray import."""

from __future__ import annotations

import io
import struct
from typing import Optional

from PIL import Image

from serve_app.core.engine_config import ImageLimits
from serve_app.core.errors import BadImage, TooLarge
from serve_app.ocr.decode import FORMATS, check_aspect, unreadable


def check_image_header(data: bytes, limits: ImageLimits) -> tuple[int, int]:
    """(width, height) from the header; BadImage or TooLarge as decoding
    would raise them. Reads the header only: no pixel is decoded."""
    if len(data) == 0:
        raise BadImage("image is empty (0 bytes)")
    limits.check_bytes(len(data))
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as img:
            w, h = img.size
    except Exception:  # UnidentifiedImageError, and many others on mangled headers
        raise unreadable(data) from None
    if w < 1 or h < 1:
        raise BadImage(f"image has no pixels ({w}x{h})")
    if w * h > limits.max_pixels:
        raise TooLarge(f"image is {w}x{h} = {w * h} pixels, over the limit of {limits.max_pixels}")
    check_aspect(w, h, limits)
    return w, h


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Chunks a PNG may have before its image data (IDAT): a real one has a few
# (IHDR, colour and text chunks); a file of a million empty chunks makes a
# decoder walk them one by one (a 20 MiB one: ~9 s of CPU in Pillow).
MAX_PNG_CHUNKS_BEFORE_IDAT = 256


def png_dimensions(data: bytes) -> Optional[tuple[int, int]]:
    """(width, height) of a PNG from its IHDR, after walking its chunk
    headers (not their contents) up to the first IDAT: BadImage when more
    than MAX_PNG_CHUNKS_BEFORE_IDAT come before it. None when `data` is not
    a PNG (by its signature)."""
    mv = memoryview(data)
    if bytes(mv[:8]) != PNG_MAGIC:
        return None
    if len(mv) < 33 or bytes(mv[12:16]) != b"IHDR":
        raise BadImage("not a readable PNG (no IHDR chunk first)")
    w, h = struct.unpack(">II", mv[16:24])
    pos, n = 8, 0
    while pos + 8 <= len(mv):
        (length,) = struct.unpack(">I", mv[pos:pos + 4])
        kind = bytes(mv[pos + 4:pos + 8])
        if kind == b"IDAT":
            return w, h
        n += 1
        if n > MAX_PNG_CHUNKS_BEFORE_IDAT:
            raise BadImage(f"the PNG has over {MAX_PNG_CHUNKS_BEFORE_IDAT} chunks before its image data; "
                           f"re-encode it (for example with `optipng` or any image editor)")
        pos += 12 + length
    return w, h  # no IDAT: the decoder refuses it
