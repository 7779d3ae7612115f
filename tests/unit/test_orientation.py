"""Page orientation (serve_app.ocr.orientation): the decision from line
votes, and the geometry between a turned page and its upright view. No
models."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.core.results import CharBox, TextLine
from serve_app.ocr.orientation import Vote, decide, line_vote, quality, to_original, to_upright, turn_lines, upright


def test_votes_by_geometry_and_classifier():
    assert line_vote(False, False, 10, 1.0).angle == 0
    assert line_vote(False, True, 10, 1.0).angle == 180
    assert line_vote(True, False, 10, 1.0).angle == 90
    assert line_vote(True, True, 10, 1.0).angle == 270
    assert line_vote(True, True, 10, 0.5).weight == 5.0


def test_a_box_votes_the_direction_it_was_read_along_in_the_image():
    wide = [[0, 0], [40, 0], [40, 10], [0, 10]]
    tall = [[0, 0], [10, 0], [10, 40], [0, 40]]
    # Axis-aligned boxes from the top-left corner: the table.
    for box, vertical in ((wide, False), (tall, True)):
        for flipped in (False, True):
            assert line_vote(vertical, flipped, 10, 1.0, box).angle == line_vote(vertical, flipped, 10, 1.0).angle
    # A line running down the image, slanted, whose quad starts at its top
    # end (tl -> tr runs along the line): its crop is cut along it, not
    # turned, and read as a page turned 90 degrees clockwise reads.
    down = [[30, 0], [40, 60], [30, 62], [20, 2]]
    assert line_vote(False, False, 10, 1.0, down).angle == 90
    assert line_vote(False, True, 10, 1.0, down).angle == 270
    up = [[20, 62], [10, 2], [20, 0], [30, 60]]  # the same line read from its other end
    assert line_vote(False, False, 10, 1.0, up).angle == 270
    assert line_vote(False, False, 10, 1.0, [[5, 5]] * 4).angle == 0  # a degenerate box


def test_quality_does_not_count_spaces():
    def line(text):
        return TextLine(text, 0.5, [[0, 0], [1, 0], [1, 1], [0, 1]])

    assert quality([line("To facilitate the")]) == quality([line("Tofacilitatethe")]) == 7.5


def test_decide_needs_a_clear_majority_and_enough_text():
    assert decide([]) == 0
    assert decide([Vote(90, 20.0), Vote(90, 15.0), Vote(0, 5.0)]) == 90
    assert decide([Vote(180, 10.0), Vote(0, 10.0)]) == 0  # no majority
    assert decide([Vote(270, 5.0)]) == 0  # one short line: too little to turn a page for
    assert decide([Vote(270, 14.0)]) == 270  # one long line
    assert decide([Vote(0, 30.0), Vote(90, 20.0)]) == 0


@pytest.mark.parametrize("angle", [0, 90, 180, 270])
def test_upright_view_and_point_mapping_agree_with_each_other(angle):
    h, w = 30, 50
    original = np.zeros((h, w), np.uint8)
    original[2, 7] = 255  # one marked pixel at x=7, y=2
    up = upright(original, angle)
    ys, xs = np.nonzero(up)
    # pixel centres: (x + 0.5, y + 0.5)
    back = to_original(np.array([xs[0] + 0.5, ys[0] + 0.5]), angle, w, h)
    assert back.tolist() == [7.5, 2.5]
    assert to_upright(back, angle, w, h).tolist() == [xs[0] + 0.5, ys[0] + 0.5]


def test_turn_lines_moves_every_box_into_the_original_and_orders_corners_clockwise_from_top_left():
    line = TextLine("ab", 0.9, [[0, 0], [20, 0], [20, 10], [0, 10]],
                    chars=(CharBox("a", [[0, 0], [10, 0], [10, 10], [0, 10]]),))
    (moved,) = turn_lines([line], 90, w=100, h=200)  # original 100 wide: the upright view is 200 wide
    assert moved.box == [[90.0, 0.0], [100.0, 0.0], [100.0, 20.0], [90.0, 20.0]]
    assert moved.chars[0].box == [[90.0, 0.0], [100.0, 0.0], [100.0, 10.0], [90.0, 10.0]]
    assert moved.text == "ab" and quality([moved]) == pytest.approx(1.8)
