"""Direction classification's pre- and post-processing on small arrays, for
the default ClsOptions (input 3x48x192, labels "0" and "180", thresh 0.9)."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.core.engine_config import ClsOptions
from serve_app.core.results import Direction
from serve_app.ocr.direction import apply_direction, cls_postprocess, cls_preprocess, is_flipped

OPTS = ClsOptions()


def test_preprocess_scales_to_the_input_height_and_pads_the_width_with_zeros():
    # 24x48 (ratio 2) -> 48 high, ceil(48 * 2) = 96 wide; white is (1 - 0.5) / 0.5 = 1.
    out = cls_preprocess(np.full((24, 48, 3), 255, dtype=np.uint8), OPTS)
    assert out.shape == (3, 48, 192) and out.dtype == np.float32
    assert np.all(out[:, :, :96] == 1.0)
    assert np.all(out[:, :, 96:] == 0.0)


def test_preprocess_keeps_channel_order_and_normalises_to_minus_one_one():
    crop = np.zeros((48, 192, 3), dtype=np.uint8)
    crop[..., 1] = 255
    crop[..., 2] = 51  # (0.2 - 0.5) / 0.5 = -0.6
    out = cls_preprocess(crop, OPTS)
    assert out[0].min() == out[0].max() == -1.0
    assert out[1].min() == out[1].max() == 1.0
    assert out[2] == pytest.approx(np.full((48, 192), -0.6), abs=1e-6)


def test_preprocess_of_a_long_crop_fills_the_width():
    out = cls_preprocess(np.zeros((10, 1000, 3), dtype=np.uint8), OPTS)
    assert np.all(out == -1.0)  # black everywhere, no padding left


def test_preprocess_of_a_narrow_crop_keeps_at_least_its_rounded_up_width():
    # 100x10: 48 * 0.1 = 4.8 -> 5 columns of content, the rest padding.
    out = cls_preprocess(np.zeros((100, 10, 3), dtype=np.uint8), OPTS)
    assert np.all(out[:, :, :5] == -1.0)
    assert np.all(out[:, :, 5:] == 0.0)


def test_postprocess_picks_the_likelier_label_and_its_probability():
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]], dtype=np.float32)
    got = cls_postprocess(probs, OPTS)
    assert [d.label for d in got] == ["0", "180", "0"]  # a tie goes to the first label
    assert [d.score for d in got] == pytest.approx([0.9, 0.8, 0.5])
    assert all(isinstance(d.score, float) for d in got)


def test_postprocess_of_an_empty_batch_is_empty():
    assert cls_postprocess(np.zeros((0, 2), dtype=np.float32), OPTS) == []


@pytest.mark.parametrize(
    "direction, flipped",
    [
        (Direction("180", 0.95), True),
        (Direction("180", 0.9), False),  # at the threshold: not confident enough
        (Direction("180", 0.5), False),
        (Direction("0", 0.99), False),
    ],
)
def test_is_flipped_needs_180_above_the_threshold(direction, flipped):
    assert is_flipped(direction, OPTS) is flipped


def test_threshold_comes_from_the_options():
    assert is_flipped(Direction("180", 0.6), ClsOptions(thresh=0.5)) is True


def test_apply_direction_turns_a_flipped_crop_by_180_degrees():
    crop = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    turned = apply_direction(crop, Direction("180", 0.99), OPTS)
    np.testing.assert_array_equal(turned, crop[::-1, ::-1])
    # Pixel (0, 0) of the turned crop is the original's bottom-right one.
    assert turned[0, 0].tolist() == crop[1, 2].tolist() == [15, 16, 17]


def test_apply_direction_leaves_an_upright_crop_as_it_is():
    crop = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    assert apply_direction(crop, Direction("0", 0.99), OPTS) is crop
    assert apply_direction(crop, Direction("180", 0.9), OPTS) is crop


def test_a_long_line_is_judged_on_windows_of_it_not_squashed():
    from serve_app.core.engine_config import ClsOptions
    from serve_app.ocr.direction import cls_combine, cls_views

    opts = ClsOptions()
    line = np.zeros((20, 20 * 20, 3), np.uint8)  # 20:1
    line[:, :, 0] = np.arange(400)[None, :] % 256
    views = cls_views(line, opts)
    assert len(views) == 3 and all(v.shape == (48, 192, 3) for v in views)
    # the first window starts at the line's start, the last ends at its end
    assert views[0][0, 0, 0] == line[0, 0, 0]
    assert abs(int(views[-1][0, -1, 0]) - int(line[0, -1, 0])) <= 3
    # short crops, and the reference's squashing when switched off: the crop itself
    word = np.zeros((20, 100, 3), np.uint8)
    assert cls_views(word, opts)[0] is word and len(cls_views(word, opts)) == 1
    assert cls_views(line, ClsOptions(window_aspect=0))[0] is line
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.4, 0.6], [1.0, 0.0]], np.float32)
    np.testing.assert_allclose(cls_combine(probs, [1, 3, 1]), [[0.9, 0.1], [0.3, 0.7], [1.0, 0.0]], atol=1e-6)
