"""The models as plain classes: pre-process, one predictor call per
batch, post-process. Used in-process by the engine and wrapped, thinly, by
the Serve deployments."""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

import numpy as np

from serve_app.core.engine_config import ClsOptions, DetOptions, RecOptions, StructureOptions
from serve_app.core.request_options import DetParams
from serve_app.inference.predictor import Predictor
from serve_app.ocr.db_postprocess import db_boxes
from serve_app.ocr.det_preprocess import det_input_shapes, det_preprocess
from serve_app.ocr.direction import cls_combine, cls_postprocess, cls_preprocess, cls_views
from serve_app.ocr.recognition import batch_limit, batch_width, ctc_decode, input_shapes, rec_preprocess, width_order
from serve_app.core.results import Direction, Recognition
from serve_app.structure.layout import LayoutBox, layout_postprocess, layout_preprocess
from serve_app.structure.table_structure import SIDE, TableStructure, table_decode, table_preprocess


class TextDetector:
    def __init__(self, predictor: Predictor, opts: DetOptions,
                 on_batch: Optional[Callable[[int, float], None]] = None):
        self.predictor = predictor
        self.opts = opts
        self.on_batch = on_batch  # told (images, seconds) of every predictor batch

    def detect(self, images: list[np.ndarray], params: Optional[list[DetParams]] = None) -> list[np.ndarray]:
        """Boxes (N,4,2 float32, image coordinates) for each image. `params`:
        each image's request options (None: the config's). Images whose
        detector inputs share a shape run together, in predictor batches of
        at most opts.batch_size, whatever their options: a request's
        limit_side_len only picks the input shape, and the thresholds are
        post-processing, applied per image. The padding in an input (the
        "ladder" mode's) is cropped off the probability map before boxes
        are found, and an image reads the same alone or in a batch."""
        params = params or [DetParams()] * len(images)
        effective: dict[DetParams, DetOptions] = {}
        for p in params:
            if p not in effective:
                effective[p] = p.apply(self.opts)
        opts = [effective[p] for p in params]
        prepared = [det_preprocess(img, o) for img, o in zip(images, opts)]
        groups: dict[tuple, list[int]] = {}
        for i, (t, _) in enumerate(prepared):
            groups.setdefault(t.shape, []).append(i)
        out: list = [None] * len(images)
        for group in groups.values():
            for start in range(0, len(group), self.opts.batch_size):
                idx = group[start : start + self.opts.batch_size]
                t0 = time.perf_counter()
                probs = self.predictor.run(np.stack([prepared[i][0] for i in idx]))
                for i, p in zip(idx, probs):
                    (vh, vw), (h, w) = prepared[i][1], images[i].shape[:2]
                    out[i], _ = db_boxes(p[0][:vh, :vw], w, h, opts[i])
                if self.on_batch is not None:
                    self.on_batch(len(idx), time.perf_counter() - t0)
        return out

    def warm_calls(self, open_shapes: list[tuple[int, int]], core: bool = False) -> list[tuple[Callable, list]]:
        """A call for every input the detector can be given: each batch size
        at each shape of the closed set (or, in the open "max"/"min" modes,
        at `open_shapes`), largest first: each later, smaller shape's buffers
        fit in what the first one freed, instead of the heap growing shape by
        shape (297 MB less at ready in one process: `memory replica`, removed;
        commit 9ed1971 has it).
        core: the largest shape only (its buffers are the heap's high-water
        mark, which every later shape fits in); each other shape's first run
        is then an image's, ~40 ms more than its next ones (the engine
        compiles for open sizes once, at load: `startup cold`, removed; commit 3f6bfa3 has it)."""
        shapes = sorted(det_input_shapes(self.opts) or [tuple(s) for s in open_shapes],
                        key=lambda hw: hw[0] * hw[1], reverse=True)
        if core:
            shapes = shapes[:1]
        return [(self.detect, [np.full((h, w, 3), 255, np.uint8)] * n)
                for h, w in shapes for n in range(1, self.opts.batch_size + 1)]


class DirectionClassifier:
    def __init__(self, predictor: Predictor, opts: ClsOptions):
        self.predictor = predictor
        self.opts = opts

    def classify(self, crops: list[np.ndarray]) -> list[Direction]:
        """One direction per crop; a long line is judged on a few windows
        of it (serve_app.ocr.direction.cls_views), their probabilities
        averaged."""
        views = [cls_views(c, self.opts) for c in crops]
        flat = [v for vs in views for v in vs]
        probs: list = [None] * len(flat)
        order = width_order(flat)
        for start in range(0, len(order), self.opts.batch_size):
            idx = order[start : start + self.opts.batch_size]
            out = self.predictor.run(np.stack([cls_preprocess(flat[i], self.opts) for i in idx]))
            for k, i in enumerate(idx):
                probs[i] = out[k]
        if not flat:
            return []
        return cls_postprocess(cls_combine(np.stack(probs), [len(vs) for vs in views]), self.opts)

    def warm_calls(self) -> list[tuple[Callable, list]]:
        """A call for every batch size the classifier runs (one input size)."""
        crop = np.full((48, 192, 3), 255, np.uint8)
        return [(self.classify, [crop] * n) for n in range(1, self.opts.batch_size + 1)]


class TextRecognizer:
    def __init__(self, predictor: Predictor, opts: RecOptions, charset: list[str]):
        self.predictor = predictor
        self.opts = opts
        self.charset = charset

    def recognize(self, crops: list[np.ndarray]) -> list[Recognition]:
        """Crops are sorted by aspect ratio and read in batches of batch_size.
        With batch_padding "bucket" (default) a batch holds crops of one width
        bucket only, each padded to its own bucket, so a crop reads the same
        whatever else is in the batch; with "batch_max" (RapidOCR's way) a
        batch is padded to its widest member."""
        result: list[Recognition] = [Recognition("", 0.0)] * len(crops)
        order = width_order(crops)
        if self.opts.batch_padding == "bucket":
            runs: dict[int, list[int]] = {}
            for i in order:
                runs.setdefault(batch_width([crops[i].shape[1] / crops[i].shape[0]], self.opts), []).append(i)
            groups = [(batch_limit(w, self.opts), g) for w, g in runs.items()]
        else:
            groups = [(self.opts.batch_size, order)]
        for size, group in groups:
            for start in range(0, len(group), size):
                idx = group[start : start + size]
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

    def warm_shapes(self, open_widths: list[int]) -> list[tuple[int, int]]:
        """Every (batch size, width) a predictor batch can have: each batch
        size at each width of the ladder (batches mix requests, so any size
        meets any width). Without a ladder ("batch_max" padding) the set is
        open: `open_widths` at every batch size."""
        opts = self.opts
        shapes = input_shapes(opts) if opts.batch_padding == "bucket" else []
        return shapes or [(n, w) for w in [opts.image_width, *open_widths] for n in range(1, opts.batch_size + 1)]

    def warm_call(self, shape: tuple[int, int]) -> tuple[Callable, list]:
        """The call that runs one (batch size, width) input."""
        n, w = shape
        return self.recognize_batch, [np.full((self.opts.image_height, w, 3), 255, np.uint8)] * n

    def warm_calls(self, open_widths: list[int]) -> list[tuple[Callable, list]]:
        """A call for every input shape a predictor batch can have (warm_shapes)."""
        return [self.warm_call(s) for s in self.warm_shapes(open_widths)]


class LayoutDetector:
    """Pages -> their layout regions (serve_app.structure.layout: PicoDet on
    CDLA, a fixed 800 x 608 input, so every page is one shape). One page per
    predictor run: the converted graph's reshapes fix its batch at 1."""

    def __init__(self, predictor: Predictor, opts: StructureOptions):
        self.predictor = predictor
        self.opts = opts

    def detect(self, pages: list[np.ndarray]) -> list[list[LayoutBox]]:
        """Each BGR page's regions (boxes in its pixels), at most
        opts.max_regions of them, the best by score, in the order found."""
        out: list[list[LayoutBox]] = []
        for page in pages:
            outputs = self.predictor.run_all(layout_preprocess(page)[None])
            found = layout_postprocess([o[0] for o in outputs], page.shape[:2], self.opts.layout_score,
                                       self.opts.layout_iou, table_thresh=self.opts.table_score)
            out.append(sorted(found, key=lambda b: -b.score)[: self.opts.max_regions])
        return out

    def warm_calls(self) -> list[tuple[Callable, list]]:
        """The one call its one input shape needs."""
        return [(self.detect, [np.full((800, 608, 3), 255, np.uint8)])]


class TableRecognizer:
    """Table crops -> their structure (serve_app.structure.table_structure:
    SLANet_plus, a fixed 488 x 488 input)."""

    def __init__(self, predictor: Predictor, opts: StructureOptions):
        self.predictor = predictor
        self.opts = opts

    def recognize(self, crops: list[np.ndarray]) -> list[TableStructure]:
        """Each BGR crop's structure (cell boxes in the crop's pixels), at
        most opts.max_table_cells cells each (past it: truncated)."""
        out: list[TableStructure] = []
        n = self.opts.table_batch_size
        for start in range(0, len(crops), n):
            part = crops[start:start + n]
            prepared = [table_preprocess(c) for c in part]
            loc, probs = self.predictor.run_all(np.stack([x for x, _ in prepared]))[:2]
            for k, (crop, (_, ratio)) in enumerate(zip(part, prepared)):
                out.append(table_decode(loc[k], probs[k], ratio, crop.shape[:2], self.opts.max_table_cells))
        return out

    def warm_calls(self) -> list[tuple[Callable, list]]:
        """A call for every batch size (one input shape)."""
        crop = np.full((SIDE, SIDE, 3), 255, np.uint8)
        return [(self.recognize, [crop] * n) for n in range(1, self.opts.table_batch_size + 1)]
