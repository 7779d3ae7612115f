"""What the pipeline makes of its stages' answers, no model call: the
lines' crops in reading order, the lines assembled from the recogniser's
readings (characters' and words' boxes with them), boxes rounded; and
`all_or_none`, the pipeline's way of awaiting several calls at once."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Optional

import numpy as np

from serve_app.core.engine_config import ImageLimits
from serve_app.core.results import CharBox, Recognition, TextLine, WordBox
from serve_app.ocr.crop import char_quad, crop_quad, is_vertical
from serve_app.ocr.db_postprocess import order_clockwise
from serve_app.ocr.det_preprocess import Geometry, boxes_to_original
from serve_app.ocr.reading_order import reading_order
from serve_app.ocr.words import split_words


async def all_or_none(coros: list[Awaitable]) -> list:
    """The coroutines' results in order; if one fails, the others are
    cancelled (and awaited) before its exception propagates."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def crop_lines(work: np.ndarray, boxes: np.ndarray, limits: ImageLimits) -> tuple[np.ndarray, list[np.ndarray]]:
    """Boxes in reading order (at most max_crops of them) and their crops."""
    if len(boxes) == 0:
        return boxes, []
    order = reading_order(boxes)[: limits.max_crops]
    boxes = boxes[order]
    return boxes, [crop_quad(work, b) for b in boxes]


def assemble(
    boxes: np.ndarray,
    recs: list[Recognition],
    geometry: Geometry,
    drop_score: float,
    flipped: Optional[list[bool]] = None,
    return_chars: bool = False,
    return_words: bool = False,
) -> tuple[TextLine, ...]:
    """Lines whose score reaches drop_score, boxes mapped to the original;
    with return_chars, each line also lists its characters' boxes, with
    return_words its words' (serve_app.ocr.words)."""
    mapped = boxes_to_original(boxes, geometry)
    flipped = flipped or [False] * len(recs)
    lines = []
    for b, r, flip in zip(mapped, recs, flipped):
        r = strip_reading(r)
        if r.score < drop_score or not r.text:
            continue
        chars = words = None
        vertical = is_vertical(b)

        def quad(s0: float, s1: float) -> list[list[float]]:
            return round_box(order_clockwise(char_quad(b, s0, s1, vertical, flip)))

        if return_chars:
            chars = tuple(CharBox(ch, quad(s0, s1)) for ch, (s0, s1) in zip(r.text, r.char_spans) if not ch.isspace())
        if return_words:
            words = tuple(WordBox(w.text, quad(w.start, w.end), w.score)
                          for w in split_words(r.text, r.char_spans, r.char_scores))
        lines.append(TextLine(r.text, r.score, round_box(b), chars, words))
    return tuple(lines)


def strip_reading(r: Recognition) -> Recognition:
    """The reading without leading and trailing whitespace (the recogniser
    reads the crop's margins as spaces at times), its characters' spans and
    scores cut the same way so that character and word boxes stay on their
    characters."""
    text = r.text
    start = len(text) - len(text.lstrip())
    end = len(text.rstrip())
    if start == 0 and end == len(text):
        return r
    spans = r.char_spans[start:end] if len(r.char_spans) == len(text) else r.char_spans
    scores = r.char_scores[start:end] if len(r.char_scores) == len(text) else r.char_scores
    return Recognition(text[start:end], r.score, tuple(spans), tuple(scores))


def round_box(b: Any) -> list[list[float]]:
    return np.round(np.asarray(b, dtype=np.float64), 1).tolist()


def whole_image_box(w: int, h: int) -> list[list[float]]:
    return [[0.0, 0.0], [float(w), 0.0], [float(w), float(h)], [0.0, float(h)]]
