"""crop_quad: perspective crops of text lines; quad_size, is_vertical and
char_quad, the geometry the engine uses for per-character boxes."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from serve_app.ocr.crop import char_quad, crop_quad, is_vertical, quad_size


def noise(h=60, w=80, seed=1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def quad(x0, y0, x1, y1) -> np.ndarray:
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float32)


def test_axis_aligned_box_gives_exactly_that_region():
    img = noise()
    out = crop_quad(img, quad(10, 5, 40, 20))
    assert out.shape == (15, 30, 3)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, img[5:20, 10:40])
    assert out.flags["C_CONTIGUOUS"]


def test_box_touching_the_image_edges():
    img = noise()
    out = crop_quad(img, quad(0, 0, 80, 60))
    np.testing.assert_array_equal(out, img)


def test_box_of_float_corners_as_a_list():
    img = noise()
    out = crop_quad(img, [[10.0, 5.0], [40.0, 5.0], [40.0, 20.0], [10.0, 20.0]])
    np.testing.assert_array_equal(out, img[5:20, 10:40])


def test_tall_box_is_turned_90_degrees_counter_clockwise():
    img = noise()
    out = crop_quad(img, quad(10, 5, 20, 45))  # 10 wide, 40 tall
    assert out.shape == (10, 40, 3)
    np.testing.assert_array_equal(out, np.rot90(img[5:45, 10:20]))
    # The crop's top-left pixel is the region's top-right one.
    np.testing.assert_array_equal(out[0, 0], img[5, 19])
    assert out.flags["C_CONTIGUOUS"]


def test_rotation_threshold_is_a_ratio_of_1_5():
    img = noise()
    assert crop_quad(img, quad(10, 5, 20, 19)).shape == (14, 10, 3)  # 1.4: kept upright
    assert crop_quad(img, quad(10, 5, 20, 20)).shape == (10, 15, 3)  # 1.5: turned


def test_rotated_quad_gives_its_side_lengths_and_its_content():
    # A 50 x 10 rectangle along direction (0.8, 0.6), filled with one colour.
    img = np.zeros((100, 100, 3), dtype=np.uint8)
    box = np.array([[20, 10], [60, 40], [54, 48], [14, 18]], dtype=np.float32)
    cv2.fillPoly(img, [box.astype(np.int32)], (0, 200, 100))
    out = crop_quad(img, box)
    assert out.shape == (10, 50, 3)
    # Inside (one pixel in from the edges, where the fill's own rasterisation
    # and the cubic kernel blur), the crop is the fill colour.
    inner = out[2:-2, 2:-2].reshape(-1, 3).astype(int)
    assert np.all(np.abs(inner - [0, 200, 100]) <= 6)


def test_degenerate_box_gives_at_least_one_pixel():
    img = noise()
    out = crop_quad(img, np.array([[10, 10], [10.5, 10], [10.5, 10.5], [10, 10.5]], dtype=np.float32))
    assert out.shape[:2] == (1, 1)


# --- quad_size, is_vertical -------------------------------------------------------------


def test_quad_size_is_the_longer_of_each_pair_of_opposite_sides():
    assert quad_size(quad(10, 5, 40, 20)) == (30, 15)
    # A 3-4-5 tilt: top side (0,0)-(30,40) is 50 long, the left side 10.
    assert quad_size(np.array([[0, 0], [30, 40], [22, 46], [-8, 6]], dtype=np.float32)) == (50, 10)
    # A trapezoid: top 20, bottom 30 -> width 30.
    assert quad_size(np.array([[5, 0], [25, 0], [30, 10], [0, 10]], dtype=np.float32))[0] == 30
    assert quad_size(np.zeros((4, 2), dtype=np.float32)) == (1, 1)


@pytest.mark.parametrize("y1, vertical", [(19, False), (20, True), (45, True)])
def test_is_vertical_says_whether_crop_quad_turns_the_crop(y1, vertical):
    box = quad(10, 5, 20, y1)  # 10 wide, 14 / 15 / 40 tall
    assert is_vertical(box) is vertical
    h, w = crop_quad(noise(), box).shape[:2]
    assert (w > h) is vertical  # turned crops come out wider than tall


# --- char_quad ----------------------------------------------------------------------------
# A character's box: the part of the line between fractions start and end of
# the way the recogniser read it. Checked against what crop_quad shows the
# recogniser: the same fraction of the crop's width is the same pixels.


def span(q: np.ndarray) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) of an axis-aligned quad in any corner order."""
    q = np.asarray(q)
    return (*q.min(axis=0).tolist(), *q.max(axis=0).tolist())


def test_char_quad_of_an_upright_line_runs_left_to_right():
    box = quad(10, 5, 40, 20)  # 30 x 15
    q = char_quad(box, 0.25, 0.5, vertical=False, flipped=False)
    assert q.tolist() == [[17.5, 5], [25, 5], [25, 20], [17.5, 20]]
    assert span(char_quad(box, 0.0, 0.5, False, False)) == (10, 5, 25, 20)
    img = noise()
    np.testing.assert_array_equal(crop_quad(img, box)[:, :15], img[5:20, 10:25])


def test_char_quad_of_a_flipped_line_runs_right_to_left():
    box = quad(10, 5, 40, 20)
    q = char_quad(box, 0.0, 0.5, vertical=False, flipped=True)
    # Read upside down: the first half read is the right half, corners turned too.
    assert q.tolist() == [[40, 20], [25, 20], [25, 5], [40, 5]]
    img = noise()
    read = np.rot90(crop_quad(img, box), 2)  # what the recogniser saw after the turn
    np.testing.assert_array_equal(read[:, :15], np.rot90(img[5:20, 25:40], 2))


def test_char_quad_of_a_vertical_line_runs_top_to_bottom():
    box = quad(10, 5, 20, 45)  # 10 wide, 40 tall: turned 90 degrees
    q = char_quad(box, 0.0, 0.5, vertical=True, flipped=False)
    assert q.tolist() == [[20, 5], [20, 25], [10, 25], [10, 5]]
    img = noise()
    np.testing.assert_array_equal(crop_quad(img, box)[:, :20], np.rot90(img[5:25, 10:20]))


def test_char_quad_of_a_flipped_vertical_line_runs_bottom_to_top():
    box = quad(10, 5, 20, 45)
    q = char_quad(box, 0.0, 0.25, vertical=True, flipped=True)
    assert span(q) == (10, 35, 20, 45)
    img = noise()
    read = np.rot90(crop_quad(img, box), 2)
    np.testing.assert_array_equal(read[:, :10], np.rot90(np.rot90(img[35:45, 10:20]), 2))


def test_char_quads_of_consecutive_fractions_tile_the_line():
    box = np.array([[0, 0], [30, 40], [22, 46], [-8, 6]], dtype=np.float32)
    parts = [char_quad(box, i / 5, (i + 1) / 5, False, False) for i in range(5)]
    for a, b in zip(parts, parts[1:]):
        np.testing.assert_allclose(a[[1, 2]], b[[0, 3]])  # right edge of one = left edge of the next
    np.testing.assert_allclose(parts[0][[0, 3]], box[[0, 3]])
    np.testing.assert_allclose(parts[-1][[1, 2]], box[[1, 2]])
