"""DB (Differentiable Binarization) post-processing: probability map ->
quadrilateral text boxes. Numerics follow PaddleOCR's db_postprocess.py."""

from __future__ import annotations

import cv2
import numpy as np
import pyclipper
from shapely.geometry import Polygon

from serve_app.core.engine_config import DetOptions


def db_boxes(prob: np.ndarray, dest_w: int, dest_h: int, opts: DetOptions) -> tuple[np.ndarray, list[float]]:
    """prob: HxW probability map for an image shown to the detector at that
    size; boxes come back in dest_w x dest_h coordinates, ordered clockwise
    from top-left, clipped to the image, tiny ones removed."""
    bitmap = (prob > opts.thresh).astype(np.uint8)
    if opts.use_dilation:
        bitmap = cv2.dilate(bitmap, np.ones((2, 2), dtype=np.uint8))
    height, width = bitmap.shape
    contours, _ = cv2.findContours(bitmap * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes, scores = [], []
    for contour in contours[: opts.max_candidates]:
        points, sside = mini_box(contour)
        if sside < opts.min_size:
            continue
        if opts.score_mode == "fast":
            score = box_score_fast(prob, points)
        else:
            score = box_score_slow(prob, contour)
        if score < opts.box_thresh:
            continue
        expanded = unclip(points, opts.unclip_ratio)
        if expanded.size == 0:
            continue
        box, sside = mini_box(expanded.reshape(-1, 1, 2))
        if sside < opts.min_size + 2:
            continue
        box[:, 0] = np.clip(np.round(box[:, 0] / width * dest_w), 0, dest_w)
        box[:, 1] = np.clip(np.round(box[:, 1] / height * dest_h), 0, dest_h)
        boxes.append(box.astype(np.int32))
        scores.append(float(score))
    kept, keep = filter_boxes(np.asarray(boxes, dtype=np.int32).reshape(-1, 4, 2), dest_w, dest_h, with_index=True)
    return kept, [scores[i] for i in keep]


def mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """Minimum-area rectangle of a contour, corners ordered tl, tr, br, bl."""
    rect = cv2.minAreaRect(contour)
    points = sorted(list(cv2.boxPoints(rect)), key=lambda p: p[0])
    i1, i4 = (0, 1) if points[1][1] > points[0][1] else (1, 0)
    i2, i3 = (2, 3) if points[3][1] > points[2][1] else (3, 2)
    return np.array([points[i1], points[i2], points[i3], points[i4]], dtype=np.float32), min(rect[1])


def box_score_fast(prob: np.ndarray, box: np.ndarray) -> float:
    """Mean probability inside the box polygon."""
    h, w = prob.shape
    b = box.copy()
    xmin = int(np.clip(np.floor(b[:, 0].min()), 0, w - 1))
    xmax = int(np.clip(np.ceil(b[:, 0].max()), 0, w - 1))
    ymin = int(np.clip(np.floor(b[:, 1].min()), 0, h - 1))
    ymax = int(np.clip(np.ceil(b[:, 1].max()), 0, h - 1))
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    b[:, 0] -= xmin
    b[:, 1] -= ymin
    cv2.fillPoly(mask, b.reshape(1, -1, 2).astype(np.int32), 1)
    return float(cv2.mean(prob[ymin : ymax + 1, xmin : xmax + 1], mask)[0])


def box_score_slow(prob: np.ndarray, contour: np.ndarray) -> float:
    """Mean probability inside the contour itself (slower, tighter)."""
    h, w = prob.shape
    c = contour.reshape(-1, 2).copy()
    xmin, xmax = int(np.clip(c[:, 0].min(), 0, w - 1)), int(np.clip(c[:, 0].max(), 0, w - 1))
    ymin, ymax = int(np.clip(c[:, 1].min(), 0, h - 1)), int(np.clip(c[:, 1].max(), 0, h - 1))
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    c[:, 0] -= xmin
    c[:, 1] -= ymin
    cv2.fillPoly(mask, c.reshape(1, -1, 2).astype(np.int32), 1)
    return float(cv2.mean(prob[ymin : ymax + 1, xmin : xmax + 1], mask)[0])


def unclip(box: np.ndarray, ratio: float) -> np.ndarray:
    """Grow a polygon by area * ratio / perimeter (the DB paper's offset)."""
    poly = Polygon(box)
    if poly.length == 0:
        return np.zeros((0, 2), dtype=np.float32)
    distance = poly.area * ratio / poly.length
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box.tolist(), pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    paths = offset.Execute(distance)
    if not paths:
        return np.zeros((0, 2), dtype=np.float32)
    return np.array(paths[0], dtype=np.float32)


def order_clockwise(pts: np.ndarray) -> np.ndarray:
    """tl, tr, br, bl: split by x into left and right pairs, then by y."""
    xs = pts[np.argsort(pts[:, 0], kind="stable"), :]
    left, right = xs[:2], xs[2:]
    tl, bl = left[np.argsort(left[:, 1], kind="stable")]
    tr, br = right[np.argsort(right[:, 1], kind="stable")]
    return np.array([tl, tr, br, bl], dtype=np.float32)


def filter_boxes(boxes: np.ndarray, w: int, h: int, with_index: bool = False):
    """Order corners, clip to the image, drop boxes 3 px or thinner. With
    `with_index`, also the indices of the boxes kept."""
    kept, index = [], []
    for i, box in enumerate(boxes):
        b = order_clockwise(box.astype(np.float32))
        b[:, 0] = np.clip(b[:, 0], 0, w - 1).astype(np.int32)
        b[:, 1] = np.clip(b[:, 1], 0, h - 1).astype(np.int32)
        if int(np.linalg.norm(b[0] - b[1])) <= 3 or int(np.linalg.norm(b[0] - b[3])) <= 3:
            continue
        kept.append(b)
        index.append(i)
    out = np.asarray(kept, dtype=np.float32).reshape(-1, 4, 2)
    return (out, index) if with_index else out
