"""Detection pre-processing: whole-image resizes and letterbox (recorded so
boxes map back), and the detector's own resize to multiples of 32."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from serve_app.core.engine_config import DetOptions, PipelineOptions


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
        # Never past max_side_len on the long side: a 2000x1 image must not
        # become a 60000x30 one (and then a letterboxed 60000x15000).
        ratio = opts.min_side_len / min(h, w)
        if opts.max_side_len:
            ratio = min(ratio, max(1.0, opts.max_side_len / max(h, w)))
        work = _resize_round32(work, ratio)
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
    """The (height, width) the image is resized to for the detector ("max"
    and "min" modes: also the detector's input; "ladder": before padding)."""
    return det_layout(h, w, opts)[0]


def det_layout(h: int, w: int, opts: DetOptions) -> tuple[tuple[int, int], tuple[int, int]]:
    """((resized h, w), (input h, w)) for an h x w image: the image is
    resized to the first, then padded (bottom and right) to the second.

    "max" / "min" (PaddleOCR's modes; the reference config): the long side
    scaled down to, or the short side up to, limit_side_len, each side
    rounded to a multiple of 32; no padding, so the set of inputs is open.

    "ladder": a closed set of inputs. The long side is scaled to a rung of
    `side_ladder`: the first rung at or above it, after scaling the short
    side up to `min_side` if it is shorter, and never past the last rung.
    The short side is padded up to a multiple of that rung's step
    (rung / short_steps, rounded up to 32)."""
    if opts.limit_type != "ladder":
        if opts.limit_type == "max":
            ratio = opts.limit_side_len / max(h, w) if max(h, w) > opts.limit_side_len else 1.0
        else:
            ratio = opts.limit_side_len / min(h, w) if min(h, w) < opts.limit_side_len else 1.0
        rh = max(int(round(int(h * ratio) / 32) * 32), 32)
        rw = max(int(round(int(w * ratio) / 32) * 32), 32)
        return (rh, rw), (rh, rw)
    long, short = max(h, w), min(h, w)
    want = max(long, long * opts.min_side / short) if short < opts.min_side else long
    rung = next((r for r in opts.side_ladder if r >= want - 0.5), opts.side_ladder[-1])
    step = _ceil32(rung / opts.short_steps)
    short_px = min(rung, max(1, int(round(short * rung / long))))
    short_in = min(rung, -(-short_px // step) * step)
    if h >= w:
        return (rung, short_px), (rung, short_in)
    return (short_px, rung), (short_in, rung)


def _ceil32(x: float) -> int:
    return max(32, -(-int(round(x)) // 32) * 32)


def det_preprocess(img: np.ndarray, opts: DetOptions) -> tuple[np.ndarray, tuple[int, int]]:
    """BGR uint8 HxWx3 -> (float32 3xH'xW' normalised, H' and W' multiples of
    32; (h, w) of the image inside it: the rest is padding, which the
    detector's output is cropped to before boxes are found)."""
    h, w = img.shape[:2]
    (rh, rw), (ih, iw) = det_layout(h, w, opts)
    resized = cv2.resize(img, (rw, rh))
    if (ih, iw) != (rh, rw):
        resized = pad_image(resized, ih, iw, opts.pad)
    mean = np.asarray(opts.mean, dtype=np.float32) * 255.0
    inv_std = 1.0 / (np.asarray(opts.std, dtype=np.float32) * 255.0)
    # (x - mean) * inv_std in float32, channel by channel straight into the
    # planar output: the same numbers as normalising the HxWx3 image and then
    # transposing it, without its three full-size temporaries (4-7x faster at
    # 960x1280: `python -m load_tests engine tiers-breakdown`, "det preprocess").
    out = np.empty((3, ih, iw), np.float32)
    for c, channel in enumerate(cv2.split(resized)):
        np.subtract(channel, mean[c], out=out[c], dtype=np.float32)
        out[c] *= inv_std[c]
    return out, (rh, rw)


def pad_image(img: np.ndarray, h: int, w: int, mode: str) -> np.ndarray:
    """img padded at the bottom and right to h x w: "replicate" repeats the
    edge pixels (no new edges for the detector to see), "zero" is black,
    "mean" is the normalisation mean (0 after normalising)."""
    bottom, right = h - img.shape[0], w - img.shape[1]
    if mode == "replicate":
        return cv2.copyMakeBorder(img, 0, bottom, 0, right, cv2.BORDER_REPLICATE)
    value = (0, 0, 0) if mode == "zero" else (127, 127, 127)
    return cv2.copyMakeBorder(img, 0, bottom, 0, right, cv2.BORDER_CONSTANT, value=value)


def det_input_shapes(opts: DetOptions) -> list[tuple[int, int]]:
    """Every detector input (h, w) of the "ladder" mode: the closed set that
    is warmed before a detector replica is ready. [] for the open modes."""
    if opts.limit_type != "ladder":
        return []
    shapes = set()
    for rung in opts.side_ladder:
        step = _ceil32(rung / opts.short_steps)
        for short in list(range(step, rung, step)) + [rung]:
            shapes |= {(rung, short), (short, rung)}
    return sorted(shapes)
