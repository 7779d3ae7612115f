"""Detection pre-processing: whole-image resizes and letterbox (recorded so
boxes map back), and the detector's own resize to multiples of 32."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from ..config import DetOptions, PipelineOptions


@dataclass(frozen=True)
class Geometry:
    """How the image the detector saw relates to the original: scale factors
    (original / working) and the letterbox padding added on top."""

    scale_x: float = 1.0
    scale_y: float = 1.0
    pad_top: int = 0
    orig_w: int = 0
    orig_h: int = 0


def _resize_round32(img: np.ndarray, ratio: float) -> np.ndarray:
    h, w = img.shape[:2]
    rh = max(int(round(int(h * ratio) / 32) * 32), 32)
    rw = max(int(round(int(w * ratio) / 32) * 32), 32)
    return cv2.resize(img, (rw, rh))


def prepare_image(img: np.ndarray, opts: PipelineOptions) -> tuple[np.ndarray, Geometry]:
    """Bound the working size (long side <= max_side_len, short side >=
    min_side_len) and letterbox very flat images."""
    oh, ow = img.shape[:2]
    work = img
    if opts.max_side_len and max(oh, ow) > opts.max_side_len:
        work = _resize_round32(work, opts.max_side_len / max(oh, ow))
    h, w = work.shape[:2]
    if opts.min_side_len and min(h, w) < opts.min_side_len:
        work = _resize_round32(work, opts.min_side_len / min(h, w))
    h, w = work.shape[:2]
    pad = 0
    if opts.letterbox and (h <= opts.letterbox_min_height or w / h > opts.letterbox_ratio):
        new_h = max(int(w / opts.letterbox_ratio), opts.letterbox_min_height) * 2
        pad = int(abs(new_h - h) / 2)
        work = cv2.copyMakeBorder(work, pad, pad, 0, 0, cv2.BORDER_CONSTANT, value=(0, 0, 0))
    return work, Geometry(ow / w, oh / h, pad, ow, oh)


def boxes_to_original(boxes: np.ndarray, g: Geometry) -> np.ndarray:
    """Map boxes (N,4,2) in working coordinates back onto the original image."""
    if len(boxes) == 0:
        return np.zeros((0, 4, 2), dtype=np.float32)
    out = np.asarray(boxes, dtype=np.float32).copy()
    out[..., 1] -= g.pad_top
    out[..., 0] *= g.scale_x
    out[..., 1] *= g.scale_y
    out[..., 0] = np.clip(out[..., 0], 0, g.orig_w)
    out[..., 1] = np.clip(out[..., 1], 0, g.orig_h)
    return out


def det_input_size(h: int, w: int, opts: DetOptions) -> tuple[int, int]:
    """The (height, width) the detector runs at for an h x w image."""
    if opts.limit_type == "max":
        ratio = opts.limit_side_len / max(h, w) if max(h, w) > opts.limit_side_len else 1.0
    else:
        ratio = opts.limit_side_len / min(h, w) if min(h, w) < opts.limit_side_len else 1.0
    rh = int(round(int(h * ratio) / 32) * 32)
    rw = int(round(int(w * ratio) / 32) * 32)
    return max(rh, 32), max(rw, 32)


def det_preprocess(img: np.ndarray, opts: DetOptions) -> np.ndarray:
    """BGR uint8 HxWx3 -> float32 3xH'xW' normalised, H' and W' multiples of 32."""
    h, w = img.shape[:2]
    rh, rw = det_input_size(h, w, opts)
    resized = cv2.resize(img, (rw, rh))
    mean = np.asarray(opts.mean, dtype=np.float32) * 255.0
    inv_std = 1.0 / (np.asarray(opts.std, dtype=np.float32) * 255.0)
    x = (resized.astype(np.float32) - mean) * inv_std
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def large_image_shapes(opts: DetOptions) -> list[tuple[int, int]]:
    """Every detector input an image at least limit_side_len on its long
    side can give, with limit_type "max": that side scaled to the limit, the
    other any multiple of 32 up to it (79 shapes at 1280). Photos, scans and
    screenshots mostly land here; smaller images keep their own sizes (an
    open set). [] for limit_type "min" (open in the long side)."""
    if opts.limit_type != "max":
        return []
    top = det_input_size(opts.limit_side_len, opts.limit_side_len, opts)[0]
    sides = range(32, top + 1, 32)
    return sorted({(top, s) for s in sides} | {(s, top) for s in sides})
