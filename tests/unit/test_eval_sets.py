"""The model tiers' evaluation sets (harness/eval_sets.py): made the same
every time, each image with its truth, and scored as a reader would judge
the text (python -m load_tests engine tiers reads them with each model set)."""

from __future__ import annotations

import numpy as np

from harness import eval_sets as E


def test_a_set_is_the_same_pixels_every_time_with_one_truth_per_line_image():
    a, b = E.accented_latin(sizes=(18,)), E.accented_latin(sizes=(18,))
    assert len(a) == len(E.ACCENTED) >= 55
    assert all(np.array_equal(x.image, y.image) and x.truth == y.truth for x, y in zip(a, b))
    assert all(len(it.truth) == 1 and it.image.ndim == 3 and it.image.shape[2] == 3 for it in a)


def test_the_accented_lines_carry_the_letters_v4_misreads_and_english_carries_none(tmp_path):
    text = "".join(E.ACCENTED)
    assert all(c in text for c in "öüäßéèêçñáíóúłżśćńøåæõã")
    assert all(c.isascii() for t in E.ENGLISH for c in t)
    dictionary = tmp_path / "dict.txt"  # missing_characters against a dictionary of plain ASCII
    dictionary.write_text("\n".join(chr(i) for i in range(33, 127)), encoding="utf-8")
    assert E.missing_characters(E.english(sizes=(18,)), dictionary) == set()
    assert {"ß", "ñ", "ł"} <= E.missing_characters(E.accented_latin(sizes=(18,)), dictionary)


def test_tiny_words_are_as_high_as_asked_and_the_chinese_pages_hold_every_line_with_its_box():
    for it in E.tiny_words(heights=(10, 16), per_height=5):
        assert it.image.shape[0] == int(it.name.split("-")[1][:-2]) and len(it.truth[0]) >= 4
    page = E.chinese_page(20, 36)
    assert "".join(page.truth) == "".join(E.CHINESE) and len(page.boxes) == len(page.truth)
    h, w = page.image.shape[:2]
    assert all(0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h for x0, y0, x1, y1 in page.boxes)
    # consecutive lines do not overlap: a read line's centre falls in one truth box
    assert all(a[3] <= b[1] for a, b in zip(page.boxes, page.boxes[1:]))


def test_a_line_image_scores_exact_or_by_its_edits():
    assert E.score_item("latin", ("Königstraße 17",), (), [("Königstraße", []), ("17", [])]) == (1, 1, 1, 0, 14)
    assert E.score_item("latin", ("Königstraße 17",), (), [("KonigstraBe 17", [])]) == (1, 1, 0, 2, 14)
    assert E.score_item("latin", ("Muñoz",), (), []) == (1, 0, 0, 5, 5)


def test_a_page_line_split_by_the_detector_is_joined_and_full_width_punctuation_counts_as_half_width():
    boxes = ((10, 10, 300, 30), (10, 40, 300, 60))
    read = [("二零二四年,", [[150, 12], [290, 12], [290, 28], [150, 28]]),  # right half of line 1
            ("本公司于", [[12, 12], [140, 12], [140, 28], [12, 28]]),  # left half of line 1
            ("召开股东大会", [[12, 42], [200, 42], [200, 58], [12, 58]])]
    n, got, exact, errors, chars = E.score_item("chinese", ("本公司于二零二四年，", "召开股东大会。"), boxes, read)
    assert (n, got, exact, errors, chars) == (2, 2, 1, 1, 17)


def test_a_peer_label_is_found_inside_a_longer_read_line():
    n, got, exact, errors, _ = E.score_item("peer", ("TOTAL", "12.50"), (), [("TOTAL 12.50 EUR", []), ("x", [])])
    assert (n, got, exact, errors) == (2, 2, 2, 0)
    assert E.score_item("peer", ("TOTAL",), (), [("TOTA", [])])[1:4] == (1, 0, 1)
