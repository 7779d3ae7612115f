"""The layout settled against the page's lines (serve_app.structure.settle),
on small synthetic boxes: a low-scored table kept only as another reading
of a found block, tables inside tables and same-block duplicates dropped, a
large-type header read as the title, a table grown over the header row in
its columns and to enclose its lines, and what it must not take (a
paragraph line across its columns, a row too far away). The detector's own
table floor: test_layout_table_floor. No models."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.core.engine_config import StructureOptions
from serve_app.core.results import TextLine
from serve_app.structure.layout import INPUT_HW, LayoutBox, layout_postprocess
from serve_app.structure.settle import grow_table, header_titles, ink_height, settle_layout, settle_tables

pytestmark = pytest.mark.unit


def q(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def line(text, x0, y0, x1, y1):
    return TextLine(text, 0.9, q(x0, y0, x1, y1))


TABLE = (100.0, 100.0, 500.0, 300.0)


def body_lines():
    """Three rows of three columns (x 110-200, 250-330, 400-490), 20 px tall, in TABLE."""
    return [line(f"r{r}c{c}", x0, 110 + 60 * r, x1, 130 + 60 * r)
            for r in range(3) for c, (x0, x1) in enumerate(((110, 200), (250, 330), (400, 490)))]


def boxes_of(lines):
    return [tuple(float(v) for v in (ln.box[0][0], ln.box[0][1], ln.box[2][0], ln.box[2][1])) for ln in lines]


# -- tables and twins -----------------------------------------------------------------------


def test_a_low_table_twin_of_a_found_block_is_kept_and_takes_it():
    eq = LayoutBox("equation", (98, 98, 502, 302), 0.94)
    table = LayoutBox("table", (100, 100, 500, 300), 0.18)
    assert settle_tables([eq, table], 0.5) == [eq, table]


def test_a_low_table_with_no_found_block_under_it_is_dropped():
    table = LayoutBox("table", (100, 100, 500, 300), 0.18)
    elsewhere = LayoutBox("text", (100, 400, 500, 500), 0.9)
    small = LayoutBox("text", (100, 100, 200, 150), 0.9)  # inside, but not the same block
    assert settle_tables([elsewhere, small, table], 0.5) == [elsewhere, small]


def test_a_table_inside_a_better_table_is_dropped_and_a_sure_table_kept():
    big = LayoutBox("table", TABLE, 0.9)
    part = LayoutBox("table", (300, 100, 500, 300), 0.6)
    other = LayoutBox("table", (100, 400, 500, 600), 0.7)
    assert settle_tables([big, part, other], 0.5) == [big, other]


def test_same_block_read_as_two_types_keeps_the_better():
    header = LayoutBox("header", (79, 66, 650, 100), 0.64)
    title = LayoutBox("title", (79, 66, 651, 101), 0.54)
    para = LayoutBox("text", (79, 150, 650, 250), 0.9)
    assert settle_tables([header, title, para], 0.5) == [header, para]


# -- header -> title ------------------------------------------------------------------------


def page_with(text_rows):
    """A white page with black bars of the given (y0, height, x0, x1)."""
    img = np.full((400, 600), 255, np.uint8)
    for y0, h, x0, x1 in text_rows:
        img[y0:y0 + h, x0:x1] = 0
    return img


def test_ink_height_is_the_dark_rows_of_a_line_box():
    img = page_with([(20, 12, 10, 100)])
    assert ink_height(img, (5, 10, 110, 40)) == 12
    assert ink_height(img, (5, 200, 110, 230)) == 0  # nothing dark: no ink


def test_a_header_in_large_type_is_the_title_and_a_small_one_stays_a_header():
    img = page_with([(20, 30, 10, 300), (100, 14, 10, 500), (140, 14, 10, 500), (360, 14, 10, 200)])
    lines = [line("Big", 5, 15, 305, 55), line("p1", 5, 95, 505, 118), line("p2", 5, 135, 505, 158),
             line("running head", 5, 355, 205, 378)]
    top = LayoutBox("header", (5, 15, 305, 55), 0.7)
    foot = LayoutBox("header", (5, 355, 205, 378), 0.7)
    para = LayoutBox("text", (5, 95, 505, 158), 0.9)
    got = header_titles([top, para, foot], lines, img)
    assert [b.type for b in got] == ["title", "text", "header"]
    assert header_titles([para], lines, img) == [para]


# -- growing a table ------------------------------------------------------------------------


def test_a_table_grows_over_the_header_row_in_its_columns():
    header = [line(t, x0, 75, x1, 95) for t, (x0, x1) in zip("ABC", ((110, 160), (260, 330), (420, 490)))]
    x0, y0, x1, y1 = grow_table(TABLE, boxes_of(body_lines() + header))
    assert y0 <= 75 and y0 >= 65 and (x0, x1, y1) == (100, 500, 300)


def test_a_table_grows_over_a_last_row_below_it():
    last = [line(t, x0, 305, x1, 325) for t, (x0, x1) in zip("ABC", ((110, 200), (250, 330), (400, 490)))]
    _, y0, _, y1 = grow_table(TABLE, boxes_of(body_lines() + last))
    assert y0 == 100 and 325 <= y1 <= 335


def test_a_paragraph_line_across_the_columns_or_a_far_row_is_not_taken():
    para = [line("a sentence over the columns", 100, 75, 480, 95)]
    assert grow_table(TABLE, boxes_of(body_lines() + para)) == TABLE
    far = [line(t, x0, 20, x1, 40) for t, (x0, x1) in zip("ABC", ((110, 160), (260, 330), (420, 490)))]
    assert grow_table(TABLE, boxes_of(body_lines() + far)) == TABLE
    one = [line("A", 110, 75, 160, 95)]  # one cell is no row of the table
    assert grow_table(TABLE, boxes_of(body_lines() + one)) == TABLE


def test_a_table_box_encloses_the_lines_it_takes():
    cut = [line("head", 110, 92, 200, 112), line("head2", 250, 92, 330, 112)]  # 60% inside TABLE
    _, y0, _, _ = grow_table(TABLE, boxes_of(body_lines() + cut))
    assert y0 == 92


def test_settle_layout_turns_the_header_row_caption_into_the_tables():
    header = [line(t, x0, 75, x1, 95) for t, (x0, x1) in zip("ABC", ((110, 160), (260, 330), (420, 490)))]
    caption = LayoutBox("table_caption", (105, 72, 495, 98), 0.9)
    table = LayoutBox("table", TABLE, 0.9)
    img = np.full((400, 600, 3), 255, np.uint8)
    got = settle_layout([table, caption], body_lines() + header, 0.5, img)
    assert got[0].type == "table" and got[0].box[1] <= 75 and got[1] == caption


# -- the detector's table floor ---------------------------------------------------------------


def test_layout_table_floor_keeps_low_tables_only():
    from tests.unit.test_structure_stages import layout_outputs

    out = layout_outputs({(2, 40): (4, 0.2, (2, 2, 2, 2)), (2, 60): (0, 0.2, (2, 2, 2, 2))})
    assert layout_postprocess(out, INPUT_HW) == []
    found = layout_postprocess(out, INPUT_HW, table_thresh=0.1)
    assert [b.type for b in found] == ["table"]
    assert StructureOptions().table_score < StructureOptions().layout_score
