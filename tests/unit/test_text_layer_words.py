"""A PDF text layer's run of characters split into words for document
structure (serve_app.flow.structure_step.text_layer_words): at a space, or
at a gap wider than a quarter of the line's height (a table's row is one
run, its cells far apart); kerning is not a gap."""

from __future__ import annotations

from serve_app.core.results import CharBox, TextLine
from serve_app.flow.structure_step import text_layer_words


def line_of(spec: list[tuple[str, float]], height: float = 20.0) -> TextLine:
    """Characters 10 px wide starting at the given x."""
    chars = tuple(CharBox(ch, [[x, 0], [x + 10, 0], [x + 10, height], [x, height]]) for ch, x in spec)
    text = "".join(ch for ch, _ in spec)
    return TextLine(text, 1.0, [[spec[0][1], 0], [spec[-1][1] + 10, 0], [spec[-1][1] + 10, height],
                                [spec[0][1], height]], chars=chars)


def test_a_tables_row_is_split_at_its_gaps_and_spaces_and_kerning_is_kept():
    row = line_of([("a", 0), ("b", 10.5), ("c", 100), ("d", 109), (" ", 119), ("e", 129)])
    (got,) = text_layer_words((row,))
    assert [w.text for w in got.words] == ["ab", "cd", "e"]
    assert got.words[1].box == [[100, 0], [119, 0], [119, 20], [100, 20]] and got.words[0].score == 1.0
    bare = TextLine("no chars", 1.0, [[0, 0], [1, 0], [1, 1], [0, 1]])
    assert text_layer_words((bare,)) == (bare,)
