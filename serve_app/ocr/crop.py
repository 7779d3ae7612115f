"""Cut a text line out of the image along its (possibly rotated) quad."""

from __future__ import annotations

import cv2
import numpy as np


def quad_size(box: np.ndarray) -> tuple[int, int]:
    pts = np.asarray(box, dtype=np.float32)
    w = int(max(np.linalg.norm(pts[0] - pts[1]), np.linalg.norm(pts[2] - pts[3])))
    h = int(max(np.linalg.norm(pts[0] - pts[3]), np.linalg.norm(pts[1] - pts[2])))
    return max(w, 1), max(h, 1)


def is_vertical(box: np.ndarray) -> bool:
    """Whether crop_quad turns this box's crop by 90 degrees."""
    w, h = quad_size(box)
    return h / w >= 1.5


def char_quad(box: np.ndarray, start: float, end: float, vertical: bool, flipped: bool) -> np.ndarray:
    """The part of `box` between fractions `start` and `end` along the
    direction the recogniser read it (left to right in the crop, after the
    crop's 90-degree turn if vertical and 180-degree turn if flipped)."""
    tl, tr, br, bl = np.asarray(box, dtype=np.float32)
    if vertical:  # np.rot90: crop x runs down the original; crop top is the right edge
        top_a, top_b, bot_a, bot_b = tr, br, tl, bl
    else:
        top_a, top_b, bot_a, bot_b = tl, tr, bl, br
    if flipped:  # read upside down: crop x runs backwards, top and bottom swap
        top_a, top_b, bot_a, bot_b = bot_b, bot_a, top_b, top_a
    def at(a, b, f):
        return a + (b - a) * f
    return np.array([at(top_a, top_b, start), at(top_a, top_b, end), at(bot_a, bot_b, end), at(bot_a, bot_b, start)])


def crop_quad(img: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Perspective-warp the quad (tl, tr, br, bl) to an upright rectangle.
    Crops at least 1.5x taller than wide are turned 90 degrees (vertical
    text) so the recogniser reads along the line."""
    pts = np.asarray(box, dtype=np.float32)
    w, h = quad_size(pts)
    dst = np.array([[0, 0], [w, 0], [w, h], [0, h]], dtype=np.float32)
    m = cv2.getPerspectiveTransform(pts, dst)
    out = cv2.warpPerspective(img, m, (w, h), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    if h / w >= 1.5:
        out = np.rot90(out)
    return np.ascontiguousarray(out)
