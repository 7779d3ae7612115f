"""Image bytes -> BGR uint8 array, refusing what is too big before decoding.

PIL reads only the header on `Image.open`, so the byte and pixel limits are
checked before any pixel is decoded (a 60000x60000 PNG bomb costs a few
hundred bytes of reading, not 10 GiB of memory)."""

from __future__ import annotations

import io
import warnings

import cv2
import numpy as np
from PIL import Image, ImageOps

from serve_app.core.engine_config import ImageLimits
from serve_app.core.errors import BadImage, TooLarge
from serve_app.ocr.image_formats import FORMATS, HEIF_NAMES, check_aspect, pillow_heif, unreadable  # noqa: F401  (pillow_heif: whether the extra is here)

def decode_image(data: bytes, limits: ImageLimits = ImageLimits(), exif_transpose: bool = True) -> np.ndarray:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadImage(f"image must be bytes, got {type(data).__name__}")
    if len(data) == 0:
        raise BadImage("image is empty (0 bytes)")
    limits.check_bytes(len(data))
    from serve_app.ocr.image_header import check_structure  # chunks, frames, segments walked cheaply first

    check_structure(data)
    try:
        img = Image.open(io.BytesIO(data), formats=FORMATS)
    except Exception:  # UnidentifiedImageError, and many others on mangled headers
        raise unreadable(data) from None
    w, h = img.size
    if w < 1 or h < 1:
        raise BadImage(f"image has no pixels ({w}x{h})")
    if w * h > limits.max_pixels:
        raise TooLarge(f"image is {w}x{h} = {w * h} pixels, over the limit of {limits.max_pixels}")
    check_aspect(w, h, limits)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            img.seek(0)  # first frame of a GIF / multi-page TIFF
            img.load()
            if exif_transpose:
                img = ImageOps.exif_transpose(img)
    except Exception as e:
        raise BadImage(f"image data is corrupt or truncated ({type(e).__name__})") from None
    return to_bgr(img)


# Formats whose extra frames are not pages: an animation's frames, a stereo
# JPEG's second view. Only the first is read; the answer says how many there were.
FRAME_FORMATS = ("GIF", "WEBP", "PNG", "JPEG") + HEIF_NAMES + ("AVIF",)  # JPEG: an MPO (stereo) has 2


def frame_count(data: bytes) -> int:
    """How many frames an animated GIF, WebP, PNG or AVIF (an MPO, a HEIC
    burst) has; 1 for any other image, and for what cannot be read
    (decode_image says why).
    Headers and frame headers only, no frame decoded; a GIF's and a PNG's
    counted by check_structure's bounded walk (Pillow's n_frames walks a
    flood of them one by one)."""
    from serve_app.ocr.image_header import check_structure

    head = bytes(data[:8])
    try:
        walked = check_structure(data)
    except BadImage:
        return 1
    if head[:3] == b"GIF" or head[:4] == b"\x89PNG":
        return walked
    try:
        with Image.open(io.BytesIO(data), formats=FRAME_FORMATS) as img:
            return max(1, int(getattr(img, "n_frames", 1)))
    except Exception:
        return 1


# A 1-bit image (a fax, a scan saved bilevel) is smoothed back to gray
# before reading: the recogniser was trained on gray text, and a dithered
# page (photo-mode faxes, PIL's own convert("1")) keeps its gray levels only
# as dot density, which a blur of about a pixel turns back into gray. Measured
# in docs/documents.md ("1-bit pages"): dithered pages 9.9% -> 1.3% CER,
# thresholded ones 5.7% -> 5.4%.
BILEVEL_SIGMA = 1.0


def smooth_bilevel(gray: np.ndarray) -> np.ndarray:
    """A 0/255 uint8 image, low-passed with BILEVEL_SIGMA (px)."""
    return cv2.GaussianBlur(np.ascontiguousarray(gray), (0, 0), BILEVEL_SIGMA)


def to_bgr(img: Image.Image) -> np.ndarray:
    """Any PIL mode -> 3-channel BGR uint8 (a 1-bit one smoothed to gray)."""
    mode = img.mode
    if mode == "1":
        return _gray_to_bgr(smooth_bilevel(np.asarray(img.convert("L"))))
    if mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif mode in ("CMYK", "YCbCr", "LAB", "HSV"):
        img = img.convert("RGB")
    elif mode.startswith("I") or mode == "F":
        return _gray_to_bgr(_to_uint8(np.asarray(img)))
    elif mode == "PA":
        img = img.convert("RGBA")
    arr = np.asarray(img)
    return array_to_bgr(arr, rgb=True)


def array_to_bgr(arr: np.ndarray, rgb: bool = False) -> np.ndarray:
    """An image array (HxW, HxWx1..4, any integer or float dtype) -> BGR uint8.
    `rgb` says the colour channels are in RGB order (PIL) rather than BGR (OpenCV)."""
    if arr.ndim not in (2, 3) or arr.size == 0:
        raise BadImage(f"image array must be HxW or HxWxC, got shape {arr.shape}")
    if arr.dtype == np.bool_ and (arr.ndim == 2 or arr.shape[2] == 1):  # a 1-bit page as an array
        return _gray_to_bgr(smooth_bilevel(_to_uint8(arr.reshape(arr.shape[:2]))))
    arr = _to_uint8(arr)
    if arr.ndim == 2:
        return _gray_to_bgr(arr)
    c = arr.shape[2]
    if c == 1:
        return _gray_to_bgr(arr[..., 0])
    if c == 2:
        return flatten_alpha(_gray_to_bgr(arr[..., 0]), arr[..., 1])
    if c == 3:
        return np.ascontiguousarray(arr[..., ::-1]) if rgb else np.ascontiguousarray(arr)
    if c == 4:
        color = arr[..., :3][..., ::-1] if rgb else arr[..., :3]
        return flatten_alpha(np.ascontiguousarray(color), arr[..., 3])
    raise BadImage(f"image array has {c} channels; 1 to 4 expected")


def _to_uint8(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if np.issubdtype(arr.dtype, np.floating):
        hi = 1.0 if float(np.nanmax(arr)) <= 1.0 else 255.0
        return np.clip(np.nan_to_num(arr) * (255.0 / hi), 0, 255).astype(np.uint8)
    # 16-bit (and 32-bit integer) images: values that fit 8 bits are taken as
    # they are; otherwise scaled by the data's own maximum (for OCR a
    # contrast stretch is harmless, and the mapping stays continuous).
    top = float(arr.max()) if arr.size else 0.0
    if top <= 255:
        return np.clip(arr, 0, 255).astype(np.uint8)
    return np.clip(arr.astype(np.float64) * (255.0 / top), 0, 255).astype(np.uint8)


def _gray_to_bgr(gray: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(np.ascontiguousarray(gray), cv2.COLOR_GRAY2BGR)


def flatten_alpha(bgr: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Composite on white, unless the visible content is itself light (white
    text on a transparent background), in which case on black: either way the
    text keeps its contrast."""
    total = float(alpha.sum(dtype=np.float64))
    if total == 0.0:
        return np.full_like(bgr, 255)
    gray = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
    content = float(cv2.mean(gray, mask=(alpha > 0).astype(np.uint8))[0])
    background = np.full_like(bgr, 0 if content > 127.0 else 255)
    a = cv2.cvtColor(np.ascontiguousarray(alpha), cv2.COLOR_GRAY2BGR)
    # out = bgr * a/255 + background * (1 - a/255), in integer arithmetic
    return cv2.add(cv2.multiply(bgr, a, scale=1 / 255.0), cv2.multiply(background, 255 - a, scale=1 / 255.0))
