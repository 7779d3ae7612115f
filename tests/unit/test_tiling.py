"""Long images in tiles (serve_app.ocr.tiling): which images, the tiles,
and the merging of boxes two neighbouring tiles both saw."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.core.engine_config import PipelineOptions
from serve_app.ocr.tiling import (
    Tile, merge_tile_boxes, plan_tiles, prepare_tiled, tile_long_side, tiled_scale, wants_tiles,
)

OPTS = PipelineOptions()


def quad(x0, y0, x1, y1):
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)


@pytest.mark.parametrize("h, w, tiled", [
    (7200, 1600, True),    # a long receipt
    (2532, 1170, True),    # a phone screenshot (2.16:1, over 1920 px)
    (54, 4668, True),      # a banner
    (1600, 1200, False),   # a photo
    (1890, 503, False),    # long side under tile_min_long
    (3000, 2000, False),   # large but not long
    (30, 700, False),      # a line crop
])
def test_which_images_are_tiled(h, w, tiled):
    assert wants_tiles(h, w, OPTS) is tiled
    assert wants_tiles(h, w, PipelineOptions(tile_aspect=0)) is False


def test_tiles_cover_the_long_side_with_overlap():
    for h, w in [(7200, 1600), (1600, 7200), (2532, 1170), (54, 4668), (20000, 1080)]:
        size = tile_long_side(h, w, 1280)
        tiles = plan_tiles(h, w, size, 0.15)
        vertical = h >= w
        spans = [(t.y0, t.y1) if vertical else (t.x0, t.x1) for t in tiles]
        assert spans[0][0] == 0 and spans[-1][1] == max(h, w)
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert a1 - b0 >= 0.15 * size - 1  # neighbours overlap
            assert b0 > a0
        for t in tiles:  # whole short side, one tile length each
            assert (t.x0, t.x1) == (0, w) if vertical else (t.y0, t.y1) == (0, h)
            assert (t.y1 - t.y0 if vertical else t.x1 - t.x0) == size


def test_tile_length_is_the_short_side_but_at_least_the_top_rung():
    assert tile_long_side(7200, 1600, 1280) == 1600
    assert tile_long_side(54, 4668, 1280) == 1280


def test_working_image_of_a_tiled_read_is_bounded():
    assert tiled_scale(7200, 1600, OPTS) == 1.0  # short side 1600 within max_side_len 2000
    assert tiled_scale(12000, 3000, OPTS) == pytest.approx(min(2000 / 3000, (16e6 / 36e6) ** 0.5))
    s = tiled_scale(20000, 1080, OPTS)
    assert 20000 * 1080 * s * s <= 16e6 + 1
    work, (sx, sy), tiles = prepare_tiled(np.zeros((12000, 3000, 3), np.uint8), OPTS, 1280)
    assert work.shape[0] * work.shape[1] <= 16e6 and min(work.shape[:2]) <= 2000
    assert sx == pytest.approx(3000 / work.shape[1]) and sy == pytest.approx(12000 / work.shape[0])
    assert tiles[-1].y1 == work.shape[0]


def test_a_line_seen_by_both_tiles_is_one_box():
    tiles = [Tile(0, 1000, 0, 800), Tile(850, 1850, 0, 800)]  # overlap rows 850..1000
    line_in_overlap = quad(10, 900, 700, 930)
    other = quad(10, 100, 500, 130)
    boxes = merge_tile_boxes(tiles, [np.stack([other, line_in_overlap]), np.stack([line_in_overlap + 1])])
    assert len(boxes) == 2


def test_two_close_lines_in_the_overlap_stay_two():
    tiles = [Tile(0, 1000, 0, 800), Tile(850, 1850, 0, 800)]
    a, b = quad(10, 900, 700, 925), quad(10, 930, 700, 955)
    boxes = merge_tile_boxes(tiles, [np.stack([a, b]), np.stack([a, b])])
    assert len(boxes) == 2


def test_a_line_cut_at_seams_is_joined_across_three_tiles():
    tiles = [Tile(0, 50, 0, 1280), Tile(0, 50, 1000, 2280), Tile(0, 50, 2000, 3280)]
    pieces = [np.stack([quad(5, 10, 1279, 40)]), np.stack([quad(1000, 11, 2279, 40)]),
              np.stack([quad(2000, 10, 3100, 41)])]
    boxes = merge_tile_boxes(tiles, pieces)
    assert len(boxes) == 1
    xs, ys = boxes[0][:, 0], boxes[0][:, 1]
    assert xs.min() == pytest.approx(5, abs=1) and xs.max() == pytest.approx(3100, abs=1)
    assert ys.min() == pytest.approx(10, abs=1) and ys.max() == pytest.approx(41, abs=1)


def test_boxes_outside_the_overlap_are_kept_as_they_are():
    tiles = [Tile(0, 1000, 0, 800), Tile(850, 1850, 0, 800)]
    a, b = quad(10, 100, 300, 130), quad(10, 1500, 300, 1530)
    boxes = merge_tile_boxes(tiles, [np.stack([a]), np.stack([b])])
    assert sorted(float(x[0, 1]) for x in boxes) == [100.0, 1500.0]
    assert merge_tile_boxes(tiles, [np.zeros((0, 4, 2)), np.zeros((0, 4, 2))]).shape == (0, 4, 2)


def test_a_grid_covers_both_sides():
    from serve_app.ocr.tiling import plan_grid

    tiles = plan_grid(3508, 2480, 1280, 0.15)  # an A4 scan at 300 DPI
    assert len(tiles) == 4 * 3
    assert {(t.y0, t.y1) for t in tiles} >= {(0, 1280)} and max(t.y1 for t in tiles) == 3508
    assert max(t.x1 for t in tiles) == 2480
    assert plan_grid(1300, 800, 1280, 0.15) == [Tile(0, 1300, 0, 800)]  # within 5%: one tile
    from serve_app.ocr.tiling import grid_count

    for h, w, t in [(3508, 2480, 1280), (1300, 800, 1280), (7300, 5475, 640), (900, 20000, 96), (50, 50, 32)]:
        assert grid_count(h, w, t, 0.15) == len(plan_grid(h, w, t, 0.15))


def test_second_pass_only_for_small_text_that_more_pixels_would_help():
    from serve_app.ocr.tiling import finer_scale

    lines = np.stack([quad(10, 20 * i, 400, 20 * i + 12) for i in range(20)])  # 12 px high lines
    # shrunk to 0.5 (6 px in the detector's input): again at 22/12 of the original
    assert finer_scale(lines, 0.5, (2560, 1800), OPTS) == pytest.approx(22 / 12)
    # the detector saw them at full size or more: 12 px, and no big gain from more pixels
    assert finer_scale(lines, 1.0, (1280, 900), OPTS) == 0.0
    # too few lines to judge; large text; switched off
    assert finer_scale(lines[:5], 0.5, (2560, 1800), OPTS) == 0.0
    tall = np.stack([quad(10, 50 * i, 400, 50 * i + 40) for i in range(20)])
    assert finer_scale(tall, 0.5, (2560, 1800), OPTS) == 0.0
    assert finer_scale(lines, 0.5, (2560, 1800), PipelineOptions(fine_text_px=0)) == 0.0
    # never past tile_max_pixels
    s = finer_scale(lines, 0.3, (6000, 4000), OPTS)
    assert 6000 * 4000 * s * s <= 16e6 + 1


# -- bounded tiles (issue 24, item 2) --------------------------------------------------


@pytest.mark.parametrize("h, w", [(300_000, 1), (40_000_000, 1), (1, 300_000), (60, 30_000), (100, 50_000),
                                  (1280, 31_000), (2000, 20_000), (7200, 1600)])
def test_tiles_per_image_are_capped(h, w):
    from serve_app.ocr.tiling import tile_count, tiled_plan

    opts = PipelineOptions(max_tiles=32)
    n = tile_count(h, w, opts, 1280)
    assert 1 <= n <= 32
    if wants_tiles(h, w, opts):
        ratio, hh, ww, tiles = tiled_plan(h, w, opts, 1280)
        assert len(tiles) == n and ratio <= 1.0
        long = max(hh, ww)
        starts = sorted((t.y0 if hh >= ww else t.x0) for t in tiles)
        ends = sorted((t.y1 if hh >= ww else t.x1) for t in tiles)
        assert starts[0] == 0 and ends[-1] == long  # the whole working image is covered


def test_an_image_within_the_cap_keeps_its_resolution_and_one_over_it_is_read_smaller():
    from serve_app.ocr.tiling import tiled_plan

    assert tiled_plan(7200, 1600, PipelineOptions(), 1280)[0] == 1.0  # a receipt: 5 tiles, full resolution
    ratio, _, _, tiles = tiled_plan(100, 50_000, PipelineOptions(max_tiles=8), 1280)
    assert ratio < 0.3 and len(tiles) <= 8
    work, _, tiles = prepare_tiled(np.zeros((100, 50_000, 3), np.uint8), PipelineOptions(max_tiles=8), 1280)
    assert len(tiles) <= 8 and work.shape[1] < 15_000


def test_an_image_longer_than_max_aspect_is_refused_before_decoding():
    import io

    from PIL import Image

    from serve_app.core.engine_config import ImageLimits
    from serve_app.core.errors import BadImage
    from serve_app.ocr.image_header import check_image_header
    from serve_app.ocr.decode import decode_image

    buf = io.BytesIO()
    Image.new("L", (300_000, 1), 255).save(buf, "PNG", optimize=True)
    data = buf.getvalue()
    assert len(data) < 1000
    for check in (decode_image, check_image_header):
        with pytest.raises(BadImage, match="300000x1 px: its long side is over 500 times its short side"):
            check(data, ImageLimits())
    # a line crop of text is not
    buf = io.BytesIO()
    Image.new("L", (4000, 40), 255).save(buf, "PNG")
    assert decode_image(buf.getvalue(), ImageLimits()).shape == (40, 4000, 3)


# -- bounded work per image (issue 38, item 6) -------------------------------------------


@pytest.mark.parametrize("rung", [32, 320, 640, 960, 1280, 4096])
@pytest.mark.parametrize("h, w", [(7300, 5475), (6000, 4000), (40_000, 1000), (3508, 2480)])
def test_the_fine_grid_is_capped_at_every_rung(rung, h, w):
    from serve_app.ocr.tiling import fine_tiles_at_most, grid_scale, plan_grid

    opts = PipelineOptions(max_tiles=32)
    for scale in (2.0, 1.0, 0.63, 0.3):
        s = grid_scale(h, w, scale, opts, rung)
        assert 0 < s <= scale
        assert len(plan_grid(max(1, round(h * s)), max(1, round(w * s)), rung, opts.tile_overlap)) <= 32
    assert 1 <= fine_tiles_at_most(h, w, opts, rung) <= 32
    assert fine_tiles_at_most(h, w, PipelineOptions(fine_text_px=0), rung) == 0


def test_a_40_mp_page_at_limit_side_len_640_is_detected_again_in_at_most_max_tiles():
    from serve_app.ocr.tiling import finer_scale, plan_grid, prepare_grid

    opts = PipelineOptions()
    h, w = 7300, 5475  # 40 MP
    lines = np.stack([quad(10, 30 * i, 900, 30 * i + 14) for i in range(40)])  # 14 px lines
    det_scale = 640 / 7300
    uncapped = min(opts.fine_target_px / 14, (opts.tile_max_pixels / (h * w)) ** 0.5)
    assert len(plan_grid(round(h * uncapped), round(w * uncapped), 640, opts.tile_overlap)) > 60  # before: 64-66
    s = finer_scale(lines, det_scale, (h, w), opts, 640)
    assert det_scale * 1.25 <= s < uncapped
    work, (sx, sy), tiles = prepare_grid(np.zeros((h // 4, w // 4, 3), np.uint8), s * 4, opts, 640)
    assert len(tiles) <= opts.max_tiles
    assert max(t.y1 for t in tiles) == work.shape[0] and max(t.x1 for t in tiles) == work.shape[1]


def _merge_all_pairs(tiles, boxes, min_iou=0.5):
    """The merge's reference: every box of every overlapping tile pair
    against every other (what merge_tile_boxes did before its index)."""
    flat = [b for bs in boxes for b in np.asarray(bs, np.float32).reshape(-1, 4, 2)]
    owner = [k for k, bs in enumerate(boxes) for _ in np.asarray(bs).reshape(-1, 4, 2)]
    parent = list(range(len(flat)))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    def iou(a, b, band):
        ca = (max(a[0], band[0]), max(a[1], band[1]), min(a[2], band[2]), min(a[3], band[3]))
        cb = (max(b[0], band[0]), max(b[1], band[1]), min(b[2], band[2]), min(b[3], band[3]))
        area = lambda r: max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])  # noqa: E731
        if area(ca) <= 0 or area(cb) <= 0:
            return 0.0
        inter = area((max(ca[0], cb[0]), max(ca[1], cb[1]), min(ca[2], cb[2]), min(ca[3], cb[3])))
        return inter / (area(ca) + area(cb) - inter)

    rect = [(float(b[:, 0].min()), float(b[:, 1].min()), float(b[:, 0].max()), float(b[:, 1].max())) for b in flat]
    for i in range(len(flat)):
        for j in range(len(flat)):
            a, b = tiles[owner[i]], tiles[owner[j]]
            if owner[i] >= owner[j]:
                continue
            band = (max(a.x0, b.x0), max(a.y0, b.y0), min(a.x1, b.x1), min(a.y1, b.y1))
            if band[2] > band[0] and band[3] > band[1] and iou(rect[i], rect[j], band) >= min_iou:
                parent[find(j)] = find(i)
    return sorted(sorted(i for i in range(len(flat)) if find(i) == r) for r in set(find(i) for i in range(len(flat))))


def _random_grid_boxes(tiles, per_tile, rng, big=0):
    out = []
    for t in tiles:
        bs = []
        for k in range(per_tile):
            hh = 12 if k >= big else rng.uniform(200, 600)  # a few boxes over many index cells
            y, x, ww = rng.uniform(t.y0, t.y1 - hh), rng.uniform(t.x0, t.x1 - 100), rng.uniform(30, 600)
            bs.append(quad(x, y, min(x + ww, t.x1), y + hh))
        out.append(np.stack(bs))
    return out


@pytest.mark.parametrize("seed, big", [(0, 0), (1, 3), (2, 40)])
def test_the_indexed_merge_groups_the_boxes_as_all_pairs_do(seed, big):
    from serve_app.ocr import tiling
    from serve_app.ocr.tiling import plan_grid

    rng = np.random.default_rng(seed)
    tiles = plan_grid(1800, 1500, 640, 0.15)
    boxes = _random_grid_boxes(tiles, 40, rng, big)
    # the same groups: count boxes per output as the union of the reference's groups
    want = _merge_all_pairs(tiles, boxes)
    got = tiling.merge_tile_boxes(tiles, boxes)
    assert len(got) == len(want)


def test_the_merge_compares_each_box_with_few_others():
    """140 tiles x 150 boxes (the all-pairs merge: ~25 s on this machine,
    GIL held): each box is compared with a handful of its neighbours, not
    with every box of each overlapping tile."""
    from serve_app.ocr import tiling
    from serve_app.ocr.tiling import plan_grid

    rng = np.random.default_rng(0)
    tiles = plan_grid(7300, 5475, 640, 0.15)
    boxes = _random_grid_boxes(tiles, 150, rng)
    compared = [0]
    real = tiling._iou_rows

    def counting(a, b):
        compared[0] += len(b)
        return real(a, b)

    tiling._iou_rows = counting
    try:
        out = tiling.merge_tile_boxes(tiles, boxes)
    finally:
        tiling._iou_rows = real
    n = sum(len(b) for b in boxes)
    assert 0 < len(out) < n  # some lines seen twice were merged
    assert compared[0] < 10 * n  # all pairs: ~150 x 150 per overlapping pair of tiles (> 100 n)
