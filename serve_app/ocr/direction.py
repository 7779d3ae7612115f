"""Direction classification (0 or 180 degrees): pre- and post-processing."""

from __future__ import annotations

import math

import cv2
import numpy as np

from serve_app.core.engine_config import ClsOptions
from serve_app.core.results import Direction


def cls_preprocess(crop: np.ndarray, opts: ClsOptions) -> np.ndarray:
    c, h, w = opts.image_shape
    ratio = crop.shape[1] / float(crop.shape[0])
    rw = min(w, int(math.ceil(h * ratio)))
    resized = cv2.resize(crop, (max(rw, 1), h)).astype(np.float32)
    out = np.zeros((c, h, w), dtype=np.float32)
    out[:, :, :rw] = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    return out


def cls_views(crop: np.ndarray, opts: ClsOptions) -> list[np.ndarray]:
    """What the classifier looks at for one crop. A crop up to
    `window_aspect` times as wide as high: the crop itself (squashed into
    the 48x192 input when wider than 4:1, as PaddleOCR does). A longer line
    squashed that far is a smear the classifier often calls upside down
    (16 of the dense peer page's long lines, at 0.9+), so instead: up to
    `max_windows` windows of the line at its own height-to-width ratio,
    each exactly the input's size, spread from its start to its end; their
    probabilities are averaged (cls_combine)."""
    c, h, w = opts.image_shape
    ratio = crop.shape[1] / float(max(1, crop.shape[0]))
    if not opts.window_aspect or ratio <= opts.window_aspect:
        return [crop]
    full_w = int(math.ceil(h * ratio))
    line = cv2.resize(crop, (full_w, h))
    k = max(1, min(opts.max_windows, full_w // w))
    step = (full_w - w) / (k - 1) if k > 1 else 0
    return [line[:, int(round(i * step)): int(round(i * step)) + w] for i in range(k)]


def cls_combine(probs: np.ndarray, counts: list[int]) -> np.ndarray:
    """One row of probabilities per crop: the mean over its views' rows."""
    out, at = [], 0
    for n in counts:
        out.append(probs[at: at + n].mean(axis=0))
        at += n
    return np.stack(out) if out else probs[:0]


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
