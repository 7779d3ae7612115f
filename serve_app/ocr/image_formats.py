"""The image formats the service reads, and the checks every way in makes
before a pixel is decoded (the header reader, ocr/image_header.py, and the
decoder, ocr/decode.py): which formats open, the message for the rest, the
aspect-ratio bound."""

from __future__ import annotations

import pillow_heif
from PIL import Image

from serve_app.core.engine_config import ImageLimits
from serve_app.core.errors import BadImage

# We enforce our own pixel limit from the header; PIL's global one would
# raise a DecompressionBombError with a message of its own first.
Image.MAX_IMAGE_PIXELS = None

# HEIC/HEIF (phones' photos: iPhones save them by default) through
# pillow-heif's libheif + libde265; AVIF through Pillow's own libavif. The
# container's header gives the size before any pixel is decoded, as for the
# others; libheif applies the image's rotation and mirroring when it decodes,
# and pillow-heif then leaves the EXIF orientation at 1 (no double turn).
pillow_heif.register_heif_opener(thumbnails=False)

FORMATS = ("JPEG", "PNG", "BMP", "TIFF", "WEBP", "GIF", "HEIF", "AVIF")  # an MPO opens as JPEG (its factory)
UNSUPPORTED = "not a supported image (JPEG, PNG, BMP, TIFF, WEBP, GIF, HEIC or AVIF expected)"


def check_aspect(w: int, h: int, limits: ImageLimits) -> None:
    """BadImage when an image is over limits.max_aspect times as long as it
    is wide: a 1 x 300,000 px strip costs hundreds of detector tiles and
    holds no line of text a person could read."""
    if max(w, h) > limits.max_aspect * max(1, min(w, h)):
        raise BadImage(f"image is {w}x{h} px: its long side is over {limits.max_aspect:g} times its short side "
                       f"(limits.max_aspect); crop it, or split it into pieces")
