"""format=markdown (serve_app.flow.formats.render_markdown), read back by a
CommonMark reader with GFM tables (markdown-it-py), not by string
comparison alone: what a user's renderer makes of it. No Ray, no models."""

from __future__ import annotations

import pytest
from markdown_it import MarkdownIt

from serve_app.core.request_options import OcrOptions, with_format
from serve_app.flow.formats import render
from serve_app.flow.markdown import md_table

md = MarkdownIt("commonmark").enable("table")


def quad(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def line(text, x0, y0, x1, y1):
    return {"text": text, "score": 0.9, "box": quad(x0, y0, x1, y1)}


def cell(row, col, text, rowspan=1, colspan=1):
    return {"row": row, "col": col, "rowspan": rowspan, "colspan": colspan, "box": quad(0, 0, 1, 1), "text": text}


RESULTS = [
    line("ACME Corp", 10, 5, 200, 20),            # 0 header
    line("Quarterly report", 10, 40, 300, 70),    # 1 title
    line("Sales rose in every region;", 10, 90, 400, 110),  # 2 text
    line("costs held.", 10, 112, 200, 130),       # 3 text
    line("Table 1: sales", 10, 140, 200, 155),    # 4 table caption
    line("Region", 10, 160, 100, 175),            # 5 table
    line("Total", 150, 160, 250, 175),            # 6
    line("North", 10, 180, 100, 195),             # 7
    line("1 | 2", 150, 180, 250, 195),            # 8
    line("page 1", 10, 380, 80, 395),             # 9 footer
]
TABLE = {"html": "<table><tr><td>Region</td><td>Total</td></tr><tr><td>North</td><td>1 | 2</td></tr></table>",
         "cells": [cell(0, 0, "Region"), cell(0, 1, "Total"), cell(1, 0, "North"), cell(1, 1, "1 | 2")]}
REGIONS = [
    {"type": "header", "box": quad(0, 0, 400, 25), "score": 0.9, "lines": [0]},
    {"type": "title", "box": quad(0, 35, 400, 75), "score": 0.9, "lines": [1]},
    {"type": "text", "box": quad(0, 85, 400, 135), "score": 0.9, "lines": [2, 3]},
    {"type": "table_caption", "box": quad(0, 138, 400, 157), "score": 0.9, "lines": [4]},
    {"type": "table", "box": quad(0, 158, 400, 200), "score": 0.9, "lines": [5, 6, 7, 8], "table": TABLE},
    {"type": "footer", "box": quad(0, 375, 400, 400), "score": 0.9, "lines": [9]},
]
BODY = {"request_id": "r", "image": {"width": 400, "height": 400}, "results": RESULTS, "regions": REGIONS,
        "timings_ms": {}}


def blocks(text):
    """(kind, text) of the document's top-level blocks as the reader sees them."""
    out, tokens = [], md.parse(text)
    for i, t in enumerate(tokens):
        if t.type in ("heading_open", "paragraph_open") and t.level == 0:
            out.append((t.tag, tokens[i + 1].content))
        elif t.type == "table_open":
            out.append(("table", None))
        elif t.type == "html_block":
            out.append(("html", t.content.strip()))
    return out


def table_rows(text):
    rows, row, tokens = [], None, md.parse(text)
    for i, t in enumerate(tokens):
        if t.type == "tr_open":
            row = []
        elif t.type in ("th_open", "td_open"):
            row.append(tokens[i + 1].children[0].content if tokens[i + 1].children else "")
        elif t.type == "tr_close":
            rows.append(row)
    return rows


def test_a_page_reads_as_a_heading_a_paragraph_and_a_table_without_its_furniture():
    text, media = render(BODY, "markdown")
    assert media == "text/markdown; charset=utf-8"
    assert blocks(text) == [("h1", "Quarterly report"), ("p", "Sales rose in every region;\ncosts held."),
                            ("table", None)]
    assert table_rows(text) == [["Region", "Total"], ["North", "1 | 2"]]  # the pipe inside a cell escaped
    assert "ACME" not in text and "page 1" not in text and "Table 1" not in text


def test_a_table_with_a_spanning_cell_is_its_html():
    spanned = {"html": '<table><tr><td colspan="2">Sales</td></tr><tr><td>a</td><td>b</td></tr></table>',
               "cells": [cell(0, 0, "Sales", colspan=2), cell(1, 0, "a"), cell(1, 1, "b")]}
    assert md_table(spanned) == spanned["html"]
    body = {**BODY, "regions": [*REGIONS[:4], {**REGIONS[4], "table": spanned}]}
    assert blocks(render(body, "markdown")[0])[-2:] == [("html", spanned["html"]), ("p", "page 1")]


def test_text_that_looks_like_markup_stays_text():
    results = [line("# not a heading", 0, 0, 10, 10), line("1. not a list", 0, 20, 10, 30),
               line("<script>x</script> *bold*", 0, 40, 10, 50)]
    body = {"image": {"width": 10, "height": 60}, "results": results,
            "regions": [{"type": "text", "box": quad(0, 0, 10, 60), "score": 1.0, "lines": [0, 1, 2]}]}
    text = render(body, "markdown")[0]
    html = md.render(text)
    assert blocks(text) == [("p", text.strip())]
    assert "<h1>" not in html and "<ol>" not in html and "<script>" not in html and "<em>" not in html
    assert "# not a heading" in html and "*bold*" in html


def test_lines_no_region_holds_keep_their_place_and_a_page_without_regions_is_its_blocks():
    body = {**BODY, "regions": [REGIONS[1], REGIONS[4]]}  # header, paragraph, caption, footer: in no region
    got = blocks(render(body, "markdown")[0])
    assert got[:2] == [("p", "ACME Corp"), ("h1", "Quarterly report")]
    assert got[2] == ("p", "Sales rose in every region;\ncosts held.\nTable 1: sales")  # before the table
    assert got[3] == ("table", None) and got[4] == ("p", "page 1")
    plain = {k: v for k, v in BODY.items() if k != "regions"}
    plain["blocks"] = [{"box": quad(0, 0, 1, 1), "lines": [0, 1]}, {"box": quad(0, 0, 1, 1), "lines": [2]}]
    got = blocks(render(plain, "markdown")[0])
    assert got[:2] == [("p", "ACME Corp\nQuarterly report"), ("p", "Sales rose in every region;")]


def test_a_table_whose_structure_was_not_read_is_its_lines():
    body = {**BODY, "regions": [{**REGIONS[4], "table": None}]}
    assert ("p", "Region\nTotal\nNorth\n1 | 2") in blocks(render(body, "markdown")[0])


def test_a_document_is_its_pages_in_order():
    second = {"page": 2, "width": 100, "height": 100, "results": [line("Appendix", 0, 0, 50, 20)],
              "regions": [{"type": "title", "box": quad(0, 0, 50, 20), "score": 1.0, "lines": [0]}]}
    first = {"page": 1, "width": 400, "height": 400, "results": RESULTS, "regions": REGIONS}
    body = {"document": {"type": "pdf", "pages": 2}, "pages": [first, second], "timings_ms": {}}
    text = render(body, "markdown")[0]
    assert text.index("<!-- page 1 -->") < text.index("# Quarterly") < text.index("<!-- page 2 -->") \
        < text.index("# Appendix")
    assert [b for b in blocks(text) if b[0] == "h1"] == [("h1", "Quarterly report"), ("h1", "Appendix")]


@pytest.mark.parametrize("fmt", ["markdown"])
def test_markdown_implies_structure(fmt):
    assert with_format(OcrOptions(), fmt).for_pipeline().structure
    assert not OcrOptions(format="text").for_pipeline().structure
    assert not OcrOptions().for_pipeline().structure
