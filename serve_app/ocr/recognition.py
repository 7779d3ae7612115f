"""Recognition pre-processing (height 48, widths padded per batch) and CTC
decoding with the dictionary."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import cv2
import numpy as np

from serve_app.core.engine_config import RecOptions
from serve_app.core.results import Recognition


def load_charset(path: Path, use_space_char: bool = True) -> list[str]:
    """Dictionary file (one character per line) -> CTC labels: blank at
    index 0, then the characters, then (optionally) the space."""
    # Split on "\n" only: str.splitlines() would also split on characters a
    # dictionary may hold (\x0b, \x1c, \u2028, ...), shifting every label.
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    chars = [line[:-1] if line.endswith("\r") else line for line in lines]
    if use_space_char:
        chars.append(" ")
    return ["blank"] + chars


def batch_width(ratios: list[float], opts: RecOptions) -> int:
    """Padded width for a batch whose widest crop has the largest w/h ratio:
    at least image_width, rounded up to the width ladder (or, without one,
    to the width bucket), at most max_width."""
    h = opts.image_height
    w = max(opts.image_width / h, max(ratios)) * h
    w = int(w)
    if opts.width_ladder:
        return next((b for b in opts.width_ladder if b >= w), opts.width_ladder[-1])
    if opts.width_bucket > 1:
        w = int(math.ceil(w / opts.width_bucket) * opts.width_bucket)
    return min(w, opts.max_width)


def batch_limit(width: int, opts: RecOptions) -> int:
    """Crops per predictor batch at this padded width: batch_size, fewer for
    wide buckets (at most batch_columns padded columns), at least one."""
    return max(1, min(opts.batch_size, opts.batch_columns // width))


def input_shapes(opts: RecOptions) -> list[tuple[int, int]]:
    """Every (batch size, width) the recogniser can be given with bucket
    padding and a width ladder: the set to warm."""
    return [(n, w) for w in opts.width_ladder for n in range(1, batch_limit(w, opts) + 1)]


def rec_preprocess(crop: np.ndarray, width: int, opts: RecOptions) -> np.ndarray:
    """Resize to height 48 keeping the aspect ratio (squeezed if wider than
    `width`), normalise to [-1, 1], pad right with zeros to `width`."""
    h = opts.image_height
    ratio = crop.shape[1] / float(crop.shape[0])
    rw = min(width, int(math.ceil(h * ratio)))
    resized = cv2.resize(crop, (max(rw, 1), h)).astype(np.float32)
    out = np.zeros((3, h, width), dtype=np.float32)
    out[:, :, :rw] = (resized.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
    return out


def ctc_decode(probs: np.ndarray, charset: list[str], content_fracs: Optional[list[float]] = None) -> list[Recognition]:
    """Greedy CTC: argmax per step, merge repeats, drop blanks (index 0).
    Score is the mean probability of the kept steps (0 for an empty read).
    `content_fracs[n]`: the share of the padded input width that crop n fills;
    given it, each character also gets its span as fractions of the crop."""
    idx = probs.argmax(axis=2)
    prob = probs.max(axis=2)
    steps = idx.shape[1]
    out = []
    for n in range(idx.shape[0]):
        keep = np.ones(steps, dtype=bool)
        keep[1:] = idx[n, 1:] != idx[n, :-1]
        keep &= idx[n] != 0
        cols = np.nonzero(keep)[0]
        chars = [(charset[i], c) for i, c in zip(idx[n][keep], cols) if i < len(charset)]
        text = "".join(ch for ch, _ in chars)
        score = float(np.mean(prob[n][keep])) if keep.any() else 0.0
        spans: tuple = ()
        if content_fracs is not None and chars:
            spans = _char_spans([c for _, c in chars], steps, content_fracs[n])
        char_scores = tuple(round(float(prob[n][c]), 6) for _, c in chars)
        out.append(Recognition(text, score, spans, char_scores))
    return out


def _char_spans(cols: list[int], steps: int, content_frac: float) -> tuple[tuple[float, float], ...]:
    """Each character spans from midway after the previous character's step
    to midway before the next one's; the ends reach out by half the mean
    spacing. Fractions of the crop width, clipped to [0, 1]."""
    centers = [(c + 0.5) / steps / content_frac for c in cols]
    half = 0.5 * (centers[-1] - centers[0]) / (len(centers) - 1) if len(centers) > 1 else 1.5 / steps / content_frac
    bounds = [centers[0] - half] + [(a + b) / 2 for a, b in zip(centers, centers[1:])] + [centers[-1] + half]
    return tuple((max(0.0, min(1.0, a)), max(0.0, min(1.0, b))) for a, b in zip(bounds, bounds[1:]))


def width_order(crops: list[np.ndarray]) -> list[int]:
    """Indices of crops sorted by aspect ratio, so each batch pads little."""
    ratios = [c.shape[1] / float(c.shape[0]) for c in crops]
    return [int(i) for i in np.argsort(np.array(ratios), kind="stable")]
