"""Reading order: top to bottom, and left to right within a line."""

from __future__ import annotations

import numpy as np


def reading_order(boxes: np.ndarray, same_line_px: float = 10.0) -> list[int]:
    """Indices of boxes in reading order. Boxes are sorted by their top-left
    corner (y, then x); a box whose top-left y is within `same_line_px` of the
    previous one and lies to its left moves before it."""
    n = len(boxes)
    order = sorted(range(n), key=lambda i: (boxes[i][0][1], boxes[i][0][0]))
    for i in range(n - 1):
        for j in range(i, -1, -1):
            a, b = boxes[order[j]], boxes[order[j + 1]]
            if abs(b[0][1] - a[0][1]) < same_line_px and b[0][0] < a[0][0]:
                order[j], order[j + 1] = order[j + 1], order[j]
            else:
                break
    return order
