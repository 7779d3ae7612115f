"""Blocks and a reading order that follows columns: the lines of an upright
page grouped into blocks (columns, paragraphs, a title across columns, a
sidebar) and ordered as a person reads them. Pure numpy over line boxes.

An XY-cut (from an explicit stack, within a work bound) with two guards against the cuts that scramble office
documents:

- A vertical cut (between columns) is made only at a gutter whose sides
  both look like columns of running text (each side at least
  `column_fill` times as wide as the gutter, its lines `text_aspect` times
  as long as high, median), or with running text on one side and, on the
  other, short lines that mostly do not sit on the text's rows (a
  sidebar). A table's narrow columns, a receipt's prices, a form's
  label-value pairs fail it and stay row by row.
- Where a region has no such gutter as a whole (a title spans the page),
  it is cut into horizontal strips, and consecutive strips are joined
  into sections while their column structure holds: a section with a
  gutter keeps the strips that leave it open; a section without one ends
  where a strip with one starts. Each section is then cut again.

What is left (one column of one section) is read top to bottom and left to
right within a row (serve_app.ocr.reading_order), and split into
paragraph blocks where the vertical gap between lines is over
`para_gap` line heights."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from serve_app.ocr.reading_order import reading_order


@dataclass(frozen=True)
class LayoutParams:
    min_gutter: float = 0.8  # a gap between columns: at least this many line heights wide
    column_fill: float = 2.5  # each side of a gutter at least this many times as wide as it
    text_aspect: float = 5.0  # a column's lines (median) at least this many times as long as high
    para_gap: float = 0.9  # a vertical gap of more line heights than this starts a new block
    # Beside running text, a column of short lines (a sidebar) is a column
    # only if under max_paired of its lines sit on the text's rows (centres
    # within row_tolerance line heights): a table's, a receipt's, a form's do.
    max_paired: float = 0.5
    row_tolerance: float = 0.25
    # The cuts' work (lines sorted or compared, summed over every region
    # looked at) is at most this many times the page's lines, plus
    # min_work: past it, each region still to cut is read as one column
    # (top to bottom). A crafted page of nested columns and titles
    # otherwise costs more than quadratic time.
    work_per_line: int = 64
    min_work: int = 20_000


def rects(boxes: np.ndarray) -> np.ndarray:
    """(N, 4) x0, y0, x1, y1 of (N, 4, 2) quads."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4, 2)
    return np.concatenate([b.min(axis=1), b.max(axis=1)], axis=1)


def layout_blocks(boxes: np.ndarray, params: LayoutParams = LayoutParams()) -> list[list[int]]:
    """Blocks of line indices, each in reading order, the blocks in reading
    order (every index once). Regions are cut from an explicit stack (no
    recursion: a page of hundreds of nested columns cannot overflow it)
    within a work bound (LayoutParams.work_per_line)."""
    r = rects(boxes)
    n = len(r)
    if n == 0:
        return []
    sizes = np.minimum(r[:, 2] - r[:, 0], r[:, 3] - r[:, 1])
    line_h = max(1.0, float(np.median(sizes)))
    cutter = _Cutter(r, line_h, params, params.min_work + params.work_per_line * n)
    out: list[list[int]] = []
    stack = [list(range(n))]
    while stack:
        idx = stack.pop()
        parts = cutter.cut(idx)
        if parts is None:
            out.extend(cutter.paragraphs(idx))
        else:
            stack.extend(reversed(parts))
    return out


NUMPY_CALL = 16  # a numpy call on a few lines costs about as much as sorting this many lines


class _OutOfWork(Exception):
    pass


class _Cutter:
    def __init__(self, r: np.ndarray, line_h: float, params: LayoutParams, budget: int):
        self.r, self.h, self.p = r, line_h, params
        self.left = budget  # work left (lines sorted or compared)

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _OutOfWork

    def cut(self, idx: list[int]) -> Optional[list[list[int]]]:
        """idx's parts to cut again, in reading order (its columns, or its
        sections), or None: idx is one column of one section (or the work
        bound is spent), read as paragraphs."""
        if len(idx) <= 1 or self.left < 0:
            return None
        try:
            cols = self.columns(idx)
            if len(cols) > 1:
                return cols
            strips = self.strips(idx)
            if len(strips) > 1:
                sections = self.sections(strips)
                if len(sections) > 1:
                    return sections
        except _OutOfWork:
            return None
        return None

    # -- vertical cuts: columns --------------------------------------------------

    def columns(self, idx: list[int]) -> list[list[int]]:
        """idx split at its valid gutters, left to right (one part if none)."""
        r = self.r
        self.spend(len(idx))
        order = sorted(idx, key=lambda i: r[i, 0])
        # x extents merged into segments; a gap between segments is a candidate
        segs: list[list[int]] = []
        right = -np.inf
        for i in order:
            if segs and r[i, 0] < right:
                segs[-1].append(i)
                right = max(right, r[i, 2])
            else:
                segs.append([i])
                right = r[i, 2]
        if len(segs) < 2:
            return [idx]
        gaps = [self._gap(segs[k], segs[k + 1]) for k in range(len(segs) - 1)]
        cuts = [k for k, g in enumerate(gaps) if g >= self.p.min_gutter * self.h]
        while cuts:
            groups = _split(segs, cuts)
            bad = [k for n, k in enumerate(cuts) if not self._gutter(groups[n], groups[n + 1], gaps[k])]
            if not bad:
                return groups
            cuts.remove(min(bad, key=lambda k: gaps[k]))
        return [idx]

    def _gap(self, left: list[int], right: list[int]) -> float:
        return float(self.r[right, 0].min() - self.r[left, 2].max())

    def _gutter(self, left: list[int], right: list[int], gap: float) -> bool:
        """Whether a gap between left and right separates columns: running
        text on both sides; or running text on one side and, on the other
        (a sidebar, a margin note), lines that mostly do not sit on the
        rows of the first, as a table's, a receipt's or a form's do."""
        # Its lines looked at, and the numpy calls' own cost (each as much as
        # NUMPY_CALL lines): `columns` asks this of every gap again after each
        # gap it drops, so a row of hundreds of lone boxes asked it ~n^2 times
        # (400 boxes: 1 s; 3,000: a minute) before this was counted.
        self.spend(len(left) + len(right) + 4 * NUMPY_CALL)
        a, b = self._text_column(left, gap), self._text_column(right, gap)
        if a and b:
            return True
        if not (a or b):
            return False
        other, text = (right, left) if a else (left, right)
        return self._paired(other, text) < self.p.max_paired

    def _paired(self, idx: list[int], others: list[int]) -> float:
        """The fraction of lines idx that sit on the row of one of others
        (vertical centres within row_tolerance line heights)."""
        r = self.r
        self.spend(len(idx) * max(1, len(others) // 64))  # vectorised over others
        mid = (r[others, 1] + r[others, 3]) / 2
        near = [bool(np.any(np.abs(mid - (r[i, 1] + r[i, 3]) / 2) < self.p.row_tolerance * self.h)) for i in idx]
        return sum(near) / len(near)

    def _text_column(self, idx: list[int], gutter: float) -> bool:
        r = self.r[idx]
        extent = r[:, 2].max() - r[:, 0].min()
        w, h = r[:, 2] - r[:, 0], np.maximum(r[:, 3] - r[:, 1], 1.0)
        return bool(extent >= self.p.column_fill * gutter and np.median(w / h) >= self.p.text_aspect)

    # -- horizontal cuts: strips and sections --------------------------------------

    def strips(self, idx: list[int]) -> list[list[int]]:
        """idx in horizontal bands, top to bottom: lines whose middle halves
        overlap vertically are in one band."""
        r = self.r
        self.spend(len(idx))
        q = (r[:, 3] - r[:, 1]) / 4
        lo, hi = r[:, 1] + q, r[:, 3] - q
        bands: list[list[int]] = []
        bottom = -np.inf
        for i in sorted(idx, key=lambda i: lo[i]):
            if bands and lo[i] < bottom:
                bands[-1].append(i)
                bottom = max(bottom, hi[i])
            else:
                bands.append([i])
                bottom = hi[i]
        return bands

    def sections(self, strips: list[list[int]]) -> list[list[int]]:
        sections = [list(strips[0])]
        open_ = len(self.columns(strips[0])) > 1
        for s in strips[1:]:
            has = len(self.columns(s)) > 1
            joined = sections[-1] + s
            if open_:
                join = len(self.columns(joined)) > 1
            else:
                join = not has
            if join:
                sections[-1] = joined
            else:
                sections.append(list(s))
                open_ = has
        return sections

    # -- one column: paragraphs -------------------------------------------------------

    def paragraphs(self, idx: list[int]) -> list[list[int]]:
        r = self.r
        quads = np.array([[[r[i, 0], r[i, 1]], [r[i, 2], r[i, 1]], [r[i, 2], r[i, 3]], [r[i, 0], r[i, 3]]]
                          for i in idx])
        order = [idx[k] for k in reading_order(quads, same_line_px=max(10.0, 0.5 * self.h))]
        blocks = [[order[0]]]
        bottom = r[order[0], 3]
        for i in order[1:]:
            if r[i, 1] - bottom > self.p.para_gap * self.h:
                blocks.append([i])
            else:
                blocks[-1].append(i)
            bottom = max(bottom, r[i, 3]) if r[i, 1] - bottom <= self.p.para_gap * self.h else r[i, 3]
        return blocks


def _split(segs: list[list[int]], cuts: list[int]) -> list[list[int]]:
    """Segments joined into groups, cut after each segment index in cuts."""
    groups, cur, after = [], [], set(cuts)
    for k, seg in enumerate(segs):
        cur.extend(seg)
        if k in after:
            groups.append(cur)
            cur = []
    groups.append(cur)
    return groups


def block_box(boxes: np.ndarray, idx: list[int]) -> list[list[float]]:
    """The axis-aligned box around lines idx, clockwise from top-left."""
    r = rects(np.asarray(boxes)[idx])
    x0, y0 = float(r[:, 0].min()), float(r[:, 1].min())
    x1, y1 = float(r[:, 2].max()), float(r[:, 3].max())
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def arrange(lines: tuple, angle: int, w: int, h: int, params: LayoutParams = LayoutParams()) -> tuple[tuple, tuple]:
    """Lines (serve_app.core.results.TextLine, boxes in the image's pixels) in
    block order, and their blocks (serve_app.core.results.Block: each block's
    box and the indices of its lines in the returned order). The layout is
    found in the page's upright view (`angle`: how far it was turned
    clockwise; w x h: the image's size)."""
    from serve_app.core.results import Block
    from serve_app.ocr.orientation import to_upright

    if not lines:
        return tuple(lines), ()
    boxes = np.array([line.box for line in lines], dtype=np.float64).reshape(-1, 4, 2)
    blocks = layout_blocks(to_upright(boxes, angle, w, h), params)
    order = [i for b in blocks for i in b]
    out, at = [], 0
    for b in blocks:
        out.append(Block(block_box(boxes, b), tuple(range(at, at + len(b)))))
        at += len(b)
    return tuple(lines[i] for i in order), tuple(out)
