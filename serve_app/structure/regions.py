"""A page's layout regions and its recognised lines -> the page's regions
(serve_app.core.results.Region) in reading order.

Each line goes to at most one region: of those that cover at least half of
its box, a table first (a cell's text is the table's, whatever the detector
also found inside it), then the one covering most of it, then the smaller.
A region of another type lying mostly (SWALLOWED) inside a table is left
out: its lines are the table's. Lines no region takes are grouped into "text" regions of their own
(lines that touch, one above the other), so that every line is in a
region. Reading order is a recursive XY cut: the regions are split at the
widest horizontal gap between bands, else at the widest vertical gap
between columns, top to bottom and left to right."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from serve_app.core.results import Region, Table, TextLine
from serve_app.structure.layout import LayoutBox
from serve_app.structure.table_match import quad, xyxy

MIN_COVER = 0.5  # a line goes to a region that covers at least this part of its box
SWALLOWED = 0.8  # a non-table region with this part of its area inside a table is the table's


def _cover(line_box, region_box) -> float:
    """The part of line_box inside region_box."""
    ix = min(line_box[2], region_box[2]) - max(line_box[0], region_box[0])
    iy = min(line_box[3], region_box[3]) - max(line_box[1], region_box[1])
    if ix <= 0 or iy <= 0:
        return 0.0
    area = max(1e-6, (line_box[2] - line_box[0]) * (line_box[3] - line_box[1]))
    return ix * iy / area


def _area(b) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


def swallowed(boxes: Sequence[LayoutBox]) -> set[int]:
    """Indices of the non-table boxes lying mostly inside a table box."""
    tables = [b.box for b in boxes if b.type == "table"]
    return {j for j, b in enumerate(boxes)
            if b.type != "table" and any(_cover(b.box, t) >= SWALLOWED for t in tables)}


def assign_lines(boxes: Sequence[LayoutBox], lines: Sequence[TextLine]) -> list[tuple[int, ...]]:
    """For each layout box, the indices of the lines it takes (ascending)."""
    taken: list[list[int]] = [[] for _ in boxes]
    gone = swallowed(boxes)
    for i, line in enumerate(lines):
        lb = xyxy(line.box)
        best, key = None, None
        for j, b in enumerate(boxes):
            if j in gone:
                continue
            c = _cover(lb, b.box)
            k = (b.type == "table", c, -_area(b.box))
            if c >= MIN_COVER and (key is None or k > key):
                best, key = j, k
        if best is not None:
            taken[best].append(i)
    return [tuple(t) for t in taken]


def _leftover_groups(lines: Sequence[TextLine], free: list[int]) -> list[list[int]]:
    """Free lines grouped: a line joins a group one of whose lines it
    overlaps across and lies at most a line's height below."""
    groups: list[list[int]] = []
    boxes: list[list[float]] = []  # each group's bounding box
    for i in sorted(free, key=lambda k: (xyxy(lines[k].box)[1], xyxy(lines[k].box)[0])):
        b = xyxy(lines[i].box)
        h = b[3] - b[1]
        for g, gb in zip(groups, boxes):
            if min(b[2], gb[2]) > max(b[0], gb[0]) and b[1] - gb[3] <= h and b[3] >= gb[1]:
                g.append(i)
                gb[:] = [min(gb[0], b[0]), min(gb[1], b[1]), max(gb[2], b[2]), max(gb[3], b[3])]
                break
        else:
            groups.append([i])
            boxes.append(list(b))
    return groups


def xy_cut(boxes: np.ndarray) -> list[int]:
    """Reading order of (x0, y0, x1, y1) boxes by recursive XY cut."""
    def cut(idx: list[int]) -> list[int]:
        if len(idx) <= 1:
            return idx
        for axis in (1, 0):  # bands first (split on y), then columns (split on x)
            lo, hi = boxes[idx, axis], boxes[idx, axis + 2]
            order = np.argsort(lo, kind="stable")
            reach, best, at = hi[order[0]], 0.0, None
            for k in range(1, len(order)):
                gap = lo[order[k]] - reach
                if gap > best:
                    best, at = gap, k
                reach = max(reach, hi[order[k]])
            if at is not None:
                first = [idx[i] for i in order[:at]]
                rest = [idx[i] for i in order[at:]]
                return cut(first) + cut(rest)
        # Nothing separates them: top to bottom, then left to right.
        return sorted(idx, key=lambda i: (boxes[i, 1], boxes[i, 0]))
    return cut(list(range(len(boxes))))


def assemble_regions(layout_boxes: Sequence[LayoutBox], lines: Sequence[TextLine],
                     tables: Optional[Mapping[int, Table]] = None,
                     notes: Optional[Mapping[int, str]] = None) -> tuple[Region, ...]:
    """The page's regions in reading order. `tables`: a table's structure
    by its index in `layout_boxes`; `notes`: a region's note by index (a
    bound that left it partial)."""
    tables, notes = tables or {}, notes or {}
    assigned = assign_lines(layout_boxes, lines)
    gone = swallowed(layout_boxes)
    regions: list[tuple[tuple[float, float, float, float], Region]] = []
    for j, (b, idx) in enumerate(zip(layout_boxes, assigned)):
        if j in gone:
            continue
        regions.append((b.box, Region(b.type, quad(b.box), b.score, idx, tables.get(j), notes.get(j))))
    used = {i for idx in assigned for i in idx}
    for g in _leftover_groups(lines, [i for i in range(len(lines)) if i not in used]):
        bs = np.array([xyxy(lines[i].box) for i in g])
        box = (float(bs[:, 0].min()), float(bs[:, 1].min()), float(bs[:, 2].max()), float(bs[:, 3].max()))
        regions.append((box, Region("text", quad(box), 0.0, tuple(sorted(g)))))
    if not regions:
        return ()
    order = xy_cut(np.array([b for b, _ in regions], dtype=np.float64))
    return tuple(regions[i][1] for i in order)
