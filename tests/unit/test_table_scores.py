"""The table scorers (harness/table_scores.py) on values worked by hand,
and the drawn set's truth (harness/tables.py) read back by them."""

from __future__ import annotations

import numpy as np
import pytest

from harness.table_scores import (GridCell, Node, cells_exact, grid, shape, shape_right, table_html, teds, title_found,
                                  tree_edit_distance)
from harness.tables import PLACES, STYLES, drawn_table, table_set, table_truth

T2x2 = "<table><tr><td>abc</td><td>x</td></tr><tr><td>1</td><td>2</td></tr></table>"
SPAN = ('<html><body><table><thead><tr><td rowspan="2">Site</td><td colspan="2">Sales</td></tr>'
        "<tr><td>Q1</td><td>Q2</td></tr></thead><tbody><tr><td>North <b>depot</b></td><td>1</td><td>2</td></tr>"
        "</tbody></table></body></html>")


def _t(tag, *children):
    return Node(tag, children=list(children))


def test_zhang_shasha_gives_the_papers_example_distance():
    # Zhang & Shasha (1989), fig. 1-2: f(d(a c(b)) e) -> f(c(d(a b)) e) is 2 with unit costs.
    a = _t("f", _t("d", _t("a"), _t("c", _t("b"))), _t("e"))
    b = _t("f", _t("c", _t("d", _t("a"), _t("b"))), _t("e"))
    assert tree_edit_distance(a, b, lambda x, y: float(x.tag != y.tag)) == 2.0
    assert tree_edit_distance(a, a, lambda x, y: float(x.tag != y.tag)) == 0.0


def test_teds_pubtabnet_values():
    assert teds(T2x2, T2x2) == 1.0
    # one character of one cell: Levenshtein 1 over 3 tokens, over 6 nodes under <table>
    assert teds(T2x2.replace("abc", "abd"), T2x2) == pytest.approx(1 - (1 / 3) / 6)
    # a row missing: delete <tr> and its two <td>, 3 of 6
    assert teds("<table><tr><td>abc</td><td>x</td></tr></table>", T2x2) == pytest.approx(0.5)
    # a span wrong renames its cell at cost 1 whatever the text
    assert teds(T2x2.replace("<td>x", '<td colspan="2">x'), T2x2) == pytest.approx(1 - 1 / 6)
    # no table at all scores 0
    assert teds("<p>no table</p>", T2x2) == 0.0 and teds("", T2x2) == 0.0


def test_teds_header_markup_is_ignored_by_default_and_scored_when_asked():
    plain = SPAN.replace("<thead>", "").replace("</thead>", "").replace("<tbody>", "").replace("</tbody>", "")
    assert teds(plain, SPAN) == 1.0
    # PubTabNet's default: <thead> and <tbody> are 2 of the 12 nodes under <table> (3 tr + 7 td + 2)
    assert teds(plain, SPAN, ignore=()) == pytest.approx(1 - 2 / 12)


def test_teds_counts_nested_tags_as_content_tokens():
    # 'North <b>depot</b>' is 13 tokens ('N'...' ', '<b>', 'd'...'t', '</b>'), plain 'North depot' 11:
    # Levenshtein 2 over 13 in one cell, of 10 nodes under <table> (3 tr, 7 td; thead/tbody ignored)
    bare = SPAN.replace("<b>depot</b>", "depot")
    assert teds(bare, SPAN) == pytest.approx(1 - (2 / 13) / 10)


def test_grid_places_cells_around_spans():
    cells = grid(SPAN)
    assert [(c.row, c.col, c.rowspan, c.colspan, c.text) for c in cells] == [
        (0, 0, 2, 1, "Site"), (0, 1, 1, 2, "Sales"), (1, 1, 1, 1, "Q1"), (1, 2, 1, 1, "Q2"),
        (2, 0, 1, 1, "North depot"), (2, 1, 1, 1, "1"), (2, 2, 1, 1, "2")]
    assert shape(cells) == (3, 3)
    assert grid("<div>none</div>") == [] and shape([]) == (0, 0)


def test_cells_exact_counts_text_at_its_place_only():
    truth = grid(SPAN)
    assert cells_exact(truth, truth) == (7, 7)
    # whitespace is collapsed, case and punctuation are not
    read = grid(SPAN.replace("North <b>depot</b>", "North   depot ").replace(">Q1<", ">q1<"))
    assert cells_exact(read, truth) == (6, 7)
    # the right texts one column off are wrong
    shifted = [GridCell(c.row, c.col + 1, c.rowspan, c.colspan, c.text) for c in truth]
    assert cells_exact(shifted, truth) == (0, 7)


def test_shape_right_needs_rows_columns_and_spans():
    truth = grid(SPAN)
    assert shape_right(grid(SPAN.replace("Sales", "Salez")), truth)
    # the spanning group read as two cells: same rows and columns, spans wrong
    split = grid(SPAN.replace('<td colspan="2">Sales</td>', "<td>Sales</td><td></td>"))
    assert shape(split) == shape(truth) and not shape_right(split, truth)
    assert not shape_right(grid(T2x2), truth)


@pytest.mark.parametrize("style", STYLES)
def test_each_styles_truth_reads_back_through_its_html(style):
    truth = table_truth(style, 0)
    cells = grid(truth.html)
    assert [(c.row, c.col, c.rowspan, c.colspan, c.text) for c in cells] == \
        sorted((c.row, c.col, c.rowspan, c.colspan, c.text) for c in truth.cells)
    assert shape(cells) == (truth.rows, truth.cols) and teds(truth.html, truth.html) == 1.0
    assert all(c.text.strip() for c in truth.cells)  # every cell has something to read
    if style == "spanning":
        assert truth.header_rows == 2 and any(c.colspan == 2 for c in truth.cells)
        assert any(c.rowspan == 2 for c in truth.cells)


def test_the_set_is_deterministic_and_each_table_lies_in_its_image():
    a, b = drawn_table("zebra", 1, "page"), drawn_table("zebra", 1, "page")
    assert np.array_equal(a.image, b.image) and a.truth == b.truth and a.title
    items = table_set(seeds=1)
    assert [(t.style, t.place) for t in items] == [(s, p) for s in STYLES for p in PLACES]
    for t in items:
        h, w = t.image.shape[:2]
        x0, y0, x1, y1 = t.box
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
        crop = t.crop()
        assert crop.shape[0] >= y1 - y0 and (crop < 128).any()  # ink inside the crop
        if t.place == "page":  # the title and paragraph lie above the table
            assert (t.image[: y0 - 20] < 128).any() and t.title
    with pytest.raises(ValueError, match="style must be one of"):
        drawn_table("dotted", 0, "alone")


def _region(kind, box, lines=(), html=None):
    x0, y0, x1, y1 = box
    r = {"type": kind, "box": [[x0, y0], [x1, y0], [x1, y1], [x0, y1]], "score": 0.9, "lines": list(lines)}
    if html is not None:
        r["table"] = {"html": html, "cells": []}
    return r


def test_an_answers_table_is_the_table_region_over_the_true_box():
    answer = {"results": [], "regions": [
        _region("table", (0, 0, 100, 100), html="<table><tr><td>far</td></tr></table>"),
        _region("text", (500, 500, 800, 700)),
        _region("table", (480, 490, 820, 700), html="<table><tr><td>near</td></tr></table>")]}
    assert table_html(answer, (500, 500, 800, 700)) == "<table><tr><td>near</td></tr></table>"
    assert table_html(answer, (2000, 2000, 2100, 2100)) is None  # nothing found there
    assert table_html({"results": []}, (0, 0, 10, 10)) is None  # structure not asked


def test_a_title_counts_only_as_a_title_region_reading_it():
    answer = {"results": [{"text": "Quarterly results"}, {"text": "by  region"}, {"text": "P1 text"}],
              "regions": [_region("title", (0, 0, 10, 10), lines=(0, 1)), _region("text", (0, 20, 10, 30), (2,))]}
    assert title_found(answer, "Quarterly results by region")
    assert not title_found(answer, "P1 text")  # read, but as text
    answer["regions"][0]["type"] = "text"
    assert not title_found(answer, "Quarterly results by region")
