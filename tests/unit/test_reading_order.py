"""reading_order: top to bottom, left to right within a line."""

from __future__ import annotations

import numpy as np

from serve_app.ocr.reading_order import reading_order


def box(x, y, w=40, h=12):
    return [[x, y], [x + w, y], [x + w, y + h], [x, y + h]]


def test_second_line_first_and_a_right_to_left_pair():
    boxes = np.array(
        [
            box(10, 52),  # 0: line 2, left
            box(150, 50),  # 1: line 2, right, but 2 px higher than box 0
            box(300, 5),  # 2: line 1, right
            box(20, 8),  # 3: line 1, left, 3 px lower than box 2
        ],
        dtype=np.float32,
    )
    assert reading_order(boxes) == [3, 2, 0, 1]


def test_three_boxes_on_a_line_given_right_to_left():
    # Each box a pixel lower than the one to its right: sorting by y alone
    # would read this line backwards.
    boxes = np.array([box(300, 5), box(200, 6), box(100, 7)], dtype=np.float32)
    assert reading_order(boxes) == [2, 1, 0]


def test_boxes_10_px_apart_are_different_lines():
    # same_line_px is a strict bound: 10 px lower is the next line.
    boxes = np.array([box(200, 0), box(10, 10)], dtype=np.float32)
    assert reading_order(boxes) == [0, 1]
    boxes = np.array([box(200, 0), box(10, 9)], dtype=np.float32)
    assert reading_order(boxes) == [1, 0]
    assert reading_order(boxes, same_line_px=5.0) == [0, 1]


def test_column_of_lines_in_shuffled_order():
    ys = [120, 0, 80, 40, 160]
    boxes = np.array([box(10, y) for y in ys], dtype=np.float32)
    assert reading_order(boxes) == [1, 3, 2, 0, 4]


def test_empty_and_single():
    assert reading_order(np.zeros((0, 4, 2), dtype=np.float32)) == []
    assert reading_order(np.array([box(5, 5)], dtype=np.float32)) == [0]


def test_a_staircase_that_would_make_every_box_move_past_all_before_it_is_read_as_rows():
    """Top-left y a fraction of a pixel lower per box, right to left: the
    insertion pass moved each box past every one before it (3,000 boxes:
    4.5 million moves, 3 s). Past MOVES_PER_BOX moves a box it reads them
    as rows (here one row, left to right), having made at most the bound."""
    from serve_app.ocr import reading_order as ro

    n = 3000
    boxes = np.array([box((n - i) * 5, i * 0.003, 4, 8) for i in range(n)], dtype=np.float64)
    assert reading_order(boxes) == list(range(n - 1, -1, -1)) == ro.rows(boxes)


def test_rows_reads_each_line_left_to_right_and_lines_top_to_bottom():
    from serve_app.ocr.reading_order import rows

    boxes = np.array([box(300, 5), box(200, 6), box(100, 7), box(50, 40), box(10, 41)], dtype=np.float32)
    assert rows(boxes) == [2, 1, 0, 4, 3] == reading_order(boxes)
