"""The layout detector's boxes settled against the page's lines, before
table crops are cut (serve_app.flow.structure_step):

- a table under layout_score (but over table_score, the detector's own
  floor for tables) stays only where the detector also found a block of
  another type over the same area (IoU >= TWIN_IOU): the table reading of
  that block wins and takes its lines (regions.swallowed); a table lying
  mostly inside a better table is dropped;
- boxes of other types over the same area (IoU >= TWIN_IOU) are one block:
  the best scored stays;
- a `header` region whose lines' ink (the rows of dark pixels in each
  line's box) is TITLE_HEIGHT times the page's median or taller is a title:
  text set larger than the page's, not a running head;
- a table's box encloses the lines it takes (a line at least MIN_COVER in
  it), so that its crop cuts no line;
- a table grows over a row of lines just above or below it (within a line's
  height) that falls in its columns: at least two lines, each over exactly
  one of the columns its own lines make, at least half of them, none
  twice (a header row the detector left out, bold and without a rule).
No Ray, no model: pure geometry."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import cv2
import numpy as np

from serve_app.core.results import TextLine
from serve_app.structure.layout import LayoutBox, _iou
from serve_app.structure.regions import MIN_COVER, SWALLOWED, _cover
from serve_app.structure.table_match import xyxy

TWIN_IOU = 0.7  # two boxes over this IoU are one block read two ways
TITLE_HEIGHT = 1.3  # a header's lines this much taller than the page's median are a title
MAX_GROW_ROWS = 3  # rows a table may grow by on each side


def _iou1(a, b) -> float:
    return float(_iou(np.array([a], dtype=np.float64), np.array(b, dtype=np.float64))[0])


def settle_tables(boxes: Sequence[LayoutBox], layout_score: float) -> list[LayoutBox]:
    """Low-scored tables kept only as another reading of a found block;
    tables inside better tables and same-block duplicates of other types
    dropped. Order kept."""
    sure = [b for b in boxes if b.type != "table" or b.score >= layout_score]
    keep: list[bool] = []
    for b in boxes:
        if b.type == "table" and b.score < layout_score:
            keep.append(any(o.type != "table" and _iou1(b.box, o.box) >= TWIN_IOU for o in sure))
        else:
            keep.append(True)
    for j, b in enumerate(boxes):
        if not keep[j]:
            continue
        for k, o in enumerate(boxes):
            if k == j or not keep[k] or o.score < b.score or (o.score == b.score and k > j):
                continue
            if b.type == "table" and o.type == "table" and _cover(b.box, o.box) >= SWALLOWED:
                keep[j] = False
            elif b.type != "table" and o.type != "table" and _iou1(b.box, o.box) >= TWIN_IOU:
                keep[j] = False
            if not keep[j]:
                break
    return [b for b, k in zip(boxes, keep) if k]


def _height(box) -> float:
    return box[3] - box[1]


def ink_height(gray: np.ndarray, box) -> int:
    """Rows of dark pixels (under the crop's mid grey, in 1% of its
    width or more) from the first to the last, in a line's box."""
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    crop = gray[max(0, y0):max(0, y1), max(0, x0):max(0, x1)]
    if crop.size == 0:
        return 0
    dark = crop < (int(crop.min()) + int(crop.max())) / 2
    rows = np.flatnonzero(dark.mean(axis=1) > 0.01)
    return 0 if rows.size == 0 else int(rows[-1] - rows[0] + 1)


def header_titles(boxes: Sequence[LayoutBox], lines: Sequence[TextLine], gray: np.ndarray) -> list[LayoutBox]:
    """A `header` whose lines' ink is TITLE_HEIGHT x the page's median
    line's (or taller) becomes a `title`."""
    if not lines or not any(b.type == "header" for b in boxes):
        return list(boxes)
    lbs = [xyxy(line.box) for line in lines]
    inks = [ink_height(gray, lb) for lb in lbs]
    median = float(np.median(inks))
    out = []
    for b in boxes:
        if b.type == "header":
            mine = [h for lb, h in zip(lbs, inks) if _cover(lb, b.box) >= MIN_COVER]
            if mine and median > 0 and float(np.median(mine)) >= TITLE_HEIGHT * median:
                b = replace(b, type="title")
        out.append(b)
    return out


def _columns(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping x-intervals merged: the table's columns."""
    cols: list[list[float]] = []
    for a, z in sorted(spans):
        if cols and a <= cols[-1][1]:
            cols[-1][1] = max(cols[-1][1], z)
        else:
            cols.append([a, z])
    return [(a, z) for a, z in cols]


def _row_fits(row: list[tuple[float, ...]], cols: list[tuple[float, float]]) -> bool:
    """Each line over exactly one column, no column twice, at least two
    lines and half the columns."""
    hit = []
    for b in row:
        over = [k for k, (a, z) in enumerate(cols) if min(b[2], z) > max(b[0], a)]
        if len(over) != 1:
            return False
        hit.append(over[0])
    return len(row) >= 2 and len(set(hit)) == len(hit) and 2 * len(hit) >= len(cols)


def grow_table(box: tuple[float, float, float, float], lbs: list[tuple[float, ...]]) -> tuple[float, ...]:
    """The table box grown over the rows of lines next to it that fall in
    its columns (a header row above, a last row below)."""
    x0, y0, x1, y1 = box
    inside = [b for b in lbs if _cover(b, box) >= MIN_COVER]
    if len(inside) < 2:
        return box
    cols = _columns([(b[0], b[2]) for b in inside])
    h = float(np.median([_height(b) for b in inside]))
    pad = h / 4
    x0, y0 = min(x0, min(b[0] for b in inside)), min(y0, min(b[1] for b in inside))
    x1, y1 = max(x1, max(b[2] for b in inside)), max(y1, max(b[3] for b in inside))
    for up in (True, False):
        for _ in range(MAX_GROW_ROWS):
            cur = (x0, y0, x1, y1)
            out = [b for b in lbs if _cover(b, cur) < MIN_COVER and min(b[2], x1) > max(b[0], x0)]
            if up:
                near = [b for b in out if b[3] <= y0 + h / 2 and b[3] >= y0 - h]
                if not near:
                    break
                edge = max(b[3] for b in near)
                row = [b for b in near if b[3] > edge - h / 2]
            else:
                near = [b for b in out if b[1] >= y1 - h / 2 and b[1] <= y1 + h]
                if not near:
                    break
                edge = min(b[1] for b in near)
                row = [b for b in near if b[1] < edge + h / 2]
            if not _row_fits(row, cols):
                break
            x0 = min(x0, min(b[0] for b in row) - pad)
            x1 = max(x1, max(b[2] for b in row) + pad)
            if up:
                y0 = min(b[1] for b in row) - pad
            else:
                y1 = max(b[3] for b in row) + pad
    return (x0, y0, x1, y1)


def settle_layout(boxes: Sequence[LayoutBox], lines: Sequence[TextLine], layout_score: float,
                  page_bgr: np.ndarray) -> list[LayoutBox]:
    """All of the above, in that order (see the module's docstring)."""
    gray = cv2.cvtColor(page_bgr, cv2.COLOR_BGR2GRAY) if page_bgr.ndim == 3 else page_bgr
    settled = header_titles(settle_tables(boxes, layout_score), lines, gray)
    lbs = [tuple(xyxy(line.box)) for line in lines]
    return [replace(b, box=tuple(float(v) for v in grow_table(b.box, lbs))) if b.type == "table" else b
            for b in settled]
