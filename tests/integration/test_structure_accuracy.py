"""Issue 58's accuracy bars on a small drawn sample (harness/tables.py),
through the in-process engine with `structure=True` on whole pages: the
engine finds each table itself, reads >= 0.90 of its cells exactly at
their row and column, gets its shape right (rows, columns, spans), and
returns the page's title as a title region. Accuracy only: speed is
`python -m load_tests documents structure`."""

from __future__ import annotations

import pytest

from harness.table_scores import cells_exact, grid, shape, shape_right, table_html, title_found
from harness.tables import STYLES, drawn_table


@pytest.mark.parametrize("style", STYLES)
def test_a_table_on_a_page_is_found_and_read_cell_by_cell(engine, style):
    item = drawn_table(style, 0, "page")
    answer = engine.read(item.image, structure=True).to_dict()
    types = [r["type"] for r in answer["regions"]]
    html = table_html(answer, item.box)
    assert html is not None, f"no table region over the table at {item.box}; regions {types}"
    read, truth = grid(html), grid(item.truth.html)
    ok, n = cells_exact(read, truth)
    wrong = {(c.row, c.col): c.text for c in read if (c.row, c.col, c.text) not in
             {(t.row, t.col, t.text) for t in truth}}
    assert ok >= 0.90 * n, f"{ok}/{n} cells exact; read differently: {wrong}"
    assert shape_right(read, truth), f"shape {shape(read)} against {shape(truth)}: {html}"
    assert title_found(answer, item.title), f"title {item.title!r} not a title region: {types}"
    assert types.count("table") == 1, types


def test_a_table_alone_is_found_and_its_spans_kept(engine):
    item = drawn_table("spanning", 1, "alone")
    answer = engine.read(item.image, structure=True).to_dict()
    html = table_html(answer, item.box)
    assert html is not None, [r["type"] for r in answer["regions"]]
    read, truth = grid(html), grid(item.truth.html)
    assert shape_right(read, truth), html
    ok, n = cells_exact(read, truth)
    assert ok >= 0.90 * n, html
