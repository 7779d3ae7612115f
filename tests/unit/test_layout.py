"""Blocks and column reading order (serve_app.ocr.layout) on made line
boxes: the kinds of office page the order must follow. No models."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.ocr.layout import block_box, layout_blocks

H = 20  # line height
PITCH = 30  # line to line


def box(x, y, w, h=H):
    return [[x, y], [x + w, y], [x + w, y + h], [x, y + h]]


def page(lines):
    """lines: (name, x, y, w) -> (boxes array, names)."""
    return np.array([box(x, y, w) for _, x, y, w in lines], dtype=np.float32), [n for n, *_ in lines]


def read(lines):
    boxes, names = page(lines)
    blocks = layout_blocks(boxes)
    flat = [i for b in blocks for i in b]
    assert sorted(flat) == list(range(len(names)))  # every line once
    return [[names[i] for i in b] for b in blocks]


def column(prefix, x, y0, n, w=400, short_last=True):
    return [(f"{prefix}{k + 1}", x, y0 + k * PITCH, (w // 3 if short_last and k == n - 1 else w)) for k in range(n)]


def flat(blocks):
    return [n for b in blocks for n in b]


def test_two_columns_whose_lines_align_read_column_by_column():
    lines = column("L", 50, 100, 8) + column("R", 500, 100, 8)
    assert flat(read(lines)) == [f"L{k}" for k in range(1, 9)] + [f"R{k}" for k in range(1, 9)]
    assert read(lines) == [[f"L{k}" for k in range(1, 9)], [f"R{k}" for k in range(1, 9)]]


def test_three_columns():
    lines = column("A", 40, 100, 6, 250) + column("B", 330, 100, 6, 250) + column("C", 620, 100, 6, 250)
    assert flat(read(lines)) == [f"{c}{k}" for c in "ABC" for k in range(1, 7)]


def test_a_title_across_two_columns_then_the_columns_then_a_footer():
    lines = [("T", 200, 40, 450)] + column("L", 50, 100, 6) + column("R", 500, 100, 5) + [("F", 50, 300, 850)]
    blocks = read(lines)
    assert flat(blocks) == ["T"] + [f"L{k}" for k in range(1, 7)] + [f"R{k}" for k in range(1, 6)] + ["F"]
    assert blocks[0] == ["T"] and blocks[-1] == ["F"]


def test_a_sidebar_reads_before_the_main_column():
    lines = column("S", 30, 100, 5, 160) + column("M", 240, 100, 10, 600)
    assert flat(read(lines)) == [f"S{k}" for k in range(1, 6)] + [f"M{k}" for k in range(1, 11)]


def test_paragraphs_of_one_column_are_blocks_of_their_own():
    lines = column("P", 50, 100, 3) + column("Q", 50, 100 + 3 * PITCH + 25, 4)
    assert read(lines) == [["P1", "P2", "P3"], ["Q1", "Q2", "Q3", "Q4"]]


def test_a_table_like_grid_stays_row_by_row():
    # Description | Qty | Unit price | Amount, five rows
    cols = [(50, 260), (400, 40), (520, 90), (700, 90)]
    lines = [(f"r{r}c{c}", x, 100 + r * PITCH, w) for r in range(5) for c, (x, w) in enumerate(cols)]
    assert flat(read(lines)) == [f"r{r}c{c}" for r in range(5) for c in range(4)]


def test_a_receipt_stays_one_column_with_each_price_after_its_item():
    items = [("Cappuccino", 120), ("Croissant", 110), ("Orange juice large", 200), ("Tip", 40), ("TOTAL", 70)]
    lines = []
    for k, (name, w) in enumerate(items):
        lines += [(name, 20, 100 + k * PITCH, w), (f"{name}$", 330, 100 + k * PITCH, 60)]
    lines = [("SHOP NAME", 120, 40, 160)] + lines
    assert flat(read(lines)) == ["SHOP NAME"] + [n for name, _ in items for n in (name, f"{name}$")]


def test_label_value_pairs_of_a_form_stay_row_by_row():
    rows = [("Invoice number:", "2026-0481"), ("Date:", "1 Dec 2026"), ("Due:", "31 Dec 2026")]
    lines = []
    for k, (label, value) in enumerate(rows):
        lines += [(label, 50, 100 + k * PITCH, 15 * len(label)), (value, 400, 100 + k * PITCH, 15 * len(value))]
    assert flat(read(lines)) == [t for pair in rows for t in pair]


def test_two_columns_offset_by_half_a_line_still_read_column_by_column():
    lines = column("L", 50, 100, 6) + column("R", 500, 115, 6)
    assert flat(read(lines)) == [f"L{k}" for k in range(1, 7)] + [f"R{k}" for k in range(1, 7)]


def test_one_and_no_lines():
    assert layout_blocks(np.zeros((0, 4, 2), np.float32)) == []
    assert layout_blocks(np.array([box(0, 0, 100)], np.float32)) == [[0]]


def test_block_box_is_the_box_around_its_lines():
    boxes, _ = page([("a", 10, 10, 100), ("b", 20, 40, 200)])
    assert block_box(boxes, [0, 1]) == [[10.0, 10.0], [220.0, 10.0], [220.0, 60.0], [10.0, 60.0]]


def test_the_made_pages_lines_drawn_boxes_come_out_in_the_truths_order():
    """harness/pages.py's office pages, by the boxes their lines were drawn
    in (a detector finds about these): each in the order a person reads it."""
    import random

    from harness.pages import made_pages, order_score

    for page in made_pages():
        boxes = np.array([box(x0, y0, x1 - x0, y1 - y0) for x0, y0, x1, y1 in page.boxes], dtype=np.float32)
        shuffled = list(range(len(boxes)))
        random.Random(0).shuffle(shuffled)  # the detector's order is not reading order
        blocks = layout_blocks(boxes[shuffled])
        read = [page.truth[shuffled[i]] for b in blocks for i in b]
        score, matched, n = order_score(read, page.truth)
        assert (score, matched) == (1.0, n), (page.name, read)


# -- bounded layout (issue 38, item 6) -----------------------------------------------------


def nested(levels):
    """A title over two columns, the left a line of text, the right the
    same again, `levels` deep (two lines a level): each region cut once
    more inside the last one. The order a person reads: title, its left
    line, the next title, ... (index order)."""
    lines = []
    step = 6 * H  # a left column 5 line heights long, a gutter of one
    for k in range(levels):
        x, y = k * step, k * 1.5 * H
        width = (levels - k) * step + 5 * H
        lines.append((f"T{k}", x, y, width))
        lines.append((f"A{k}", x, y + 1.5 * H, 5 * H))
    return lines


def test_a_page_of_hundreds_of_nested_columns_is_read_without_recursion():
    """260 levels (520 lines): the recursive cut overflowed Python's stack
    (RecursionError, a 500); the stack is explicit now."""
    import sys

    lines = nested(260)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # not a frame per level
    try:
        blocks = read(lines)
    finally:
        sys.setrecursionlimit(limit)
    assert flat(blocks) == [n for n, *_ in lines]


def test_the_cuts_stop_at_the_work_bound_and_the_rest_is_read_top_to_bottom():
    from serve_app.ocr import layout
    from serve_app.ocr.layout import LayoutParams

    lines = nested(60)
    boxes, names = page(lines)
    spent = []
    real = layout._Cutter.spend

    def counting(self, n):
        spent.append(n)
        return real(self, n)

    layout._Cutter.spend = counting
    try:
        whole = layout_blocks(boxes, LayoutParams(min_work=10**9))
        unbounded = sum(spent)
        spent.clear()
        params = LayoutParams(min_work=0, work_per_line=4)
        bounded = layout_blocks(boxes, params)
    finally:
        layout._Cutter.spend = real
    assert unbounded > 8 * len(lines)  # more than quadratic in the levels: sections re-cut each strip
    assert sum(spent) <= params.work_per_line * len(lines) + len(lines)  # stopped within one more step
    assert [names[i] for b in bounded for i in b] == [names[i] for b in whole for i in b] == names


def quads_of(rects):
    r = np.asarray(rects, dtype=float)
    return np.stack([r[:, [0, 1]], r[:, [2, 1]], r[:, [2, 3]], r[:, [0, 3]]], axis=1)


@pytest.mark.parametrize("n", [400, 3000])
def test_a_row_of_lone_boxes_asks_each_gutter_a_bounded_number_of_times(n):
    """Boxes side by side with gaps too wide to be one line, none of them a
    text column: `columns` dropped one gap at a time and asked every gap
    again each time (~n^2 numpy calls: 400 boxes took 1 s, 3,000 a
    minute). Its calls now count against the page's work bound: at most
    (min_work + work_per_line x n) / NUMPY_CALL of them, and every box read."""
    from serve_app.ocr import layout

    boxes = quads_of([(i * 40, 0, i * 40 + 10, 10) for i in range(n)])
    asked = []
    real = layout._Cutter._text_column

    def counting(self, idx, gutter):
        asked.append(len(idx))
        return real(self, idx, gutter)

    layout._Cutter._text_column = counting
    try:
        blocks = layout_blocks(boxes)
    finally:
        layout._Cutter._text_column = real
    params = layout.LayoutParams()
    bound = (params.min_work + params.work_per_line * n) / layout.NUMPY_CALL
    assert sorted(flat(blocks)) == list(range(n))
    assert len(asked) <= 2 * bound and sum(asked) <= 2 * (params.min_work + params.work_per_line * n)
