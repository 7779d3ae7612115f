"""TextDetector over a stand-in predictor: images of one input shape share
predictor batches (at most det.batch_size), and text the network "sees" in
the padding is never returned. No Ray, no models."""

from __future__ import annotations

import numpy as np

from serve_app.core.engine_config import DetOptions
from serve_app.inference.runners import TextDetector


class ProbPredictor:
    """Returns, for each input, a probability map that is 1 on a block
    [y0:y1, x0:x1] in input coordinates, and records the batch shapes."""

    name = "det"
    load_seconds = 0.0

    def __init__(self, block):
        self.block = block
        self.batches: list[tuple] = []

    def run(self, x):
        self.batches.append(x.shape)
        y0, y1, x0, x1 = self.block
        out = np.zeros((x.shape[0], 1, x.shape[2], x.shape[3]), np.float32)
        out[:, :, y0:y1, x0:x1] = 1.0
        return out


def test_a_block_inside_the_image_is_found_where_it_is():
    pred = ProbPredictor((100, 140, 200, 600))  # inside the 720 rows of a 720x1280 image
    boxes = TextDetector(pred, DetOptions()).detect([np.zeros((720, 1280, 3), np.uint8)])[0]
    assert pred.batches == [(1, 3, 960, 1280)]  # padded input
    assert len(boxes) == 1
    x0, y0 = boxes[0].min(axis=0)
    x1, y1 = boxes[0].max(axis=0)
    # the block grown by the unclip ratio (about 29 px here), in image coordinates (not scaled by
    # the padded height: that would put y1 near 127)
    assert 160 <= x0 <= 180 and 620 <= x1 <= 640 and 60 <= y0 <= 80 and 160 <= y1 <= 180


def test_nothing_is_found_in_the_padding():
    pred = ProbPredictor((800, 900, 200, 600))  # rows 800-900: below the image, in the padding
    boxes = TextDetector(pred, DetOptions()).detect([np.zeros((720, 1280, 3), np.uint8)])[0]
    assert len(boxes) == 0


def test_images_of_one_shape_share_predictor_batches_of_at_most_batch_size():
    pred = ProbPredictor((0, 0, 0, 0))
    seen = []
    det = TextDetector(pred, DetOptions(batch_size=2), on_batch=lambda n, s: seen.append(n))
    images = [np.zeros((720, 1280, 3), np.uint8), np.zeros((700, 1250, 3), np.uint8),  # both 960x1280
              np.zeros((100, 100, 3), np.uint8),  # 640x640
              np.zeros((760, 1300, 3), np.uint8)]  # 960x1280 again
    out = det.detect(images)
    assert len(out) == 4 and all(len(b) == 0 for b in out)
    assert sorted(pred.batches) == [(1, 3, 640, 640), (1, 3, 960, 1280), (2, 3, 960, 1280)]
    assert sorted(seen) == [1, 1, 2]


class BlockPredictor(ProbPredictor):
    """1.0 on one block and `faint` on another, to tell thresholds apart."""

    def __init__(self, block, faint_block, faint):
        super().__init__(block)
        self.faint_block, self.faint = faint_block, faint

    def run(self, x):
        out = super().run(x)
        y0, y1, x0, x1 = self.faint_block
        out[:, :, y0:y1, x0:x1] = self.faint
        return out


def test_requests_with_other_thresholds_share_a_batch_and_each_gets_its_own_boxes():
    """The thresholds are post-processing: images of one input shape run as
    one predictor batch whatever their options, and each image's boxes are
    what it gets alone with its own options."""
    from serve_app.core.request_options import DetParams

    image = np.zeros((720, 1280, 3), np.uint8)
    strict, default = DetParams(box_thresh=0.8), DetParams()
    alone = {}
    for p in (strict, default):
        alone[p] = TextDetector(BlockPredictor((100, 140, 200, 600), (300, 340, 200, 600), 0.6),
                                DetOptions()).detect([image], [p])[0]
    assert len(alone[strict]) == 1 and len(alone[default]) == 2  # the 0.6 block is under 0.8, over 0.5
    pred = BlockPredictor((100, 140, 200, 600), (300, 340, 200, 600), 0.6)
    out = TextDetector(pred, DetOptions(batch_size=4)).detect([image, image, image], [strict, default, strict])
    assert pred.batches == [(3, 3, 960, 1280)]  # one batch
    for got, p in zip(out, [strict, default, strict]):
        np.testing.assert_array_equal(got, alone[p])


def test_a_lower_limit_side_len_picks_a_smaller_warmed_shape_and_separates_the_batch():
    from serve_app.core.request_options import DetParams

    pred = ProbPredictor((0, 0, 0, 0))
    det = TextDetector(pred, DetOptions(batch_size=4))
    image = np.zeros((720, 1280, 3), np.uint8)
    det.detect([image, image, image], [DetParams(), DetParams(limit_side_len=700), DetParams(box_thresh=0.9)])
    assert sorted(pred.batches) == [(1, 3, 480, 640), (2, 3, 960, 1280)]


def test_a_core_warm_up_runs_the_largest_input_only_and_full_runs_every_one_largest_first():
    from serve_app.ocr.det_preprocess import det_input_shapes

    opts = DetOptions(batch_size=2)
    every = det_input_shapes(opts)
    for core, expected in ((False, len(every) * 2), (True, 2)):
        pred = ProbPredictor((0, 0, 0, 0))
        det = TextDetector(pred, opts)
        for fn, arg in det.warm_calls([], core=core):
            fn(arg)
        assert len(pred.batches) == expected
        sizes = [b[2] * b[3] for b in pred.batches]
        assert sizes[0] == max(h * w for h, w in every)  # the largest first: the heap's high-water mark
        assert sorted({b[0] for b in pred.batches}) == [1, 2]  # every batch size at that shape
