"""The image formats the service reads, and the checks every way in makes
before a pixel is decoded (the header reader, ocr/image_header.py, and the
decoder, ocr/decode.py): which formats open, the error for the rest, the
aspect-ratio bound."""

from __future__ import annotations

from PIL import Image

from serve_app.core.engine_config import ImageLimits
from serve_app.core.errors import BadImage, UnsupportedMediaType

# We enforce our own pixel limit from the header; PIL's global one would
# raise a DecompressionBombError with a message of its own first.
Image.MAX_IMAGE_PIXELS = None

# HEIC/HEIF (phones' photos: iPhones save them by default) through
# pillow-heif's libheif + libde265, the optional extra `heic`: its wheels also
# bundle the x265 encoder (GPL-2), which the default install does not carry.
# AVIF through Pillow's own libavif (BSD). The container's header gives the
# size before any pixel is decoded, as for the others; libheif applies the
# image's rotation and mirroring when it decodes, and pillow-heif then leaves
# the EXIF orientation at 1 (no double turn).
try:
    import pillow_heif
except ImportError:
    pillow_heif = None
else:
    pillow_heif.register_heif_opener(thumbnails=False)

HEIC_EXTRA = ("HEIC/HEIF images are read with the optional extra `heic` (pillow-heif), not installed here: "
              "install it (pip install -e '.[heic]'; its wheels bundle GPL-2 code), or send the image as "
              "JPEG, PNG or AVIF")
# Pillow refuses a format name it has no opener for: HEIF only with the extra.
HEIF_NAMES = ("HEIF",) if pillow_heif is not None else ()
FORMATS = ("JPEG", "PNG", "BMP", "TIFF", "WEBP", "GIF") + HEIF_NAMES + ("AVIF",)  # an MPO opens as JPEG (its factory)
UNSUPPORTED = "not a supported image (JPEG, PNG, BMP, TIFF, WEBP, GIF, HEIC or AVIF expected)"
# ISO-BMFF brands (the `ftyp` box) of HEIF images; AVIF's own are avif/avis.
HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs", b"mif1", b"msf1"}
AVIF_BRANDS = {b"avif", b"avis"}


def is_heif(data: bytes) -> bool:
    """An ISO-BMFF `ftyp` box naming a HEIF brand and no AVIF one."""
    head = bytes(data[:64])
    if len(head) < 16 or head[4:8] != b"ftyp":
        return False
    size = min(int.from_bytes(head[:4], "big"), len(head))
    brands = {head[8:12]} | {head[i:i + 4] for i in range(16, size - 3, 4)}
    return bool(brands & HEIF_BRANDS) and not brands & AVIF_BRANDS


def unreadable(data: bytes) -> Exception:
    """The error for bytes Pillow cannot open: a HEIC without the `heic`
    extra is a 415 that names the extra; anything else a 400."""
    if pillow_heif is None and is_heif(data):
        return UnsupportedMediaType(HEIC_EXTRA)
    return BadImage(UNSUPPORTED)


def check_aspect(w: int, h: int, limits: ImageLimits) -> None:
    """BadImage when an image is over limits.max_aspect times as long as it
    is wide: a 1 x 300,000 px strip costs hundreds of detector tiles and
    holds no line of text a person could read."""
    if max(w, h) > limits.max_aspect * max(1, min(w, h)):
        raise BadImage(f"image is {w}x{h} px: its long side is over {limits.max_aspect:g} times its short side "
                       f"(limits.max_aspect); crop it, or split it into pieces")
