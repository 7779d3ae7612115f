"""best_cell over every cell at once (serve_app.structure.table_match) picks
what RapidTable's rule picks cell by cell: the smallest 1 - IoU, then the
smallest corner distance, the first on a tie; and a table of 1,000 cells
and 1,500 lines (issue 58's hostile table) matches every line. No models."""

from __future__ import annotations

import numpy as np

from serve_app.core.results import TextLine, WordBox
from serve_app.structure.table_match import best_cell, match_table
from serve_app.structure.table_structure import TableStructure


def rapidtable_rule(box, cells) -> int:
    """The scalar rule as RapidTable's match_result writes it (compute_iou, distance)."""
    def iou(a, b):
        ix, iy = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
        if ix <= 0 or iy <= 0:
            return 0.0
        inter = ix * iy
        return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)

    def distance(a, b):
        d2 = abs(b[0] - a[0]) + abs(b[1] - a[1])
        d3 = abs(b[2] - a[2]) + abs(b[3] - a[3])
        return d2 + d3 + min(d2, d3)

    keys = [(1.0 - iou(box, c), distance(box, c)) for c in cells]
    return min(range(len(keys)), key=keys.__getitem__)


def test_the_vectorised_rule_is_rapidtables_rule():
    rng = np.random.default_rng(58)
    for _ in range(300):
        xy = rng.uniform(0, 500, (40, 2))
        cells = np.concatenate([xy, xy + rng.uniform(5, 120, (40, 2))], axis=1)
        cells[rng.integers(0, 40)] = cells[rng.integers(0, 40)]  # a duplicate cell: ties go to the first
        a = rng.uniform(0, 520, 2)
        box = (*a, *(a + rng.uniform(2, 90, 2)))
        assert best_cell(box, cells) == rapidtable_rule(box, cells)


def test_a_table_of_1000_cells_and_1500_lines_puts_each_line_in_its_cell():
    rows, cols, cw, ch = 50, 30, 56, 22
    lines = []
    for r in range(rows):
        for c in range(cols):
            x, y = c * cw + 4, r * ch + 3
            q = [[x, y], [x + 30, y], [x + 30, y + 14], [x, y + 14]]
            lines.append(TextLine(str(r * cols + c), 0.9, q, None, (WordBox(str(r * cols + c), q, 0.9),)))
    tokens = []
    for r in range(34):
        tokens += ["<tr>", *["<td></td>"] * cols, "</tr>"]
    cells = np.array([[c * cw, r * ch, (c + 1) * cw, (r + 1) * ch] for r in range(34) for c in range(cols)],
                     np.float32)[:1000]
    table = match_table(TableStructure(tuple(tokens), cells, 0.9, True), (0.0, 0.0), lines)
    assert len(table.cells) == 1000
    assert [c.text for c in table.cells[:3]] == ["0", "1", "2"] and table.cells[999].text.startswith("999")
