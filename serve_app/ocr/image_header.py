"""A cheap check of an encoded image at the door (job submits): its header
only, with the decoder's own rules (serve_app.ocr.decode), so that junk
is a 400 when it is sent rather than a failed job later. No Ray import."""

from __future__ import annotations

import io
import re
import struct
from typing import Optional

from PIL import Image

from serve_app.core.engine_config import ImageLimits
from serve_app.core.errors import BadImage, TooLarge
from serve_app.ocr.image_formats import FORMATS, check_aspect, unreadable


def check_image_header(data: bytes, limits: ImageLimits) -> tuple[int, int]:
    """(width, height) from the header; BadImage or TooLarge as decoding
    would raise them. Reads the header and walks the structure
    (check_structure), as decoding does: no pixel is decoded."""
    if len(data) == 0:
        raise BadImage("image is empty (0 bytes)")
    limits.check_bytes(len(data))
    check_structure(data)
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
# A PNG's chunks other than image data: a real one has a few (IHDR, colour
# and text chunks, an animation's frame controls); a file of a million empty
# chunks makes a decoder walk them one by one (a 20 MiB one: ~9 s of CPU in
# Pillow), before its image data or after it.
MAX_PNG_CHUNKS_BEFORE_IDAT = 256
MAX_PNG_CHUNKS = 1024
# Image data chunks (IDAT, an animation's fdAT) are at least this many bytes
# on average (encoders write 8 KiB or more): zero-length ones are a flood.
MIN_DATA_CHUNK_BYTES = 1024
# Frames of an animation (GIF, APNG) at most: only the first is read, but
# counting them walks each (a GIF of 100,000 one-pixel frames: seconds).
MAX_FRAMES = 1000
# A GIF's data sub-blocks (at most 255 bytes each) average at least this many
# bytes: a flood of one-byte ones is walked one by one.
MIN_GIF_SUBBLOCK_BYTES = 64
# A JPEG's segments before its image data (APPn, COM, tables: a real one has
# a dozen), and its scans (a progressive JPEG has ~10; each makes the
# decoder pass over the whole image again).
MAX_JPEG_SEGMENTS = 256
MAX_JPEG_SCANS = 100


def png_dimensions(data: bytes) -> Optional[tuple[int, int]]:
    """(width, height) of a PNG from its IHDR, after walking its chunk
    headers (not their contents) up to the first IDAT: BadImage when more
    than MAX_PNG_CHUNKS_BEFORE_IDAT come before it. None when `data` is not
    a PNG (by its signature). (The price's quick look at a header;
    check_structure walks the whole file.)"""
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


def check_structure(data: bytes) -> int:
    """Walks an encoded image's structure the way its decoder would, each
    walk bounded (a PNG's chunks before and after its image data, a GIF's
    frames and sub-blocks, a JPEG's segments and scans): BadImage naming
    what is over its bound, before any decoder walks it one step at a time.
    Returns the frames it counted (1 for a still image, or a format not
    walked here). The same at the door, at a job's submit and at decode."""
    head = bytes(data[:8])
    if head == PNG_MAGIC:
        return _walk_png(data)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return _walk_gif(data)
    if head[:2] == b"\xff\xd8":
        return _walk_jpeg(data)
    return 1


_RE_ENCODE = "re-encode it (for example with any image editor, or `convert in out.png`)"


def _walk_png(data: bytes) -> int:
    png_dimensions(data)  # IHDR first, and the chunks before the image data
    mv = memoryview(data)
    pos, other, image_chunks, frames = 8, 0, 0, 0
    most_image_chunks = 16 + len(mv) // MIN_DATA_CHUNK_BYTES
    while pos + 8 <= len(mv):
        (length,) = struct.unpack(">I", mv[pos:pos + 4])
        kind = bytes(mv[pos + 4:pos + 8])
        if kind in (b"IDAT", b"fdAT"):
            image_chunks += 1
            if image_chunks > most_image_chunks:
                raise BadImage(f"the PNG's image data is cut into over {most_image_chunks} chunks (under "
                               f"{MIN_DATA_CHUNK_BYTES} bytes each); {_RE_ENCODE}")
        else:
            other += 1
            if other > MAX_PNG_CHUNKS:
                raise BadImage(f"the PNG has over {MAX_PNG_CHUNKS} chunks besides its image data; {_RE_ENCODE}")
            if kind == b"fcTL":
                frames += 1
                if frames > MAX_FRAMES:
                    raise BadImage(f"the animated PNG has over {MAX_FRAMES} frames (only the first is read); "
                                   f"send its first frame")
            if kind == b"IEND":
                break
        pos += 12 + length
    return max(1, frames)


def _walk_gif(data: bytes) -> int:
    mv = memoryview(data)
    n = len(mv)
    if n < 13:
        return 1  # the decoder says what is wrong
    flags = mv[10]
    pos = 13 + (3 * (2 << (flags & 7)) if flags & 0x80 else 0)
    frames = blocks = 0
    most_blocks = 64 + n // MIN_GIF_SUBBLOCK_BYTES

    def sub_blocks(at: int) -> int:
        nonlocal blocks
        while at < n:
            size = mv[at]
            at += 1
            if size == 0:
                return at
            blocks += 1
            if blocks > most_blocks:
                raise BadImage(f"the GIF's data is cut into over {most_blocks} blocks; {_RE_ENCODE}")
            at += size
        return at

    while pos < n:
        kind = mv[pos]
        if kind == 0x3B:  # trailer
            break
        if kind == 0x21:  # extension: label, sub-blocks
            pos = sub_blocks(pos + 2)
        elif kind == 0x2C:  # an image: descriptor, local colours, LZW code size, sub-blocks
            frames += 1
            if frames > MAX_FRAMES:
                raise BadImage(f"the GIF has over {MAX_FRAMES} frames (only the first is read); "
                               f"send its first frame")
            if pos + 10 > n:
                break
            local = mv[pos + 9]
            pos += 10 + (3 * (2 << (local & 7)) if local & 0x80 else 0)
            pos = sub_blocks(pos + 1)
        else:
            break  # not a block: the decoder stops here too
    return max(1, frames)


_JPEG_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")  # a marker in entropy-coded data (not stuffing, RSTn, fill)


def _walk_jpeg(data: bytes) -> int:
    mv = memoryview(data)
    n = len(mv)
    pos, segments, scans = 2, 0, 0
    while pos + 4 <= n:
        if mv[pos] != 0xFF:
            break  # the decoder says what is wrong
        marker = mv[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xD9:  # end of image
            break
        if 0xD0 <= marker <= 0xD8 or marker == 0x01:  # no length
            pos += 2
            continue
        (length,) = struct.unpack(">H", mv[pos + 2:pos + 4])
        segments += 1
        if segments > MAX_JPEG_SEGMENTS + MAX_JPEG_SCANS:
            raise BadImage(f"the JPEG has over {MAX_JPEG_SEGMENTS} segments (comments, application data); "
                           f"{_RE_ENCODE}")
        pos += 2 + length
        if marker == 0xDA:  # a scan: its entropy-coded data runs to the next marker
            scans += 1
            if scans > MAX_JPEG_SCANS:
                raise BadImage(f"the JPEG has over {MAX_JPEG_SCANS} scans; {_RE_ENCODE}")
            found = _JPEG_MARKER.search(data, pos)
            if found is None:
                break
            pos = found.start()
        elif segments - scans > MAX_JPEG_SEGMENTS:
            raise BadImage(f"the JPEG has over {MAX_JPEG_SEGMENTS} segments (comments, application data); "
                           f"{_RE_ENCODE}")
    return 1
