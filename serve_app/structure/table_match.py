"""A table's structure (serve_app.structure.table_structure) and the page's
recognised lines -> the table as HTML and as cells with their grid places.

Each line goes to the cell it matches best (RapidTable's rule: the
smallest 1 - IoU, then the smallest corner distance); a line whose words
match different cells is split there (the words of a line that go to one
cell stay one piece of its text). A cell's pieces are joined with spaces
in reading order. Grid places follow the tokens: rows at <tr>, a cell at
the first column its row leaves free under earlier rowspans. Ported from
rapid_table 0.3.0 (table_matcher/matcher.py: match_result, get_pred_html,
decode_logic_points; table_matcher/utils.py: distance, compute_iou;
Apache-2.0: THIRD_PARTY.md)."""

from __future__ import annotations

import html
import re
from typing import Optional, Sequence

import numpy as np

from serve_app.core.results import Table, TableCell, TextLine
from serve_app.structure.table_structure import CELL_TOKENS, TableStructure

_SPAN = re.compile(r' (rowspan|colspan)="(\d+)"')
_DROPPED = ("<thead>", "</thead>", "<tbody>", "</tbody>")


def xyxy(box) -> tuple[float, float, float, float]:
    """A quad (four [x, y]) or an (x0, y0, x1, y1) -> (x0, y0, x1, y1)."""
    a = np.asarray(box, dtype=np.float64)
    if a.ndim == 2:
        return float(a[:, 0].min()), float(a[:, 1].min()), float(a[:, 0].max()), float(a[:, 1].max())
    return float(a[0]), float(a[1]), float(a[2]), float(a[3])


def quad(b) -> list[list[float]]:
    x0, y0, x1, y1 = (float(v) for v in b)
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def best_cell(box, cells: np.ndarray) -> int:
    """The cell a text box belongs to: the smallest 1 - IoU, then the
    smallest distance (RapidTable's match_result), over every cell at once
    (a table of 1,000 cells and 1,500 lines took 7 s cell by cell in Python)."""
    c = np.asarray(cells, dtype=np.float64).reshape(-1, 4)
    x0, y0, x1, y1 = (float(v) for v in box)
    ix = np.minimum(x1, c[:, 2]) - np.maximum(x0, c[:, 0])
    iy = np.minimum(y1, c[:, 3]) - np.maximum(y0, c[:, 1])
    inter = np.where((ix > 0) & (iy > 0), ix * iy, 0.0)
    union = (x1 - x0) * (y1 - y0) + (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1]) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        miss = 1.0 - np.where(inter > 0, inter / union, 0.0)
    d2 = np.abs(c[:, 0] - x0) + np.abs(c[:, 1] - y0)
    d3 = np.abs(c[:, 2] - x1) + np.abs(c[:, 3] - y1)
    return int(np.lexsort((d2 + d3 + np.minimum(d2, d3), miss))[0])  # by miss, then distance; ties: the first


def grid_places(tokens: Sequence[str]) -> list[tuple[int, int, int, int]]:
    """(row, col, rowspan, colspan) of each cell token, in order."""
    places = []
    taken: set[tuple[int, int]] = set()
    row, col, i = -1, 0, 0
    while i < len(tokens):
        t = tokens[i]
        if t == "<tr>":
            row, col = row + 1, 0
        elif t in CELL_TOKENS:
            row = max(row, 0)
            spans = {"rowspan": 1, "colspan": 1}
            if t == "<td":
                while i + 1 < len(tokens) and tokens[i + 1] != ">" and tokens[i + 1] not in CELL_TOKENS:
                    i += 1
                    m = _SPAN.match(tokens[i])
                    if m:
                        spans[m.group(1)] = int(m.group(2))
            while (row, col) in taken:
                col += 1
            rs, cs = spans["rowspan"], spans["colspan"]
            places.append((row, col, rs, cs))
            taken.update((r, c) for r in range(row, row + rs) for c in range(col, col + cs))
            col += cs
        i += 1
    return places


def _pieces(line: TextLine) -> list[tuple[str, tuple[float, float, float, float]]]:
    """A line as pieces that may go to different cells: its words (with
    the line's text between them, so that a run of words keeps its own
    spacing), or the whole line when it has no words."""
    if not line.words:
        return [(line.text, xyxy(line.box))]
    out, at = [], 0
    for w in line.words:
        start = line.text.find(w.text, at)
        if start < 0:  # words not found in order in the text: the line whole
            return [(line.text, xyxy(line.box))]
        out.append((line.text[at:start + len(w.text)] if out else w.text, xyxy(w.box)))
        at = start + len(w.text)
    return out


def match_table(structure: TableStructure, origin_xy: tuple[float, float], lines: Sequence[TextLine],
                note: Optional[str] = None) -> Table:
    """The table: its HTML (<table>, cells' text escaped, rowspan/colspan
    as predicted) and its cells as data (grid place, box in the page's
    pixels, text). `origin_xy`: where the crop's (0, 0) lies on the page;
    `lines`: the page's lines in the table's region (boxes in the page's
    pixels), in reading order."""
    ox, oy = origin_xy
    cells = np.asarray(structure.cells, dtype=np.float64).reshape(-1, 4) + [ox, oy, ox, oy]
    texts: list[list[tuple[float, float, str]]] = [[] for _ in range(len(cells))]
    if len(cells):
        for line in lines:
            groups: list[tuple[int, str, float, float]] = []  # cell, text, y0, x0
            for text, box in _pieces(line):
                c = best_cell(box, cells)
                if groups and groups[-1][0] == c:
                    groups[-1] = (c, groups[-1][1] + text, groups[-1][2], groups[-1][3])
                else:
                    groups.append((c, text.strip(), box[1], box[0]))
            for c, text, y0, x0 in groups:
                if text.strip():
                    texts[c].append((y0, x0, text.strip()))
    places = grid_places(structure.tokens)
    cell_text = [" ".join(t for _, _, t in ts) for ts in texts]  # lines come in reading order
    out_cells = tuple(TableCell(r, c, rs, cs, quad(b), t)
                      for (r, c, rs, cs), b, t in zip(places, cells, cell_text))
    parts, k = ["<table>"], 0
    for t in structure.tokens:
        if t in _DROPPED:
            continue
        if t == "<td></td>":
            parts.append(f"<td>{html.escape(cell_text[k]) if k < len(cell_text) else ''}</td>")
            k += 1
        elif t == "</td>":
            parts.append(f"{html.escape(cell_text[k]) if k < len(cell_text) else ''}</td>")
            k += 1
        else:
            parts.append(t)
    parts.append("</table>")
    return Table("".join(parts), out_cells, note)
