"""Pages drawn in code for issue 58's hostile structure cases (the most work
a stranger can ask of the layout and table models for the fewest bytes):
a page of 2,000 ruled boxes, a table of 1,500 cells, a page of 300 small
tables, a 1 x 10,000 strip, and a title, a paragraph and a ruled table on
one page (the sane case beside them). PNG bytes; no pytest import."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw, ImageFont


def _font(size: int):
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default()


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def ruled_grid(d: ImageDraw.ImageDraw, x0: int, y0: int, rows: int, cols: int, cw: int, ch: int,
               text=None, font=None) -> None:
    """A ruled grid of rows x cols cells of cw x ch px at (x0, y0); text(r, c) in each cell, if given."""
    for r in range(rows + 1):
        d.line([(x0, y0 + r * ch), (x0 + cols * cw, y0 + r * ch)], fill=0, width=1)
    for c in range(cols + 1):
        d.line([(x0 + c * cw, y0), (x0 + c * cw, y0 + rows * ch)], fill=0, width=1)
    if text is not None:
        for r in range(rows):
            for c in range(cols):
                d.text((x0 + c * cw + 4, y0 + r * ch + 3), text(r, c), fill=0, font=font)


def ruled_boxes_page(boxes: int = 2000, cell: int = 24) -> bytes:
    """`boxes` empty ruled boxes (50 columns), each apart from the others."""
    cols = 50
    rows = -(-boxes // cols)
    img = Image.new("L", (cols * cell + 20, rows * cell + 20), 255)
    d = ImageDraw.Draw(img)
    for k in range(boxes):
        x, y = 10 + (k % cols) * cell, 10 + (k // cols) * cell
        d.rectangle([x + 3, y + 3, x + cell - 3, y + cell - 3], outline=0)
    return _png(img)


def big_table_page(rows: int = 50, cols: int = 30, cw: int = 56, ch: int = 22) -> bytes:
    """One ruled table of rows x cols cells (1,500), a number in each."""
    img = Image.new("L", (cols * cw + 40, rows * ch + 40), 255)
    ruled_grid(ImageDraw.Draw(img), 20, 20, rows, cols, cw, ch, lambda r, c: str(r * cols + c), _font(13))
    return _png(img)


def many_tables_page(tables: int = 300) -> bytes:
    """`tables` small ruled 2 x 2 tables with a digit in each cell (20 a row)."""
    per_row, cw, ch = 20, 28, 20
    img = Image.new("L", (per_row * (2 * cw + 12) + 20, -(-tables // per_row) * (2 * ch + 12) + 20), 255)
    d, font = ImageDraw.Draw(img), _font(12)
    for k in range(tables):
        x, y = 10 + (k % per_row) * (2 * cw + 12), 10 + (k // per_row) * (2 * ch + 12)
        ruled_grid(d, x, y, 2, 2, cw, ch, lambda r, c, k=k: str((k + r * 2 + c) % 10), font)
    return _png(img)


def strip(width: int = 10_000, height: int = 1) -> bytes:
    return _png(Image.new("L", (width, height), 255))


def report_page() -> bytes:
    """A title, a paragraph and a ruled 3 x 3 table, as a report's page."""
    img = Image.new("L", (1000, 760), 255)
    d = ImageDraw.Draw(img)
    d.text((60, 40), "Quarterly Report", fill=0, font=_font(44))
    for k, line in enumerate(("Sales rose in every region this quarter, led by the north.",
                              "Costs held steady and margins improved across the board.")):
        d.text((60, 140 + k * 34), line, fill=0, font=_font(24))
    cells = (("Region", "Sales", "Costs"), ("North", "120", "80"), ("South", "95", "70"))
    ruled_grid(d, 60, 260, 3, 3, 260, 70, lambda r, c: cells[r][c], _font(28))
    return _png(img)
