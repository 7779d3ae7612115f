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
from serve_app.structure.layout import LayoutBox
from serve_app.structure.regions import MIN_COVER, SWALLOWED, _cover
from serve_app.structure.table_match import xyxy

TWIN_IOU = 0.7  # two boxes over this IoU are one block read two ways
TITLE_HEIGHT = 1.3  # a header's lines this much taller than the page's median are a title
MAX_GROW_ROWS = 3  # rows a table may grow by on each side


def _pairs(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For boxes (n, 4): IoU (n, n), and cover[j, k], the part of box j inside box k."""
    lt = np.maximum(a[:, None, :2], a[None, :, :2])
    rb = np.minimum(a[:, None, 2:], a[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(axis=1)
    iou = inter / (area[:, None] + area[None, :] - inter + 1e-5)
    return iou, inter / np.maximum(area[:, None], 1e-6)


def settle_tables(boxes: Sequence[LayoutBox], layout_score: float) -> list[LayoutBox]:
    """Low-scored tables kept only as another reading of a found block;
    tables inside better tables and same-block duplicates of other types
    dropped, best first. Order kept."""
    if not boxes:
        return []
    iou, cover = _pairs(np.array([b.box for b in boxes], dtype=np.float64))
    table = np.array([b.type == "table" for b in boxes])
    scores = np.array([b.score for b in boxes])
    low = table & (scores < layout_score)
    keep = ~low
    keep[low] = ((iou[low] >= TWIN_IOU) & ~table & ~low).any(axis=1)
    for j in sorted(range(len(boxes)), key=lambda i: -boxes[i].score):  # stable: the first of equals wins
        if not keep[j]:
            continue
        later = keep.copy()
        later[j] = False  # j drops the worse boxes it is a twin of (or, a table, that lie inside it)
        worse = (scores < scores[j]) | ((scores == scores[j]) & (np.arange(len(boxes)) > j))
        if table[j]:
            gone = later & worse & table & (cover[:, j] >= SWALLOWED)
        else:
            gone = later & worse & ~table & (iou[:, j] >= TWIN_IOU)
        keep &= ~gone
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


def _covers(lbs: np.ndarray, box) -> np.ndarray:
    """The part of each line box (m, 4) inside box."""
    ix = np.minimum(lbs[:, 2], box[2]) - np.maximum(lbs[:, 0], box[0])
    iy = np.minimum(lbs[:, 3], box[3]) - np.maximum(lbs[:, 1], box[1])
    area = np.maximum((lbs[:, 2] - lbs[:, 0]) * (lbs[:, 3] - lbs[:, 1]), 1e-6)
    return np.where((ix > 0) & (iy > 0), ix * iy / area, 0.0)


def grow_table(box: tuple[float, float, float, float], lbs: np.ndarray) -> tuple[float, ...]:
    """The table box grown to enclose the lines (m, 4) it takes and over
    the rows of lines next to it that fall in its columns (a header row
    above, a last row below)."""
    lbs = np.asarray(lbs, dtype=np.float64).reshape(-1, 4)
    x0, y0, x1, y1 = box
    inside = lbs[_covers(lbs, box) >= MIN_COVER]
    if len(inside) < 2:
        return box
    cols = _columns([(b[0], b[2]) for b in inside])
    h = float(np.median(inside[:, 3] - inside[:, 1]))
    pad = h / 4
    x0, y0 = min(x0, float(inside[:, 0].min())), min(y0, float(inside[:, 1].min()))
    x1, y1 = max(x1, float(inside[:, 2].max())), max(y1, float(inside[:, 3].max()))
    for up in (True, False):
        for _ in range(MAX_GROW_ROWS):
            out = lbs[(_covers(lbs, (x0, y0, x1, y1)) < MIN_COVER) & (np.minimum(lbs[:, 2], x1) > np.maximum(lbs[:, 0], x0))]
            if up:
                near = out[(out[:, 3] <= y0 + h / 2) & (out[:, 3] >= y0 - h)]
                row = near[near[:, 3] > near[:, 3].max() - h / 2] if len(near) else near
            else:
                near = out[(out[:, 1] >= y1 - h / 2) & (out[:, 1] <= y1 + h)]
                row = near[near[:, 1] < near[:, 1].min() + h / 2] if len(near) else near
            if not _row_fits([tuple(b) for b in row], cols):
                break
            x0, x1 = min(x0, float(row[:, 0].min()) - pad), max(x1, float(row[:, 2].max()) + pad)
            if up:
                y0 = float(row[:, 1].min()) - pad
            else:
                y1 = float(row[:, 3].max()) + pad
    return (x0, y0, x1, y1)


def settle_layout(boxes: Sequence[LayoutBox], lines: Sequence[TextLine], layout_score: float,
                  page_bgr: np.ndarray) -> list[LayoutBox]:
    """All of the above, in that order (see the module's docstring)."""
    gray = cv2.cvtColor(page_bgr, cv2.COLOR_BGR2GRAY) if page_bgr.ndim == 3 else page_bgr
    settled = header_titles(settle_tables(boxes, layout_score), lines, gray)
    lbs = np.array([xyxy(line.box) for line in lines], dtype=np.float64).reshape(-1, 4)
    return [replace(b, box=tuple(float(v) for v in grow_table(b.box, lbs))) if b.type == "table" else b
            for b in settled]
