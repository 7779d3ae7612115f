"""DB post-processing on hand-made probability maps.

Expected boxes are derived by hand, for the default DetOptions (thresh 0.3,
box_thresh 0.5, unclip_ratio 1.6, 2x2 dilation):

* A block of 0.9 on rows 10..19, cols 20..39 of a 32x64 map. Thresholding
  then the 2x2 dilation (anchor at the kernel centre, so it grows right and
  down by one pixel) gives rows 10..20, cols 20..40; the contour's min-area
  rectangle has corners (20,10), (40,10), (40,20), (20,20): 20 x 10.
* Score: mean of the map over that rectangle's 21 x 11 = 231 pixels, 200 of
  them 0.9, so 180 / 231 = 0.779 > 0.5.
* Unclip distance = area * ratio / perimeter = 200 * 1.6 / 60 = 5.33, so the
  grown rectangle spans x 14.67..45.33, y 4.67..25.33; pyclipper works on
  integers, which rounds that to x 15..45, y 5..25.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from serve_app.core.engine_config import DetOptions
from serve_app.ocr.db_postprocess import box_score_fast, db_boxes, filter_boxes, mini_box, order_clockwise, unclip

OPTS = DetOptions()


def block_map(h=32, w=64, rows=(10, 20), cols=(20, 40), value=0.9) -> np.ndarray:
    prob = np.zeros((h, w), dtype=np.float32)
    prob[rows[0] : rows[1], cols[0] : cols[1]] = value
    return prob


def quad(x0, y0, x1, y1) -> list[list[float]]:
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def by_top(boxes: np.ndarray) -> np.ndarray:
    """Boxes sorted by top-left y, then x (findContours' order is its own)."""
    return boxes[np.lexsort((boxes[:, 0, 0], boxes[:, 0, 1]))]


def test_single_block_gives_the_unclipped_box():
    boxes, scores = db_boxes(block_map(), 64, 32, OPTS)
    assert boxes.dtype == np.float32
    assert boxes.shape == (1, 4, 2)
    np.testing.assert_array_equal(boxes[0], quad(15, 5, 45, 25))
    assert scores == [pytest.approx(180 / 231, rel=1e-6)]


def test_boxes_are_scaled_to_the_destination_size():
    # The same map for an image shown to the detector at half its size.
    boxes, _ = db_boxes(block_map(), 128, 64, OPTS)
    np.testing.assert_array_equal(boxes[0], quad(30, 10, 90, 50))


def test_without_dilation_the_box_is_one_pixel_smaller_right_and_down():
    # Contour (20,10)-(39,19): 19 x 9, d = 171 * 1.6 / 56 = 4.89 -> x 15..44, y 5..24.
    boxes, scores = db_boxes(block_map(), 64, 32, DetOptions(use_dilation=False))
    np.testing.assert_array_equal(boxes[0], quad(15, 5, 44, 24))
    assert scores == [pytest.approx(0.9, rel=1e-6)]


def test_two_blocks_give_two_boxes_clipped_to_the_image():
    prob = np.zeros((32, 64), dtype=np.float32)
    # 20 x 5 after dilation (rows 5..10, cols 5..25): d = 100 * 1.6 / 50 = 3.2
    prob[5:10, 5:25] = 0.9
    # 30 x 8 after dilation (rows 20..28, cols 30..60): d = 240 * 1.6 / 76 = 5.05,
    # so it grows past the right and bottom edges and is clipped to 63 / 31.
    prob[20:28, 30:60] = 0.8
    boxes, scores = db_boxes(prob, 64, 32, OPTS)
    assert boxes.shape == (2, 4, 2)
    assert len(scores) == 2
    got = by_top(boxes)
    np.testing.assert_array_equal(got[0], quad(2, 2, 28, 13))
    np.testing.assert_array_equal(got[1], quad(25, 15, 63, 31))


def test_block_below_box_thresh_is_dropped():
    # 0.45 clears the binarisation threshold (0.3), so there is a contour, but
    # its score 0.45 * 200 / 231 = 0.39 is under box_thresh 0.5.
    prob = block_map(value=0.45)
    boxes, scores = db_boxes(prob, 64, 32, OPTS)
    assert boxes.shape == (0, 4, 2)
    assert scores == []
    # With a lower box_thresh the same block is kept: the threshold is what drops it.
    boxes, scores = db_boxes(prob, 64, 32, DetOptions(box_thresh=0.3))
    np.testing.assert_array_equal(boxes[0], quad(15, 5, 45, 25))
    assert scores == [pytest.approx(0.45 * 200 / 231, rel=1e-6)]


def test_block_below_thresh_makes_no_contour():
    boxes, scores = db_boxes(block_map(value=0.3), 64, 32, DetOptions(box_thresh=0.1))
    assert boxes.shape == (0, 4, 2)
    assert scores == []


def test_all_zero_map_gives_an_empty_box_array():
    boxes, scores = db_boxes(np.zeros((32, 64), dtype=np.float32), 64, 32, OPTS)
    assert boxes.shape == (0, 4, 2)
    assert boxes.dtype == np.float32
    assert scores == []


def test_thin_line_under_min_size_is_dropped():
    # One row of 0.9: two rows after dilation, a contour of height 1 < min_size 3.
    prob = np.zeros((32, 64), dtype=np.float32)
    prob[10, 5:50] = 0.9
    boxes, _ = db_boxes(prob, 64, 32, OPTS)
    assert boxes.shape == (0, 4, 2)


def three_blocks() -> np.ndarray:
    prob = np.zeros((64, 64), dtype=np.float32)
    prob[4:12, 4:30] = 0.9
    prob[24:32, 4:30] = 0.9
    prob[44:52, 4:30] = 0.9
    return prob


def test_max_candidates_is_respected():
    prob = three_blocks()
    boxes, scores = db_boxes(prob, 64, 64, OPTS)
    assert boxes.shape == (3, 4, 2)
    assert len(scores) == 3
    boxes, scores = db_boxes(prob, 64, 64, DetOptions(max_candidates=2))
    assert boxes.shape == (2, 4, 2)
    assert len(scores) == 2
    boxes, _ = db_boxes(prob, 64, 64, DetOptions(max_candidates=1))
    assert boxes.shape == (1, 4, 2)


def test_slow_score_mode_scores_inside_the_contour():
    # The contour of the dilated block is rows 10..20, cols 20..40 (same as the
    # fast box here), so the slow score equals the fast one: 180 / 231.
    boxes, scores = db_boxes(block_map(), 64, 32, DetOptions(score_mode="slow"))
    np.testing.assert_array_equal(boxes[0], quad(15, 5, 45, 25))
    assert scores == [pytest.approx(180 / 231, rel=1e-6)]


def two_blocks() -> np.ndarray:
    """A 4x4 block at the bottom (found first by findContours) and a 40x20
    block at the top, both 0.9. Their fast scores differ: the dilated 4x4
    block's rectangle covers 5 x 5 = 25 pixels, 16 of them 0.9, so
    14.4 / 25 = 0.576; the 40x20 block's covers 41 x 21 = 861, 800 of them
    0.9, so 720 / 861 = 0.836."""
    prob = np.zeros((64, 64), dtype=np.float32)
    prob[50:54, 10:14] = 0.9
    prob[5:25, 20:60] = 0.9
    return prob


def test_two_blocks_keep_their_own_scores_when_both_are_kept():
    boxes, scores = db_boxes(two_blocks(), 64, 64, OPTS)
    assert boxes.tolist() == [
        [[8, 48], [16, 48], [16, 56], [8, 56]],  # the 4x4 block, first
        [[9, 0], [63, 0], [63, 36], [9, 36]],
    ]
    assert scores == [pytest.approx(14.4 / 25, rel=1e-6), pytest.approx(720 / 861, rel=1e-6)]


def test_scores_stay_aligned_with_boxes_when_a_tiny_box_is_dropped():
    # At a 16x16 destination the 4x4 block is 1 px wide, so filter_boxes
    # drops it; the score left must be the 40x20 block's, not the first one.
    boxes, scores = db_boxes(two_blocks(), 16, 16, OPTS)
    assert boxes.tolist() == [[[2, 0], [15, 0], [15, 9], [2, 9]]]
    assert scores == [pytest.approx(720 / 861, rel=1e-6)]


def test_mini_box_orders_corners_and_reports_the_short_side():
    contour = np.array([[[20, 10]], [[40, 10]], [[40, 20]], [[20, 20]]], dtype=np.int32)
    points, sside = mini_box(contour)
    np.testing.assert_array_equal(points, quad(20, 10, 40, 20))
    assert sside == pytest.approx(10.0)


def test_unclip_grows_by_area_times_ratio_over_perimeter():
    grown = unclip(np.array(quad(20, 10, 40, 20), dtype=np.float32), 1.6)
    # distance 5.33 -> bounds 14.67..45.33 x 4.67..25.33, on pyclipper's integer grid
    assert grown.min(axis=0).tolist() == [15.0, 5.0]
    assert grown.max(axis=0).tolist() == [45.0, 25.0]
    # Ratio 0 leaves the rectangle as it is.
    same = unclip(np.array(quad(20, 10, 40, 20), dtype=np.float32), 0.0)
    assert same.min(axis=0).tolist() == [20.0, 10.0]
    assert same.max(axis=0).tolist() == [40.0, 20.0]


def test_unclip_of_a_degenerate_polygon_is_empty():
    out = unclip(np.array([[5, 5], [5, 5], [5, 5], [5, 5]], dtype=np.float32), 1.6)
    assert out.shape == (0, 2)


def test_box_score_fast_is_the_mean_inside_the_box():
    prob = block_map()
    assert box_score_fast(prob, np.array(quad(20, 10, 39, 19), dtype=np.float32)) == pytest.approx(0.9, rel=1e-6)
    # Twice as wide as the block: 400 pixels, 200 of them 0.9.
    assert box_score_fast(prob, np.array(quad(20, 10, 59, 19), dtype=np.float32)) == pytest.approx(0.45, rel=1e-6)
    assert box_score_fast(prob, np.array(quad(0, 0, 9, 9), dtype=np.float32)) == 0.0


def test_order_clockwise_on_every_shuffle_of_a_rectangle():
    expected = np.array(quad(3, 7, 50, 20), dtype=np.float32)
    for perm in itertools.permutations(range(4)):
        np.testing.assert_array_equal(order_clockwise(expected[list(perm)]), expected, err_msg=str(perm))


def test_order_clockwise_on_a_rotated_rectangle():
    # A 50 x 10 rectangle along direction (0.8, 0.6): tl, tr, br, bl.
    expected = np.array([[20, 10], [60, 40], [54, 48], [14, 18]], dtype=np.float32)
    shuffled = expected[[2, 0, 3, 1]]
    np.testing.assert_array_equal(order_clockwise(shuffled), expected)


def test_filter_boxes_clips_and_drops_thin_boxes():
    boxes = np.array(
        [
            quad(-5, -5, 70, 40),  # clipped to the 64 x 32 image
            quad(10, 10, 13, 30),  # 3 px wide: dropped
            quad(10, 10, 40, 13),  # 3 px high: dropped
            quad(10, 10, 14, 14),  # 4 x 4: kept
        ],
        dtype=np.float32,
    )
    out = filter_boxes(boxes, 64, 32)
    assert out.shape == (2, 4, 2)
    np.testing.assert_array_equal(out[0], quad(0, 0, 63, 31))
    np.testing.assert_array_equal(out[1], quad(10, 10, 14, 14))
    assert filter_boxes(np.zeros((0, 4, 2), dtype=np.float32), 64, 32).shape == (0, 4, 2)
