"""Detection pre-processing: working-size resizes, letterbox, mapping boxes
back, the detector's input size and batch padding."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from serve_app.core.engine_config import DetOptions, EngineConfig, PipelineOptions, for_model
from serve_app.ocr.det_preprocess import (
    Geometry, boxes_to_original, det_input_shapes, det_input_size, det_layout, det_preprocess, pad_image, prepare_image,
)


def quad(x0, y0, x1, y1) -> list[list[float]]:
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


# --- det_input_size --------------------------------------------------------------------

MAX_960 = DetOptions(limit_type="max", limit_side_len=960)
MIN_736 = DetOptions(limit_side_len=736, limit_type="min")


@pytest.mark.parametrize(
    "h, w, expected",
    [
        (1000, 2000, (480, 960)),  # ratio 0.48
        (960, 960, (960, 960)),  # at the limit: unchanged
        (961, 100, (960, 96)),  # int(959.0) -> 960; int(99.9) = 99 -> 96
        (100, 50, (96, 64)),  # under the limit: only rounded to 32 (3.125 -> 3, 1.5625 -> 2)
        (16, 16, (32, 32)),  # at least 32
        (48, 80, (64, 64)),  # Python's round(): 1.5 -> 2 and 2.5 -> 2, as in PaddleOCR
    ],
)
def test_det_input_size_limit_max(h, w, expected):
    assert det_input_size(h, w, MAX_960) == expected


@pytest.mark.parametrize(
    "h, w, expected",
    [
        (100, 200, (736, 1472)),  # short side scaled up to 736
        (50, 37, (992, 736)),  # ratio 736/37: int(994.6) = 994 -> 992
        (1000, 800, (992, 800)),  # short side already over 736: only rounded
        (736, 2000, (736, 1984)),
    ],
)
def test_det_input_size_limit_min(h, w, expected):
    assert det_input_size(h, w, MIN_736) == expected


def test_det_preprocess_normalises_to_minus_one_one_in_channel_first_order():
    img = np.zeros((40, 70, 3), dtype=np.uint8)
    img[...] = (0, 255, 127)
    x, valid = det_preprocess(img, MAX_960)
    assert x.shape == (3, 32, 64) and valid == (32, 64)
    assert x.dtype == np.float32
    assert x.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(x[0], -1.0)
    np.testing.assert_allclose(x[1], 1.0)
    np.testing.assert_allclose(x[2], 127 / 127.5 - 1.0, atol=1e-6)


# --- prepare_image and boxes_to_original ------------------------------------------------------


def test_small_image_is_scaled_up_to_min_side_len():
    # 65 wide, 11 high: short side 11 < 30, ratio 30/11 -> int(30.0) = 30 -> 32
    # rows and int(177.27) = 177 -> 192 columns. Now 32 > 30 high and 6:1,
    # so no letterbox.
    img = np.full((11, 65, 3), 200, dtype=np.uint8)
    work, g = prepare_image(img, PipelineOptions())
    assert work.shape == (32, 192, 3)
    assert g == Geometry(65 / 192, 11 / 32, 0, 65, 11)
    mapped = boxes_to_original(np.array([quad(0, 0, 192, 32), quad(96, 16, 192, 32)], dtype=np.float32), g)
    np.testing.assert_allclose(mapped[0], quad(0, 0, 65, 11), atol=1e-4)
    np.testing.assert_allclose(mapped[1], quad(32.5, 5.5, 65, 11), atol=1e-4)


def test_small_image_is_letterboxed_when_not_scaled_up():
    # min_side_len off: 11 high <= 30, so padded to max(int(65/8), 30) * 2 = 60
    # rows: int((60 - 11) / 2) = 24 black rows above and below.
    img = np.full((11, 65, 3), 200, dtype=np.uint8)
    work, g = prepare_image(img, PipelineOptions(min_side_len=0))
    assert work.shape == (59, 65, 3)
    assert g == Geometry(1.0, 1.0, 24, 65, 11)
    assert np.all(work[:24] == 0) and np.all(work[35:] == 0)
    np.testing.assert_array_equal(work[24:35], img)
    mapped = boxes_to_original(np.array([quad(3, 24, 60, 35)], dtype=np.float32), g)
    np.testing.assert_allclose(mapped[0], quad(3, 0, 60, 11))


def test_flat_image_is_scaled_up_and_letterboxed():
    # 300 x 11: ratio 30/11 -> 32 rows, int(818.18) = 818 -> 832 columns.
    # 832 / 32 = 26 > 8, so letterboxed to max(int(832/8), 30) * 2 = 208 rows:
    # int((208 - 32) / 2) = 88 black rows above and below.
    img = np.full((11, 300, 3), 200, dtype=np.uint8)
    work, g = prepare_image(img, PipelineOptions())
    assert work.shape == (208, 832, 3)
    assert g == Geometry(300 / 832, 11 / 32, 88, 300, 11)
    assert np.all(work[:88] == 0) and np.all(work[120:] == 0)
    assert np.all(work[88:120] == 200)
    boxes = np.array(
        [
            quad(0, 88, 832, 120),  # the whole image band
            quad(416, 104, 624, 120),  # x 150..225, y (104-88) * 11/32 = 5.5 .. 11
            quad(100, 10, 200, 200),  # reaching into the padding: clipped
        ],
        dtype=np.float32,
    )
    mapped = boxes_to_original(boxes, g)
    assert mapped.dtype == np.float32
    np.testing.assert_allclose(mapped[0], quad(0, 0, 300, 11), atol=1e-4)
    np.testing.assert_allclose(mapped[1], quad(150, 5.5, 225, 11), atol=1e-4)
    np.testing.assert_allclose(mapped[2], quad(100 * 300 / 832, 0, 200 * 300 / 832, 11), atol=1e-4)


def test_large_image_is_scaled_down_to_max_side_len():
    img = np.zeros((3000, 1000, 3), dtype=np.uint8)
    work, g = prepare_image(img, PipelineOptions())
    # ratio 2000/3000: 2000 -> 1984 (62.5 rounds to 62), int(666.67) = 666 -> 672
    assert work.shape == (1984, 672, 3)
    assert g == Geometry(1000 / 672, 3000 / 1984, 0, 1000, 3000)
    mapped = boxes_to_original(np.array([quad(336, 992, 672, 1984)], dtype=np.float32), g)
    np.testing.assert_allclose(mapped[0], quad(500, 1500, 1000, 3000), rtol=1e-6)


def test_ordinary_image_is_left_alone():
    img = np.random.default_rng(0).integers(0, 256, (100, 200, 3), dtype=np.uint8)
    work, g = prepare_image(img, PipelineOptions())
    assert work is img
    assert g == Geometry(1.0, 1.0, 0, 200, 100)


def test_boxes_to_original_of_no_boxes():
    out = boxes_to_original(np.zeros((0, 4, 2), dtype=np.float32), Geometry(2.0, 2.0, 5, 10, 10))
    assert out.shape == (0, 4, 2)
    assert out.dtype == np.float32


def test_boxes_to_original_does_not_modify_its_input():
    boxes = np.array([quad(10, 20, 30, 40)], dtype=np.float32)
    boxes_to_original(boxes, Geometry(2.0, 0.5, 4, 1000, 1000))
    np.testing.assert_array_equal(boxes[0], quad(10, 20, 30, 40))


LADDER = DetOptions()  # the default: "ladder", rungs 640/960/1280, min_side 256, short_steps 4


def test_the_ladder_is_a_small_closed_set_of_multiples_of_32():
    shapes = det_input_shapes(LADDER)
    assert len(shapes) == 21
    assert all(h % 32 == 0 and w % 32 == 0 and max(h, w) in (640, 960, 1280) for h, w in shapes)
    assert det_input_shapes(MAX_960) == [] and det_input_shapes(MIN_736) == []  # open modes


@pytest.mark.parametrize("h, w, resized, padded", [
    (720, 1280, (720, 1280), (960, 1280)),  # a 16:9 photo: long side on a rung, short padded to 3/4
    (1008, 675, (1280, 857), (1280, 960)),  # a dense page: long side up to the next rung
    (3024, 4032, (960, 1280), (960, 1280)),  # a big photo: the last rung
    (26, 67, (373, 960), (512, 960)),  # a word crop: short side up to min_side 256 -> long 660 -> rung 960
    (11, 65, (217, 1280), (320, 1280)),  # tinier: min_side would need long 1513; the last rung bounds it
    (30, 2000, (19, 1280), (320, 1280)),  # a strip: the last rung bounds it
    (1, 1, (640, 640), (640, 640)),
])
def test_ladder_layout(h, w, resized, padded):
    assert det_layout(h, w, LADDER) == (resized, padded)


def test_every_image_size_lands_in_the_closed_set():
    rng = np.random.default_rng(0)
    shapes = set(det_input_shapes(LADDER))
    sizes = [(int(a), int(b)) for a, b in rng.integers(1, 5000, size=(2000, 2))]
    sizes += [(1, 3000), (3000, 1), (20, 4000), (4000, 200), (64, 64)]
    for h, w in sizes:
        (rh, rw), (ih, iw) = det_layout(h, w, LADDER)
        assert (ih, iw) in shapes, (h, w)
        assert rh <= ih and rw <= iw
        # aspect ratio kept (within the rounding of the short side to a pixel)
        assert abs(min(rh, rw) - max(rh, rw) * min(h, w) / max(h, w)) <= 0.5 or min(rh, rw) == 1, (h, w)


@pytest.mark.parametrize("pad, value", [("mean", 0.0), ("zero", -1.0)])
def test_ladder_padding_is_at_the_bottom_and_right_and_reported(pad, value):
    img = np.full((720, 1280, 3), 255, np.uint8)
    x, valid = det_preprocess(img, DetOptions(pad=pad))
    assert x.shape == (3, 960, 1280) and valid == (720, 1280)
    np.testing.assert_allclose(x[:, :720], 1.0)
    np.testing.assert_allclose(x[:, 720:], value, atol=0.01)


def test_replicate_padding_makes_no_edge():
    img = np.zeros((720, 1280, 3), np.uint8)
    img[-1] = 200  # the last row: replicated into the padding
    x, _ = det_preprocess(img, DetOptions(pad="replicate"))
    np.testing.assert_allclose(x[:, 720:], x[:, 719:720].repeat(240, axis=1))


def test_thin_images_stay_small_in_the_pipeline():
    """A 2000x1 image was upscaled to 60000x30 and letterboxed to 15000x60000
    (2.7 GB) before anything checked it; the working size is now bounded by
    max_side_len whatever the aspect ratio."""
    opts = PipelineOptions()
    for h, w in [(1, 2000), (2000, 1), (1, 3000), (3000, 1), (5, 40000), (40000, 5)]:
        work, g = prepare_image(np.zeros((h, w, 3), np.uint8), opts)
        assert max(work.shape[:2]) <= 2016 and work.nbytes < 13_000_000, (h, w, work.shape)
        (_, _), (ih, iw) = det_layout(*work.shape[:2], LADDER)
        assert max(ih, iw) <= 1280


@pytest.mark.parametrize("mean, std", [((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
def test_the_input_is_the_normalised_image_channel_first(mean, std):
    # (x - mean) * inv_std in float32, as normalising the HxWx3 image and transposing it: the same numbers.
    img = np.random.default_rng(1).integers(0, 256, size=(700, 1000, 3), dtype=np.uint8)
    opts = DetOptions(mean=mean, std=std)
    x, (vh, vw) = det_preprocess(img, opts)
    (rh, rw), (ih, iw) = det_layout(700, 1000, opts)
    padded = pad_image(cv2.resize(img, (rw, rh)), ih, iw, opts.pad)
    m = np.asarray(mean, np.float32) * 255.0
    inv = 1.0 / (np.asarray(std, np.float32) * 255.0)
    want = ((padded.astype(np.float32) - m) * inv).transpose(2, 0, 1)
    assert x.dtype == np.float32 and x.flags["C_CONTIGUOUS"] and (vh, vw) == (rh, rw)
    np.testing.assert_array_equal(x, want)


@pytest.mark.parametrize("hw, v4, small, tiny", [
    ((36, 300), (320, 1280), (256, 960), (160, 640)),  # a text line: v4 scales it up to the last rung
    ((40, 600), (320, 1280), (160, 640), (160, 640)),
    ((720, 1280), (960, 1280), (960, 1280), (960, 1280)),  # a photo: the same input for every set
])
def test_v6_sets_scale_a_line_up_less_than_v4_within_the_same_closed_shapes(hw, v4, small, tiny):
    base = EngineConfig()
    img = np.zeros((*hw, 3), np.uint8)
    for name, want in (("ppocrv4_mobile", v4), ("ppocrv6_small", small), ("ppocrv6_tiny", tiny)):
        cfg = for_model(base, name)
        work, _ = prepare_image(img, cfg.pipeline)
        assert det_layout(*work.shape[:2], cfg.det)[1] == want, name
        assert det_input_shapes(cfg.det) == det_input_shapes(base.det)  # nothing new to warm
