"""A cheap check of an encoded image at the door (job submits): its header
only, with the decoder's own rules (serve_app.stages.decode), so that junk
is a 400 when it is sent rather than a failed job later. No Ray import."""

from __future__ import annotations

import io

from PIL import Image

from .config import ImageLimits
from .errors import BadImage, TooLarge
from .stages.decode import FORMATS, check_aspect


def check_image_header(data: bytes, limits: ImageLimits) -> tuple[int, int]:
    """(width, height) from the header; BadImage or TooLarge as decoding
    would raise them. Reads the header only: no pixel is decoded."""
    if len(data) == 0:
        raise BadImage("image is empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise TooLarge(f"image is {len(data)} bytes, over the limit of {limits.max_bytes}")
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as img:
            w, h = img.size
    except Exception:  # UnidentifiedImageError, and many others on mangled headers
        raise BadImage("not a supported image (JPEG, PNG, BMP, TIFF, WEBP or GIF expected)") from None
    if w < 1 or h < 1:
        raise BadImage(f"image has no pixels ({w}x{h})")
    if w * h > limits.max_pixels:
        raise TooLarge(f"image is {w}x{h} = {w * h} pixels, over the limit of {limits.max_pixels}")
    check_aspect(w, h, limits)
    return w, h
