"""Office pages made in code for the layout and orientation tests and
load_tests/bench_layout.py: one, two and three columns, a title across
columns, a sidebar, a table-like grid, a receipt, an invoice, a multi-page
fax. Each comes with its truth: the lines in the order a person reads them.

Drawn with PIL in DejaVu Sans (fonts-dejavu-core, installed with the
system's fontconfig; `fc-list | grep DejaVuSans`)."""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

FONT_PATHS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",)

WORDS = ("report market system water energy policy budget project service client result method review "
         "quality number member office period account design option growth health travel region season "
         "rates value order notes table delivery payment contract schedule summary meeting planning "
         "support building transport customer supply product research finance training program safety").split()


@lru_cache(maxsize=8)
def font(size: int) -> ImageFont.FreeTypeFont:
    for p in FONT_PATHS:
        if Path(p).is_file():
            return ImageFont.truetype(p, size)
    raise FileNotFoundError(f"DejaVu Sans not found at {FONT_PATHS}: install fonts-dejavu-core")


@dataclass(frozen=True)
class MadePage:
    name: str
    image: np.ndarray  # BGR
    truth: tuple[str, ...]  # lines in reading order
    boxes: tuple[tuple[int, int, int, int], ...] = ()  # each truth line's drawn box (x0, y0, x1, y1)


class Canvas:
    def __init__(self, w: int, h: int, size: int = 26):
        self.img = Image.new("L", (w, h), 255)
        self.draw = ImageDraw.Draw(self.img)
        self.size = size
        self.lines: list[str] = []
        self.boxes: list[tuple[int, int, int, int]] = []

    def text(self, x: int, y: int, s: str, size: int | None = None, right: bool = False) -> None:
        f = font(size or self.size)
        if right:
            x -= int(self.draw.textlength(s, font=f))
        self.draw.text((x, y), s, fill=0, font=f)
        self.lines.append(s)
        self.boxes.append(tuple(int(v) for v in self.draw.textbbox((x, y), s, font=f)))

    def fits(self, s: str, width: int, size: int | None = None) -> bool:
        return self.draw.textlength(s, font=font(size or self.size)) <= width

    def page(self, name: str) -> MadePage:
        rgb = np.asarray(self.img.convert("RGB"))
        return MadePage(name, np.ascontiguousarray(rgb[..., ::-1]), tuple(self.lines), tuple(self.boxes))


def sentences(rng: random.Random, n: int, width: int, canvas: Canvas, tag: str) -> list[str]:
    """n lines of words that fit `width` px, each starting with a tag and
    its number so that every line on a page is unique."""
    out = []
    for k in range(n):
        words = [f"{tag}{k + 1}"]
        while True:
            w = rng.choice(WORDS)
            if not canvas.fits(" ".join(words + [w]), width):
                break
            words.append(w)
        if k == n - 1 and len(words) > 3:  # a paragraph's last line is short
            words = words[: max(2, len(words) // 2)]
        out.append(" ".join(words))
    return out


def columns_page(n_cols: int, title: bool = False, seed: int = 1, lines_per_col: int = 14) -> MadePage:
    rng = random.Random(seed)
    W, H, margin, gutter, pitch = 1240, 1000, 60, 60, 42
    c = Canvas(W, H)
    y0 = 60
    if title:
        c.text(W // 2 - 300, 40, "Annual review of the regional transport network", size=34)
        y0 = 130
    col_w = (W - 2 * margin - (n_cols - 1) * gutter) // n_cols
    for k in range(n_cols):
        x = margin + k * (col_w + gutter)
        tag = "ABCDEF"[k]
        # two paragraphs per column
        first = sentences(rng, lines_per_col // 2, col_w, c, f"{tag}a")
        second = sentences(rng, lines_per_col - lines_per_col // 2, col_w, c, f"{tag}b")
        y = y0
        for s in first:
            c.text(x, y, s)
            y += pitch
        y += pitch // 2
        for s in second:
            c.text(x, y, s)
            y += pitch
    name = f"{n_cols}col" + ("_title" if title else "")
    return c.page(name)


def sidebar_page(seed: int = 2) -> MadePage:
    rng = random.Random(seed)
    W, H, pitch = 1240, 900, 42
    c = Canvas(W, H)
    # A sidebar in a smaller type on a pitch of its own, as a layout program sets it.
    side = ["Contents", "Overview", "Budget plan", "Risks and notes", "Contacts", "Appendix"]
    y = 92
    for s in side:
        c.text(60, y, s, size=22)
        y += 55
    main_x, main_w = 380, W - 380 - 60
    y = 80
    for s in sentences(rng, 16, main_w, c, "M"):
        c.text(main_x, y, s)
        y += pitch
    return c.page("sidebar")


def table_page(seed: int = 3) -> MadePage:
    rng = random.Random(seed)
    W, H, pitch = 1240, 800, 48
    c = Canvas(W, H)
    c.text(60, 50, "Delivery schedule for the second quarter", size=30)
    heads = ["Item", "Qty", "Unit price", "Amount"]
    xs = [60, 620, 800, 1180]
    y = 130
    for x, hd in zip(xs, heads):
        c.text(x, y, hd, right=x == xs[-1])
    for r in range(10):
        y += pitch
        item = f"{rng.choice(WORDS).capitalize()} {rng.choice(WORDS)} {r + 1}"
        qty = str(rng.randint(1, 40))
        unit = f"{rng.randint(2, 300)}.{rng.randint(0, 99):02d}"
        amount = f"{rng.randint(100, 9000)}.{rng.randint(0, 99):02d}"
        for x, s in zip(xs, [item, qty, unit, amount]):
            c.text(x, y, s, right=x == xs[-1])
    return c.page("table")


def receipt_page(seed: int = 4) -> MadePage:
    rng = random.Random(seed)
    W, pitch = 560, 44
    items = [(f"{rng.choice(WORDS).capitalize()} {rng.choice(['small', 'large', 'x2', 'plain'])}",
              f"{rng.randint(1, 30)}.{rng.randint(0, 99):02d}") for _ in range(12)]
    H = 260 + pitch * (len(items) + 4)
    c = Canvas(W, H, size=26)
    c.text(W // 2 - 120, 40, "CORNER CAFE", size=34)
    c.text(W // 2 - 150, 95, "12 Harbour Street, Leeds")
    y = 170
    for name, price in items:
        c.text(30, y, name)
        c.text(W - 30, y, price, right=True)
        y += pitch
    y += pitch // 2
    c.text(30, y, "TOTAL")
    c.text(W - 30, y, f"{rng.randint(50, 200)}.{rng.randint(0, 99):02d}", right=True)
    y += pitch
    c.text(30, y, "Paid by card")
    y += pitch
    c.text(W // 2 - 140, y + 20, "Thank you, see you soon")
    return c.page("receipt")


def invoice_page(seed: int = 5, number: int = 481) -> MadePage:
    rng = random.Random(seed)
    W, H, pitch = 1240, 1400, 44
    c = Canvas(W, H)
    c.text(60, 60, "INVOICE", size=44)
    c.text(60, 140, f"Invoice number: 2026-{number:04d}")
    c.text(60, 184, "Date: 1 December 2026")
    c.text(60, 260, "Bill to: Northwind Traders Ltd")
    c.text(60, 304, "44 Market Road, Bristol BS1 4DJ")
    y = 400
    c.text(60, y, "Description")
    c.text(1180, y, "Amount", right=True)
    for k in range(8):
        y += pitch
        c.text(60, y, f"{rng.choice(WORDS).capitalize()} {rng.choice(WORDS)} services, item {k + 1}")
        c.text(1180, y, f"{rng.randint(100, 4000)}.{rng.randint(0, 99):02d}", right=True)
    y += pitch * 2
    c.text(60, y, "Total due")
    c.text(1180, y, f"{rng.randint(9000, 20000)}.00", right=True)
    y += pitch * 2
    c.text(60, y, "Bank transfer to IBAN GB29 NWBK 6016 1331 9268 19")
    y += pitch
    c.text(60, y, "Payment within 30 days of the invoice date")
    y += pitch * 2
    c.text(60, y, "Thank you for your business")
    return c.page("invoice")


def made_pages() -> list[MadePage]:
    """The layout set: every kind the order must follow."""
    return [columns_page(1, lines_per_col=16), columns_page(2), columns_page(3), columns_page(2, title=True),
            columns_page(3, title=True, seed=7), sidebar_page(), table_page(), receipt_page(), invoice_page()]


def turned(page: MadePage, angle: int) -> MadePage:
    """The page turned `angle` degrees clockwise (as a scan fed sideways)."""
    k = {0: 0, 90: 3, 180: 2, 270: 1}[angle]  # np.rot90 turns counter-clockwise
    return MadePage(f"{page.name}_{angle}", np.ascontiguousarray(np.rot90(page.image, k)), page.truth)  # boxes dropped


def fax_tiff(pages: list[MadePage]) -> bytes:
    """A multi-page 1-bit CCITT G4 TIFF, as a fax machine writes it."""
    ims = [Image.fromarray(p.image[..., 0]).point(lambda v: 255 if v > 128 else 0).convert("1") for p in pages]
    buf = io.BytesIO()
    ims[0].save(buf, format="TIFF", compression="group4", save_all=True, append_images=ims[1:], dpi=(200, 200))
    return buf.getvalue()


# -- how well an answer's order follows the truth --------------------------------


def tiled_tiff(pages: int, side: int = 4000, tile: int = 16, first: int = 0) -> bytes:
    """A little-endian TIFF of `pages` white side x side 8-bit pages, each
    stored as uncompressed tile x tile px tiles (62,500 a 16 MP page) that
    all point at one tile of data: a few bytes a tile in its directory
    (each page has its own offsets and byte counts: Pillow refuses tag data
    shared past the file's size), decoded tile by tile. `first` > 0: the
    first page is first x first px in one tile (a small page ahead of big ones)."""
    import struct

    out = bytearray(b"II*\x00" + bytes(4))
    data_at = len(out)
    out += b"\xff" * (tile * tile) + bytes(4)
    directories = []
    for k in range(pages):
        w = h = first if k == 0 and first else side
        tw = first if k == 0 and first else tile
        n = -(-w // tw) * -(-h // tw)
        offsets_at = len(out)
        out += struct.pack("<I", data_at) * n
        counts_at = len(out)
        out += struct.pack("<H", tw * tw if tw * tw < 65536 else 65535) * n
        if len(out) % 2:
            out += b"\0"
        entries = [(256, 4, 1, w), (257, 4, 1, h), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
                   (277, 3, 1, 1), (322, 3, 1, tw), (323, 3, 1, tw),
                   (324, 4, n, offsets_at if n > 1 else data_at), (325, 3, n, counts_at if n > 2 else tw * tw)]
        directories.append(len(out))
        out += struct.pack("<H", len(entries))
        for tag, typ, count, value in entries:
            out += struct.pack("<HHI", tag, typ, count) + (struct.pack("<HH", value, 0) if typ == 3 and count <= 2
                                                            else struct.pack("<I", value))
        out += bytes(4)
    struct.pack_into("<I", out, 4, directories[0])
    for at, nxt in zip(directories, directories[1:]):
        struct.pack_into("<I", out, at + 2 + 12 * 10, nxt)
    return bytes(out)


def _similar(a: str, b: str) -> float:
    from difflib import SequenceMatcher

    return SequenceMatcher(None, a.replace(" ", "").lower(), b.replace(" ", "").lower()).ratio()


def match_truth(read: list[str], truth: tuple[str, ...], min_ratio: float = 0.6) -> list[int]:
    """For each line read, the index of the truth line it is (greedy best
    match, each truth line once), -1 if none."""
    pairs = sorted(((_similar(r, t), i, j) for i, r in enumerate(read) for j, t in enumerate(truth)), reverse=True)
    out, used = [-1] * len(read), set()
    for ratio, i, j in pairs:
        if ratio < min_ratio:
            break
        if out[i] == -1 and j not in used:
            out[i] = j
            used.add(j)
    return out


def order_score(read: list[str], truth: tuple[str, ...]) -> tuple[float, int, int]:
    """(Kendall-style fraction of pairs of matched lines in the truth's
    order, lines matched, truth lines). 1.0: the reading order is the
    truth's."""
    m = [j for j in match_truth(read, truth) if j >= 0]
    pairs = ok = 0
    for a in range(len(m)):
        for b in range(a + 1, len(m)):
            pairs += 1
            ok += m[a] < m[b]
    return (ok / pairs if pairs else 1.0), len(m), len(truth)
