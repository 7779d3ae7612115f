"""The table evaluation set, drawn in code with its truth (nothing
downloaded): four styles, each alone and on a page under a title and a
paragraph, scored by harness/table_scores.py in load_tests/bench_structure.py
and tests/integration/test_structure_accuracy.py.

Styles:
- `ruled`: every row and column ruled;
- `header_rule`: one rule under the header, no other lines;
- `zebra`: no lines, every other body row shaded;
- `spanning`: ruled, a two-row header whose first cell spans both rows and
  whose groups span two columns each.

Text is DejaVu Sans (the header in DejaVu Sans Bold; fonts-dejavu-core, as
harness/pages.py draws), black on white or light grey, sizes a page scanned
at 150-200 dpi has. The same (style, seed) always gives the same pixels."""

from __future__ import annotations

import html
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from harness.pages import Canvas, sentences

STYLES = ("ruled", "header_rule", "zebra", "spanning")
PLACES = ("alone", "page")
BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"
REGULAR = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"

TITLES = ("Quarterly results by region", "Delivery schedule for the spring season",
          "Operating costs of the regional depots", "Customer orders and payments",
          "Project budget and spending review", "Energy use across the main sites")
NAMES = ("North depot", "South office", "East wing", "West yard", "Central store", "Harbour site",
         "River plant", "Hill station", "Park avenue", "Market hall", "Old town", "Airport road")
HEADS = ("Orders", "Revenue", "Costs", "Margin", "Staff", "Growth", "Budget", "Share", "Units", "Visits")
GROUPS = ("Sales", "Costs", "Staff", "Orders")
PERIODS = (("Q1", "Q2"), ("2023", "2024"), ("Plan", "Actual"))


@lru_cache(maxsize=8)
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} not found: install fonts-dejavu-core (tests/system/packages.txt)")
    return ImageFont.truetype(path, size)


@dataclass(frozen=True)
class Cell:
    """A truth cell: its grid place (0-based) and text."""

    row: int
    col: int
    rowspan: int
    colspan: int
    text: str


@dataclass(frozen=True)
class TableTruth:
    cells: tuple[Cell, ...]
    header_rows: int

    @property
    def rows(self) -> int:
        return max(c.row + c.rowspan for c in self.cells)

    @property
    def cols(self) -> int:
        return max(c.col + c.colspan for c in self.cells)

    @property
    def html(self) -> str:
        """As SLANet writes a table: <thead> for the header rows, <tbody>
        for the rest, <td> cells with rowspan/colspan where > 1."""
        parts = ["<table>"]
        for r in range(self.rows):
            if r == 0:
                parts.append("<thead>")
            if r == self.header_rows:
                parts.append("</thead><tbody>")
            parts.append("<tr>")
            for c in sorted((c for c in self.cells if c.row == r), key=lambda c: c.col):
                span = (f' rowspan="{c.rowspan}"' if c.rowspan > 1 else "") + \
                       (f' colspan="{c.colspan}"' if c.colspan > 1 else "")
                parts.append(f"<td{span}>{html.escape(c.text)}</td>")
            parts.append("</tr>")
        parts.append("</tbody></table>")
        return "".join(parts)


@dataclass(frozen=True)
class DrawnTable:
    """One image of the set: a table alone (the image is the table with a
    margin) or on a page; `box` is the table's (x0, y0, x1, y1) in the
    image, `title` the page's title (None alone)."""

    name: str
    style: str
    place: str
    image: np.ndarray  # BGR
    truth: TableTruth
    box: tuple[int, int, int, int]
    title: str | None = None

    def crop(self, margin: int = 12) -> np.ndarray:
        """The true table crop (with a white margin, as a layout box has), what the peer is given."""
        h, w = self.image.shape[:2]
        x0, y0, x1, y1 = self.box
        return np.ascontiguousarray(self.image[max(0, y0 - margin):min(h, y1 + margin),
                                               max(0, x0 - margin):min(w, x1 + margin)])


def _money(rng: random.Random) -> str:
    return f"{rng.randint(1, 98)},{rng.randint(0, 999):03d}.{rng.randint(0, 99):02d}"


def _value(rng: random.Random, head: str) -> str:
    if head in ("Revenue", "Costs", "Budget"):
        return _money(rng)
    if head in ("Margin", "Share", "Growth"):
        return f"{rng.randint(1, 60)}.{rng.randint(0, 9)}%"
    return str(rng.randint(12, 4800))


def table_truth(style: str, seed: int) -> TableTruth:
    """The cells of (style, seed): a first column of names, numbers beside."""
    rng = random.Random(f"{style}:{seed}")
    n_rows = rng.randint(4, 7)
    cells: list[Cell] = []
    names = rng.sample(NAMES, n_rows)
    if style == "spanning":
        groups = rng.sample(GROUPS, rng.choice((2, 3)))
        sub = rng.choice(PERIODS)
        cells.append(Cell(0, 0, 2, 1, "Site"))
        for g, group in enumerate(groups):
            cells.append(Cell(0, 1 + 2 * g, 1, 2, group))
            cells += [Cell(1, 1 + 2 * g + k, 1, 1, s) for k, s in enumerate(sub)]
        heads = [{"Sales": "Revenue"}.get(g, g) for g in groups for _ in sub]
        for r, name in enumerate(names):
            cells.append(Cell(2 + r, 0, 1, 1, name))
            cells += [Cell(2 + r, 1 + k, 1, 1, _value(rng, h)) for k, h in enumerate(heads)]
        return TableTruth(tuple(cells), header_rows=2)
    heads = rng.sample(HEADS, rng.randint(3, 4))
    cells.append(Cell(0, 0, 1, 1, "Site"))
    cells += [Cell(0, 1 + k, 1, 1, h) for k, h in enumerate(heads)]
    for r, name in enumerate(names):
        cells.append(Cell(1 + r, 0, 1, 1, name))
        cells += [Cell(1 + r, 1 + k, 1, 1, _value(rng, h)) for k, h in enumerate(heads)]
    return TableTruth(tuple(cells), header_rows=1)


def _draw_table(draw: ImageDraw.ImageDraw, x0: int, y0: int, truth: TableTruth, style: str,
                size: int = 24) -> tuple[int, int, int, int]:
    """Draw the table with its top-left at (x0, y0); its box."""
    reg, bold = _font(REGULAR, size), _font(BOLD, size)
    pad_x, row_h = 18, int(size * 1.9)
    widths = [0] * truth.cols
    for c in truth.cells:
        if c.colspan == 1:
            f = bold if c.row < truth.header_rows else reg
            widths[c.col] = max(widths[c.col], int(draw.textlength(c.text, font=f)) + 2 * pad_x)
    xs = [x0]
    for w in widths:
        xs.append(xs[-1] + w)
    ys = [y0 + r * row_h for r in range(truth.rows + 1)]
    x1, y1 = xs[-1], ys[-1]
    if style == "zebra":
        for r in range(truth.header_rows, truth.rows):
            if (r - truth.header_rows) % 2 == 1:
                draw.rectangle((x0, ys[r], x1, ys[r + 1]), fill=226)
    for c in truth.cells:
        f = bold if c.row < truth.header_rows else reg
        cx0, cx1 = xs[c.col], xs[c.col + c.colspan]
        cy0, cy1 = ys[c.row], ys[c.row + c.rowspan]
        tw = draw.textlength(c.text, font=f)
        # names left, numbers (and their heads) right, a group's head centred over its columns
        tx = cx0 + pad_x if c.col == 0 else (cx0 + (cx1 - cx0 - tw) / 2 if c.colspan > 1 else cx1 - pad_x - tw)
        draw.text((tx, (cy0 + cy1) / 2), c.text, fill=0, font=f, anchor="lm")
    if style in ("ruled", "spanning"):
        for c in truth.cells:  # each cell's own border: a spanning cell has no line through it
            draw.rectangle((xs[c.col], ys[c.row], xs[c.col + c.colspan], ys[c.row + c.rowspan]), outline=0, width=2)
    elif style == "header_rule":
        hy = ys[truth.header_rows]
        draw.line((x0, hy, x1, hy), fill=0, width=2)
    return x0, y0, x1 + 1, y1 + 1


def drawn_table(style: str, seed: int, place: str) -> DrawnTable:
    if style not in STYLES or place not in PLACES:
        raise ValueError(f"style must be one of {STYLES} and place one of {PLACES}, not {style!r}, {place!r}")
    truth = table_truth(style, seed)
    name = f"{style}_{seed}_{place}"
    if place == "alone":
        probe = ImageDraw.Draw(Image.new("L", (4000, 1200), 255))
        _, _, w, h = _draw_table(probe, 0, 0, truth, style)
        img = Image.new("L", (w + 48, h + 48), 255)
        box = _draw_table(ImageDraw.Draw(img), 24, 24, truth, style)
        rgb = np.asarray(img.convert("RGB"))
        return DrawnTable(name, style, place, np.ascontiguousarray(rgb[..., ::-1]), truth, box)
    rng = random.Random(f"page:{style}:{seed}")
    title = TITLES[(STYLES.index(style) + seed) % len(TITLES)]
    c = Canvas(1240, 1000)
    c.text(80, 60, title, size=36)
    y = 150
    for s in sentences(rng, 3, 1080, c, "P"):
        c.text(80, y, s)
        y += 40
    box = _draw_table(c.draw, 80, y + 50, truth, style)
    page = c.page(name)
    return DrawnTable(name, style, place, page.image, truth, box, title)


def table_set(seeds: int = 3, styles=STYLES, places=PLACES) -> list[DrawnTable]:
    """Every style x seed x place, in that order."""
    return [drawn_table(s, k, p) for s in styles for k in range(seeds) for p in places]
