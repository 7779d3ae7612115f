"""The three models as plain classes: pre-process, one predictor call per
batch, post-process. Used in-process by the engine and wrapped, thinly, by
the Serve deployments."""

from __future__ import annotations

import math

import numpy as np

from .config import ClsOptions, DetOptions, RecOptions
from .predictor import Predictor
from .stages.db_postprocess import db_boxes
from .stages.det_preprocess import det_preprocess, pad_batch
from .stages.direction import cls_postprocess, cls_preprocess
from .stages.recognition import batch_width, ctc_decode, rec_preprocess, width_order
from .types import Direction, Recognition


class TextDetector:
    def __init__(self, predictor: Predictor, opts: DetOptions):
        self.predictor = predictor
        self.opts = opts

    def detect(self, images: list[np.ndarray]) -> list[np.ndarray]:
        """Boxes (N,4,2 float32, image coordinates) for each image. Images are
        run as one batch, zero-padded bottom-right to the largest input size;
        each probability map is cut back to its own image before DB."""
        if not images:
            return []
        tensors = [det_preprocess(img, self.opts) for img in images]
        probs = self.predictor.run(pad_batch(tensors))
        out = []
        for img, t, p in zip(images, tensors, probs):
            h, w = t.shape[1:]
            boxes, _ = db_boxes(p[0, :h, :w], img.shape[1], img.shape[0], self.opts)
            out.append(boxes)
        return out


class DirectionClassifier:
    def __init__(self, predictor: Predictor, opts: ClsOptions):
        self.predictor = predictor
        self.opts = opts

    def classify(self, crops: list[np.ndarray]) -> list[Direction]:
        result: list[Direction] = [Direction("0", 0.0)] * len(crops)
        order = width_order(crops)
        for start in range(0, len(order), self.opts.batch_size):
            idx = order[start : start + self.opts.batch_size]
            batch = np.stack([cls_preprocess(crops[i], self.opts) for i in idx])
            for i, d in zip(idx, cls_postprocess(self.predictor.run(batch), self.opts)):
                result[i] = d
        return result


class TextRecognizer:
    def __init__(self, predictor: Predictor, opts: RecOptions, charset: list[str]):
        self.predictor = predictor
        self.opts = opts
        self.charset = charset

    def recognize(self, crops: list[np.ndarray]) -> list[Recognition]:
        """Crops are sorted by aspect ratio and read in batches of batch_size,
        each padded to its widest member (rounded up to the width bucket)."""
        result: list[Recognition] = [Recognition("", 0.0)] * len(crops)
        order = width_order(crops)
        for start in range(0, len(order), self.opts.batch_size):
            idx = order[start : start + self.opts.batch_size]
            for i, r in zip(idx, self.recognize_batch([crops[i] for i in idx])):
                result[i] = r
        return result

    def recognize_batch(self, crops: list[np.ndarray]) -> list[Recognition]:
        """One predictor call for all `crops` (callers choose the batch)."""
        if not crops:
            return []
        ratios = [c.shape[1] / float(c.shape[0]) for c in crops]
        width = batch_width(ratios, self.opts)
        batch = np.stack([rec_preprocess(c, width, self.opts) for c in crops])
        fracs = [min(1.0, math.ceil(self.opts.image_height * r) / width) for r in ratios]
        return ctc_decode(self.predictor.run(batch), self.charset, fracs)
