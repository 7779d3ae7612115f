"""The pure structure stages (serve_app.structure) on small arrays: the layout
decode and NMS, SLANet's token and box decode and its bound, the grid places of
spans, the matcher (a line split at its words, text escaped), the regions (each
line in one region, free lines in text regions, XY-cut order). No models."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.core.results import TextLine, WordBox
from serve_app.structure.layout import INPUT_HW, STRIDES, LayoutBox, hard_nms, layout_postprocess, layout_preprocess
from serve_app.structure.regions import assemble_regions, assign_lines, xy_cut
from serve_app.structure.table_match import grid_places, match_table
from serve_app.structure.table_structure import SIDE, TOKENS, TableStructure, table_decode, table_preprocess

pytestmark = pytest.mark.unit


def q(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def line(text, x0, y0, x1, y1, words=None):
    return TextLine(text, 0.9, q(x0, y0, x1, y1),
                    words=tuple(WordBox(t, q(*b), 0.9) for t, b in words) if words else None)


# -- layout -------------------------------------------------------------------------------


def layout_outputs(hits: dict[tuple[int, int], tuple[int, float, tuple[float, float, float, float]]]):
    """The network's eight outputs for one image: every cell 0 but `hits`
    {(level, cell): (class, score, distances l, t, r, b in stride units)}."""
    in_h, in_w = INPUT_HW
    scores, dists = [], []
    for level, s in enumerate(STRIDES):
        cells = int(np.ceil(in_h / s)) * int(np.ceil(in_w / s))
        sc = np.zeros((cells, 10), np.float32)
        d = np.full((cells, 32), -20.0, np.float32)  # 4 x 8 bins; all mass on bin 0 -> distance 0
        d[:, 0::8] = 20.0
        for (lv, cell), (cls, score, dist) in hits.items():
            if lv != level:
                continue
            sc[cell, cls] = score
            for side, v in enumerate(dist):  # one-hot on bin v
                d[cell, side * 8:(side + 1) * 8] = -20.0
                d[cell, side * 8 + int(v)] = 20.0
        scores.append(sc)
        dists.append(d)
    return scores + dists


def test_layout_decode_puts_a_box_around_its_cell_centre_in_page_pixels():
    # stride 32, cell (row 2, col 3) of a 19-wide map: centre (3.5*32, 2.5*32) = (112, 80) in the input
    cell = 2 * 19 + 3
    out = layout_outputs({(2, cell): (4, 0.9, (1, 1, 2, 1))})
    found = layout_postprocess(out, (1600, 1216))  # the page is twice the input each way
    assert len(found) == 1
    b = found[0]
    assert b.type == "table" and b.score == pytest.approx(0.9)
    assert b.box == pytest.approx(((112 - 32) * 2, (80 - 32) * 2, (112 + 64) * 2, (80 + 32) * 2), abs=1e-3)


def test_layout_nms_keeps_the_better_of_two_overlapping_boxes_of_a_type_and_both_of_two_types():
    out = layout_outputs({(2, 40): (0, 0.9, (2, 2, 2, 2)), (2, 41): (0, 0.8, (2, 2, 2, 2)),
                          (2, 42): (1, 0.7, (2, 2, 2, 2))})
    found = layout_postprocess(out, INPUT_HW)
    assert sorted((b.type, round(b.score, 2)) for b in found) == [("text", 0.9), ("title", 0.7)]
    assert layout_postprocess(out, INPUT_HW, score_thresh=0.95) == []


def test_hard_nms_order_and_keep():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]], float)
    assert hard_nms(boxes, np.array([0.5, 0.9, 0.7]), 0.5) == [1, 2]
    assert hard_nms(boxes, np.array([0.5, 0.9, 0.7]), 0.5, keep=1) == [1]


def test_layout_preprocess_shape_and_normalisation():
    x = layout_preprocess(np.full((100, 50, 3), 255, np.uint8))
    assert x.shape == (3, 800, 608) and x.dtype == np.float32
    assert x[0, 0, 0] == pytest.approx((1 - 0.485) / 0.229, rel=1e-5)


# -- table structure ------------------------------------------------------------------------


def probs_for(tokens: list[str], steps: int = 0) -> np.ndarray:
    seq = ["sos", *tokens, "eos"]
    p = np.zeros((max(steps, len(seq)), len(TOKENS)), np.float32)
    for i, t in enumerate(seq):
        p[i, TOKENS.index(t)] = 1.0
    p[len(seq):, TOKENS.index("eos")] = 1.0
    return p


def test_table_decode_stops_at_eos_and_scales_cells_to_the_crop():
    tokens = ["<tr>", "<td></td>", "<td", ' colspan="2"', ">", "</td>", "</tr>"]
    probs = probs_for(tokens, steps=20)
    loc = np.zeros((20, 8), np.float32)
    loc[2] = [0.1, 0.1, 0.3, 0.1, 0.3, 0.2, 0.1, 0.2]  # the first cell's corners, fractions of 488
    ratio = SIDE / 976.0  # a crop of 976 px long side, resized by half
    s = table_decode(loc, probs, ratio, (500, 976))
    assert s.tokens == tuple(tokens) and not s.truncated
    assert len(s.cells) == 2  # one per cell token
    assert s.cells[0] == pytest.approx([97.6, 97.6, 292.8, 195.2], abs=1e-3)


def test_table_decode_cuts_at_max_cells_after_a_whole_cell_and_closes_the_row():
    tokens = ["<tr>"] + ["<td></td>"] * 5 + ["</tr>"]
    s = table_decode(np.zeros((10, 8), np.float32), probs_for(tokens), 1.0, (100, 100), max_cells=3)
    assert s.truncated and len(s.cells) == 3
    assert s.tokens == ("<tr>", "<td></td>", "<td></td>", "<td></td>", "</tr>")


def test_a_table_whose_steps_run_out_before_eos_is_cut_after_its_last_whole_cell():
    tokens = ["<tr>", "<td></td>", "<td></td>", "</tr>", "<tr>", "<td></td>", "<td", ' colspan="2"']
    probs = probs_for(tokens)[:-1]  # no "eos": the network's last step came first
    s = table_decode(np.zeros((len(probs), 8), np.float32), probs, 1.0, (100, 100))
    assert s.truncated and len(s.cells) == 3
    assert s.tokens == ("<tr>", "<td></td>", "<td></td>", "</tr>", "<tr>", "<td></td>", "</tr>")


def test_table_preprocess_pads_to_the_square_input():
    x, ratio = table_preprocess(np.full((100, 244, 3), 255, np.uint8))
    assert x.shape == (3, SIDE, SIDE) and ratio == pytest.approx(2.0)
    assert x[:, 199, 10].max() > 0 and x[:, 201, 10].max() == 0  # 200 rows of image, then zero padding


# -- grid places and matching ---------------------------------------------------------------


def test_grid_places_honour_rowspan_and_colspan():
    tokens = ["<tr>", "<td", ' rowspan="2"', ">", "</td>", "<td", ' colspan="2"', ">", "</td>", "</tr>",
              "<tr>", "<td></td>", "<td></td>", "</tr>"]
    assert grid_places(tokens) == [(0, 0, 2, 1), (0, 1, 1, 2), (1, 1, 1, 1), (1, 2, 1, 1)]


TWO_BY_TWO = TableStructure(("<thead>", "<tr>", "<td></td>", "<td></td>", "</tr>", "</thead>", "<tbody>", "<tr>",
                             "<td></td>", "<td></td>", "</tr>", "</tbody>"),
                            np.array([[0, 0, 100, 30], [100, 0, 200, 30], [0, 30, 100, 60], [100, 30, 200, 60]],
                                     np.float32))


def test_a_line_over_two_cells_is_split_at_its_words_and_text_is_escaped():
    # the crop's origin is (1000, 500) on the page
    lines = [line("Name Age", 1005, 505, 1190, 525, [("Name", (1005, 505, 1060, 525)),
                                                       ("Age", (1110, 505, 1190, 525))]),
             line("Tom & Jerry", 1005, 535, 1095, 555), line("7", 1150, 535, 1160, 555)]
    t = match_table(TWO_BY_TWO, (1000, 500), lines)
    assert t.html == ("<table><tr><td>Name</td><td>Age</td></tr>"
                      "<tr><td>Tom &amp; Jerry</td><td>7</td></tr></table>")
    assert [(c.row, c.col, c.text) for c in t.cells] == [(0, 0, "Name"), (0, 1, "Age"), (1, 0, "Tom & Jerry"),
                                                         (1, 1, "7")]
    assert t.cells[3].box == [[1100.0, 530.0], [1200.0, 530.0], [1200.0, 560.0], [1100.0, 560.0]]


def test_two_lines_in_one_cell_are_joined_in_reading_order_and_an_empty_cell_stays_empty():
    lines = [line("first", 5, 2, 60, 12), line("second", 5, 16, 60, 28), line("x", 150, 35, 160, 55)]
    t = match_table(TWO_BY_TWO, (0, 0), lines)
    assert [c.text for c in t.cells] == ["first second", "", "", "x"]


def test_a_table_without_cells_has_only_its_html():
    t = match_table(TableStructure(()), (0, 0), [line("a", 0, 0, 5, 5)])
    assert t.html == "<table></table>" and t.cells == ()


# -- regions --------------------------------------------------------------------------------


def test_each_line_goes_to_one_region_the_one_covering_it_most():
    boxes = [LayoutBox("text", (0, 0, 100, 100), 0.9), LayoutBox("figure", (0, 50, 100, 200), 0.9)]
    lines = [line("a", 10, 10, 90, 20), line("b", 10, 60, 90, 90), line("c", 10, 120, 90, 130),
             line("d", 10, 80, 90, 120)]  # b: in both (the smaller takes it); d: half in text, all in figure
    assert assign_lines(boxes, lines) == [(0, 1), (2, 3)]


def test_a_table_takes_its_lines_before_a_smaller_region_inside_it_which_is_left_out():
    boxes = [LayoutBox("table", (0, 0, 400, 200), 0.9), LayoutBox("text", (10, 10, 190, 60), 0.8),
             LayoutBox("title", (0, 300, 400, 340), 0.9)]
    lines = [line("cell", 20, 20, 180, 40), line("T", 10, 305, 390, 335)]
    assert assign_lines(boxes, lines) == [(0,), (), (1,)]
    assert [(r.type, r.lines) for r in assemble_regions(boxes, lines)] == [("table", (0,)), ("title", (1,))]


def test_free_lines_become_text_regions_and_regions_come_in_xy_cut_order():
    # two columns under a title; a footer line no region covers
    boxes = [LayoutBox("text", (520, 100, 1000, 400), 0.8), LayoutBox("title", (0, 0, 1000, 60), 0.9),
             LayoutBox("text", (0, 100, 480, 400), 0.8)]
    lines = [line("T", 10, 10, 900, 50), line("left", 10, 110, 470, 130), line("right", 530, 110, 990, 130),
             line("page 1", 450, 900, 550, 920), line("more", 10, 140, 470, 160)]
    regions = assemble_regions(boxes, lines)
    assert [(r.type, r.lines) for r in regions] == [("title", (0,)), ("text", (1, 4)), ("text", (2,)),
                                                    ("text", (3,))]
    assert regions[3].score == 0.0  # made of free lines, not found by the detector


def test_xy_cut_reads_bands_then_columns():
    boxes = np.array([[500, 0, 900, 100], [0, 0, 400, 100], [0, 200, 900, 300]], float)
    assert xy_cut(boxes) == [1, 0, 2]


def test_no_layout_and_no_lines_is_no_regions():
    assert assemble_regions([], []) == ()


def test_best_cell_is_rapidtables_rule():
    """RapidTable's match_result, written as it is (per cell: (1 - IoU, distance), the first of the least)."""
    from serve_app.structure.table_match import best_cell

    def iou(a, b):
        ix, iy = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
        if ix <= 0 or iy <= 0:
            return 0.0
        inter = ix * iy
        return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)

    def distance(a, b):
        d2, d3 = abs(b[0] - a[0]) + abs(b[1] - a[1]), abs(b[2] - a[2]) + abs(b[3] - a[3])
        return d2 + d3 + min(d2, d3)

    rng = np.random.default_rng(5)
    for _ in range(200):
        xy = rng.uniform(0, 300, (12, 2))
        cells = np.concatenate([xy, xy + rng.uniform(5, 80, (12, 2))], axis=1)
        cells[3] = cells[7]  # a tie: the first wins
        p = rng.uniform(0, 300, 2)
        box = (p[0], p[1], p[0] + rng.uniform(2, 60), p[1] + rng.uniform(2, 30))
        keys = [(1.0 - iou(box, c), distance(box, c)) for c in cells]
        assert best_cell(box, cells) == min(range(len(keys)), key=keys.__getitem__)
