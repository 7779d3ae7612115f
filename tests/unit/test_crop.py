"""crop_quad: perspective crops of text lines."""

from __future__ import annotations

import cv2
import numpy as np

from serve_app.stages.crop import crop_quad


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
