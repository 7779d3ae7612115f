"""Page orientation: whether a page was turned 90, 180 or 270 degrees, from
what the pipeline already saw, and the geometry between the turned image
and its upright view. Pure numpy/OpenCV.

No page-orientation model ships with the PP-OCRv4 weights, so each line
read casts a vote from its geometry and the direction classifier's call on
its crop (serve_app.ocr.crop turns a tall crop 90 degrees
counter-clockwise before classifying it):

| line's crop      | classifier | the page is turned (clockwise) |
|------------------|------------|--------------------------------|
| wide             | upright    | 0                              |
| wide             | 180        | 180                            |
| tall (vertical)  | upright    | 90                             |
| tall (vertical)  | 180        | 270                            |

weighted by its characters times its score. "Wide" and "tall" stand for
the direction the line was read along in the image (its crop's x axis): a
slanted line's quad may start at another corner, and its crop then already
runs along it without the 90-degree turn; it votes the way it was read.
A page is called turned when one angle other than 0 has at least
`min_share` of the weight, from at least `min_lines` lines or `min_chars`
characters. The pipeline then reads
the page again upright and keeps that reading only if the recogniser reads
it at least `accept` times as well (characters times score) and the lines
of that reading vote upright in their turn: a page of vertical Chinese
columns votes 90 but reads no better turned, and stays as it is. `orientation` in an answer is the angle the page was turned clockwise
(rotate it that much counter-clockwise to see it upright)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import cv2
import numpy as np

ANGLES = (0, 90, 180, 270)


@dataclass(frozen=True)
class OrientationParams:
    min_share: float = 0.6
    min_lines: int = 2
    min_chars: int = 12
    accept: float = 0.97


@dataclass(frozen=True)
class Vote:
    angle: int
    weight: float  # characters x score


def line_vote(vertical: bool, flipped: bool, chars: int, score: float, box=None) -> Vote:
    """A line's vote: the way it was read, turned to the page's angle. With
    its box (tl, tr, br, bl as the crop was cut), from the direction the
    recogniser read along in the image, so that a slanted line whose quad
    starts at another corner (its crop then already runs along it, not
    turned) votes the way it was read; without, from the table above."""
    if box is None:
        angle = (90 if vertical else 0) + (180 if flipped else 0)
    else:
        angle = reading_angle(box, vertical, flipped)
    return Vote(angle, max(0, chars) * float(score))


def reading_angle(box, vertical: bool, flipped: bool) -> int:
    """The direction a line was read along in the image (its crop's x axis:
    tl -> tr, or tr -> br for a crop turned 90 degrees; backwards if the
    classifier turned it 180), to the nearest of 0, 90, 180, 270 degrees
    clockwise from +x (image y runs down)."""
    tl, tr, br, _ = np.asarray(box, dtype=np.float64)[:4]
    d = (br - tr) if vertical else (tr - tl)
    if flipped:
        d = -d
    if not np.any(d):
        return 0
    return int(round(np.degrees(np.arctan2(d[1], d[0])) / 90.0)) % 4 * 90


def decide(votes: Sequence[Vote], params: OrientationParams = OrientationParams()) -> int:
    """The page's angle (0, 90, 180, 270) from its lines' votes."""
    weight = {a: 0.0 for a in ANGLES}
    lines = {a: 0 for a in ANGLES}
    for v in votes:
        weight[v.angle] += v.weight
        lines[v.angle] += 1
    total = sum(weight.values())
    if total <= 0:
        return 0
    best = max(ANGLES, key=lambda a: weight[a])
    if best == 0 or weight[best] < params.min_share * total:
        return 0
    chars = sum(v.weight for v in votes if v.angle == best)  # a lower bound on the characters (score <= 1)
    if lines[best] < params.min_lines and chars < params.min_chars:
        return 0
    return best


def quality(lines: Sequence) -> float:
    """How well a reading went: characters (spaces not counted) times score,
    over its lines. Spaces are left out: the same line read from a crop cut
    another way round may come with its word gaps where the upright reading
    ran the words together, and that is no better a reading of the page."""
    return float(sum(len("".join(line.text.split())) * line.score for line in lines))


_TO_UPRIGHT = {90: cv2.ROTATE_90_COUNTERCLOCKWISE, 180: cv2.ROTATE_180, 270: cv2.ROTATE_90_CLOCKWISE}


def upright(img: np.ndarray, angle: int) -> np.ndarray:
    """The image of a page turned `angle` degrees clockwise, turned back."""
    return img if angle == 0 else np.ascontiguousarray(cv2.rotate(img, _TO_UPRIGHT[angle]))


def to_original(points: np.ndarray, angle: int, w: int, h: int) -> np.ndarray:
    """Points (..., 2) in the upright view -> the original image's pixels
    (w x h: the original's size)."""
    p = np.asarray(points, dtype=np.float64)
    x, y = p[..., 0], p[..., 1]
    if angle == 0:
        out = (x, y)
    elif angle == 90:  # upright = original turned counter-clockwise
        out = (w - y, x)
    elif angle == 180:
        out = (w - x, h - y)
    elif angle == 270:
        out = (y, h - x)
    else:
        raise ValueError(f"angle must be one of {ANGLES}, got {angle}")
    return np.stack(out, axis=-1)


def to_upright(points: np.ndarray, angle: int, w: int, h: int) -> np.ndarray:
    """The inverse of to_original: original pixels -> the upright view."""
    p = np.asarray(points, dtype=np.float64)
    x, y = p[..., 0], p[..., 1]
    if angle == 0:
        out = (x, y)
    elif angle == 90:
        out = (y, w - x)
    elif angle == 180:
        out = (w - x, h - y)
    elif angle == 270:
        out = (h - y, x)
    else:
        raise ValueError(f"angle must be one of {ANGLES}, got {angle}")
    return np.stack(out, axis=-1)


def move_box(box, angle: int, w: int, h: int, to=to_original) -> list[list[float]]:
    """A quad moved by `to` (to_original, or to_upright), clockwise from its top-left corner there."""
    from serve_app.ocr.db_postprocess import order_clockwise

    moved = order_clockwise(to(np.asarray(box, dtype=np.float64), angle, w, h).astype(np.float32))
    return np.round(moved.astype(np.float64), 1).tolist()


def turn_lines(lines: Sequence, angle: int, w: int, h: int, to=to_original) -> tuple:
    """Lines read in the upright view, their boxes (and their characters'
    and words') moved into the original image's pixels (w x h), each box
    clockwise from its top-left corner in that image (`to=to_upright`: the
    original's lines into the upright view)."""
    from dataclasses import replace

    def move(box) -> list[list[float]]:
        return move_box(box, angle, w, h, to)

    out = []
    for line in lines:
        chars = None if line.chars is None else tuple(replace(c, box=move(c.box)) for c in line.chars)
        words = None if line.words is None else tuple(replace(wd, box=move(wd.box)) for wd in line.words)
        out.append(replace(line, box=move(line.box), chars=chars, words=words))
    return tuple(out)
