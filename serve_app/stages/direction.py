"""Direction classification (0 or 180 degrees): pre- and post-processing."""

from __future__ import annotations

import math

import cv2
import numpy as np

from ..config import ClsOptions
from ..results import Direction


def cls_preprocess(crop: np.ndarray, opts: ClsOptions) -> np.ndarray:
    c, h, w = opts.image_shape
    ratio = crop.shape[1] / float(crop.shape[0])
    rw = min(w, int(math.ceil(h * ratio)))
    resized = cv2.resize(crop, (max(rw, 1), h)).astype(np.float32)
    out = np.zeros((c, h, w), dtype=np.float32)
    out[:, :, :rw] = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    return out


def cls_postprocess(probs: np.ndarray, opts: ClsOptions) -> list[Direction]:
    idx = probs.argmax(axis=1)
    return [Direction(opts.labels[i], float(probs[n, i])) for n, i in enumerate(idx)]


def is_flipped(d: Direction, opts: ClsOptions) -> bool:
    """Upside down, confidently enough to turn the crop."""
    return "180" in d.label and d.score > opts.thresh


def apply_direction(crop: np.ndarray, d: Direction, opts: ClsOptions) -> np.ndarray:
    if is_flipped(d, opts):
        return cv2.rotate(crop, cv2.ROTATE_180)
    return crop
