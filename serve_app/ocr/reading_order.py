"""Reading order: top to bottom, and left to right within a line."""

from __future__ import annotations

import numpy as np

# Moves of the insertion pass at most this many per box (plus MIN_MOVES):
# a real page's line holds a few dozen boxes, but boxes crafted so that
# every one moves past all before it (a staircase a fraction of a pixel
# per box, right to left) make the pass quadratic: 3,000 of them took 3 s.
MOVES_PER_BOX = 64
MIN_MOVES = 4096


def reading_order(boxes: np.ndarray, same_line_px: float = 10.0) -> list[int]:
    """Indices of boxes in reading order. Boxes are sorted by their top-left
    corner (y, then x); a box whose top-left y is within `same_line_px` of the
    previous one and lies to its left moves before it. Within a bound on
    the moves (MOVES_PER_BOX a box): past it, the boxes are read as rows
    instead (each run of boxes whose top-left y is within same_line_px of
    the run's first, left to right): O(n log n) whatever the boxes."""
    n = len(boxes)
    order = sorted(range(n), key=lambda i: (boxes[i][0][1], boxes[i][0][0]))
    budget = MIN_MOVES + MOVES_PER_BOX * n
    for i in range(n - 1):
        for j in range(i, -1, -1):
            a, b = boxes[order[j]], boxes[order[j + 1]]
            if abs(b[0][1] - a[0][1]) < same_line_px and b[0][0] < a[0][0]:
                order[j], order[j + 1] = order[j + 1], order[j]
                budget -= 1
                if budget < 0:
                    return rows(boxes, same_line_px)
            else:
                break
    return order


def rows(boxes: np.ndarray, same_line_px: float = 10.0) -> list[int]:
    """Boxes sorted by their top-left y, cut into rows (a row starts at a box
    whose top-left y is same_line_px or more below the row's first box),
    each row left to right."""
    order = sorted(range(len(boxes)), key=lambda i: (boxes[i][0][1], boxes[i][0][0]))
    out: list[int] = []
    row: list[int] = []
    for i in order:
        if row and boxes[i][0][1] - boxes[row[0]][0][1] >= same_line_px:
            out.extend(sorted(row, key=lambda k: boxes[k][0][0]))
            row = []
        row.append(i)
    out.extend(sorted(row, key=lambda k: boxes[k][0][0]))
    return out
