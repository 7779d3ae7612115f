"""The answer written as plain text, hOCR 1.2, ALTO 4.4 or Markdown, from the JSON
body of one image (`{"image": {...}, "results": [...]}`) or of a document
(`{"document": {...}, "pages": [{"page", "width", "height", "results"}]}`).
Pure functions over that body: no Ray, no models.

- text: each page's lines in reading order, one per line, a blank line
  between blocks; pages separated by a form feed (as Tesseract's text
  output).
- hOCR: XHTML; per page an `ocr_page`, per block (serve_app.ocr.layout:
  a column's paragraph, a title, a sidebar) an `ocr_carea` > `ocr_par`,
  per line an `ocr_line`, per word an `ocrx_word` with its bbox and
  `x_wconf` (the word's score, 0-100).
- ALTO: per page a `Page` > `PrintSpace`, per block a `TextBlock`, per line
  a `TextLine`, per word a `String` (HPOS, VPOS, WIDTH, HEIGHT, WC,
  CONTENT), with `SP` where the text has a space between two words.

A body without `blocks` (blocks off, a page's text layer, a job stored
before blocks) has one block per line.

Both place words: the ingress asks the pipeline for word boxes whenever
either is wanted (OcrOptions.for_pipeline). A line without them (a job
submitted as JSON and fetched as hOCR later) gets its words' boxes estimated
by their share of the line's characters.

Boxes are axis-aligned pixel rectangles around each quad (hOCR and ALTO
have no quads); a vertical line (read top to bottom) carries hOCR's
`textangle 270`, any other its bottom edge as hOCR's `baseline`.

- Markdown (format=markdown implies options.structure): from each page's
  typed regions (serve_app/flow/markdown.py)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional
from xml.etree import ElementTree as ET

import numpy as np

from serve_app.core.errors import BadRequest
from serve_app.core.request_options import FORMATS
from serve_app.ocr.crop import char_quad, is_vertical
from serve_app.ocr.words import split_words

OCR_SYSTEM = "serve_app PP-OCR (Paddle Inference)"
# hOCR's ocr-langs and ocr-scripts: the languages of the model set that read the body (its "model"; the sets'
# other languages are written in Latin letters).
SCRIPTS = {"zh": "Hans", "zh-Hant": "Hant", "ja": "Jpan"}


def languages(body: dict) -> tuple[str, ...]:
    """The languages of the model set named by the body's "model" (a body
    without one: the default set's); () for a set of the user's own
    (its languages are in the service's config, not in the body)."""
    from serve_app.core.model_sets import DEFAULT_MODEL, SETS

    name = body.get("model") or DEFAULT_MODEL
    return SETS[name].languages if name in SETS else ()

MEDIA_TYPES = {
    "json": "application/json",
    "text": "text/plain; charset=utf-8",
    "hocr": "application/xhtml+xml; charset=utf-8",
    "alto": "application/xml; charset=utf-8",
    "markdown": "text/markdown; charset=utf-8",
}

XHTML_NS = "http://www.w3.org/1999/xhtml"
ALTO_NS = "http://www.loc.gov/standards/alto/ns-v4#"
ALTO_SCHEMA = "http://www.loc.gov/standards/alto/v4/alto-4-4.xsd"
XLINK_NS = "http://www.w3.org/1999/xlink"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"


@dataclass(frozen=True)
class Word:
    text: str
    bbox: tuple[int, int, int, int]  # x0, y0, x1, y1
    score: float
    space_before: bool  # the line's text has a space between this word and the one before


@dataclass(frozen=True)
class Line:
    text: str
    score: float
    bbox: tuple[int, int, int, int]
    vertical: bool  # read top to bottom (serve_app.ocr.crop.is_vertical)
    slope: float  # of the bottom edge (hOCR baseline), in image coordinates
    offset: float  # the bottom edge's height at the bbox's left, relative to its bottom
    words: tuple[Word, ...]


@dataclass(frozen=True)
class Page:
    number: int  # from 1
    width: int
    height: int
    lines: tuple[Line, ...]
    blocks: tuple[tuple[int, ...], ...] = ()  # indices into lines, in reading order; () = one per line

    def line_blocks(self) -> list[tuple[int, ...]]:
        return list(self.blocks) if self.blocks else [(i,) for i in range(len(self.lines))]


def render(body: dict, fmt: str) -> tuple[str, str]:
    """(document, media type) of a result body in `fmt` (json, text, hocr,
    alto, markdown). json gives the body back as it is (the caller serialises it)."""
    if fmt not in FORMATS:
        raise BadRequest(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "json":
        import json

        return json.dumps(body, ensure_ascii=False), MEDIA_TYPES["json"]
    if fmt == "text":
        return render_text(body), MEDIA_TYPES[fmt]
    if fmt == "markdown":
        from serve_app.flow.markdown import render_markdown

        return render_markdown(body), MEDIA_TYPES[fmt]
    pages = pages_of(body)
    out = render_hocr(pages, languages(body)) if fmt == "hocr" else render_alto(pages)
    return out, MEDIA_TYPES[fmt]


# -- the body, read once into pages, lines and words ---------------------------


def raw_pages(body: dict) -> list[tuple[int, int, int, list[dict]]]:
    """(number, width, height, results) of each page: an image body is one
    page, a document body has its pages in order."""
    if "pages" in body:
        return [(p.get("page", i + 1), p.get("width", 0), p.get("height", 0), p.get("results") or [])
                for i, p in enumerate(body["pages"])]
    image = body.get("image") or {}
    return [(1, image.get("width", 0), image.get("height", 0), body.get("results") or [])]


def raw_blocks(body: dict) -> list[Optional[list[list[int]]]]:
    """Each page's blocks as lists of indices into its results (None: the
    body has none)."""
    pages = body["pages"] if "pages" in body else [body]
    out = []
    for p in pages:
        blocks = p.get("blocks")
        out.append(None if not isinstance(blocks, list) else
                   [[int(i) for i in b.get("lines", [])] for b in blocks if isinstance(b, dict)])
    return out


def pages_of(body: dict) -> list[Page]:
    pages = []
    for (number, w, h, results), blocks in zip(raw_pages(body), raw_blocks(body)):
        w, h = int(w), int(h)
        got = [line_of(r, w, h) for r in results]
        at, kept = {}, []
        for i, ln in enumerate(got):
            if ln is not None:
                at[i] = len(kept)
                kept.append(ln)
        grouped: tuple[tuple[int, ...], ...] = ()
        if blocks is not None:
            grouped = tuple(g for g in (tuple(at[i] for i in b if i in at) for b in blocks) if g)
            placed = {i for g in grouped for i in g}
            grouped += tuple((i,) for i in range(len(kept)) if i not in placed)  # a line no block holds
        pages.append(Page(int(number), w, h, tuple(kept), grouped))
    return pages


def line_of(result: dict, w: int, h: int) -> Optional[Line]:
    text = clean(result.get("text", ""))
    if not text.strip():
        return None
    quad = np.asarray(result["box"], dtype=np.float64).reshape(4, 2)
    score = float(result.get("score", 0.0))
    vertical = bool(is_vertical(quad))
    if result.get("words"):
        got = [(clean(wd["text"]), wd["box"], float(wd.get("score", score))) for wd in result["words"]]
    else:  # estimated: each word's share of the line's characters
        n = len(text)
        spans = [(i / n, (i + 1) / n) for i in range(n)]
        got = [(ws.text, char_quad(quad, ws.start, ws.end, vertical, False), score)
               for ws in split_words(text, spans, [score] * n)]
    spaced = spaces_before(text, [t for t, _, _ in got])
    words = tuple(Word(t, bbox_of(b, w, h), s, sp) for (t, b, s), sp in zip(got, spaced) if t.strip())
    if not words:
        return None
    _, _, br, bl = quad
    bbox = bbox_of(quad, w, h)
    dx = br[0] - bl[0]
    slope = (br[1] - bl[1]) / dx if abs(dx) > 1e-6 else 0.0
    offset = bl[1] + slope * (bbox[0] - bl[0]) - bbox[3]
    return Line(text, score, bbox, vertical, slope, offset, words)


def bbox_of(quad: Any, w: int, h: int) -> tuple[int, int, int, int]:
    """The integer rectangle around a quad, inside the page, at least 1 px."""
    q = np.asarray(quad, dtype=np.float64).reshape(-1, 2)
    x0 = int(min(max(math.floor(q[:, 0].min()), 0), max(w - 1, 0)))
    y0 = int(min(max(math.floor(q[:, 1].min()), 0), max(h - 1, 0)))
    x1 = int(max(min(math.ceil(q[:, 0].max()), w), x0 + 1))
    y1 = int(max(min(math.ceil(q[:, 1].max()), h), y0 + 1))
    return x0, y0, x1, y1


def spaces_before(text: str, words: list[str]) -> list[bool]:
    """For each word, whether `text` has whitespace between it and the word
    before (False for the first). Words are looked for in order."""
    out, pos = [], 0
    for i, word in enumerate(words):
        at = text.find(word, pos)
        if at < 0:  # not found as such: assume a space, as between Latin words
            out.append(i > 0)
            continue
        out.append(i > 0 and any(c.isspace() for c in text[pos:at]))
        pos = at + len(word)
    return out


_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def clean(text: str) -> str:
    """Text without the characters XML 1.0 cannot hold (a dictionary may
    have control characters)."""
    return _NOT_XML.sub("", text)


# -- text ----------------------------------------------------------------------


def render_text(body: dict) -> str:
    out = []
    for (_, _, _, results), blocks in zip(raw_pages(body), raw_blocks(body)):
        texts = [clean(r.get("text", "")) for r in results]
        groups = blocks if blocks is not None else [list(range(len(texts)))]
        placed = {i for g in groups for i in g}
        groups = list(groups) + [[i for i in range(len(texts)) if i not in placed]]
        parts = ["".join(texts[i] + "\n" for i in g if 0 <= i < len(texts) and texts[i].strip()) for g in groups]
        out.append("\n".join(p for p in parts if p))
    return "\f".join(out)


# -- hOCR 1.2 ------------------------------------------------------------------

HOCR_DOCTYPE = ('<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Transitional//EN" '
                '"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd">')
HOCR_CAPABILITIES = "ocr_page ocr_carea ocr_par ocr_line ocrx_word ocrp_wconf"


def _bbox(b: tuple[int, int, int, int]) -> str:
    return f"bbox {b[0]} {b[1]} {b[2]} {b[3]}"


def _union(boxes: list[tuple[int, int, int, int]]) -> tuple[int, int, int, int]:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def _hocr_line(par: ET.Element, line: Line, p: int, n: int) -> tuple[ET.Element, list[bool]]:
    """Line n of page p as an ocr_line in par; (its span, its words' spacing)."""
    props = [_bbox(line.bbox)]
    if line.vertical:  # read top to bottom: turned 90 degrees clockwise (textangle is counter-clockwise)
        props.append("textangle 270")
    elif abs(line.slope) <= 1.0:
        props.append(f"baseline {line.slope:.3f} {line.offset:.0f}")
    span = ET.SubElement(par, "span", {"class": "ocr_line", "id": f"line_{p}_{n}", "title": "; ".join(props)})
    for k, word in enumerate(line.words, 1):
        wconf = max(0, min(100, round(word.score * 100)))
        ET.SubElement(span, "span", {"class": "ocrx_word", "id": f"word_{p}_{n}_{k}",
                                     "title": f"{_bbox(word.bbox)}; x_wconf {wconf}"}).text = word.text
    return span, [w.space_before for w in line.words]


def render_hocr(pages: list[Page], langs: tuple[str, ...] = ()) -> str:
    html = ET.Element("html", {"xmlns": XHTML_NS})
    head = ET.SubElement(html, "head")
    ET.SubElement(head, "title").text = "OCR"
    ET.SubElement(head, "meta", {"http-equiv": "Content-Type", "content": "text/html;charset=utf-8"})
    scripts = dict.fromkeys(SCRIPTS.get(lang, "Latn") for lang in langs)
    for name, content in (("ocr-system", OCR_SYSTEM), ("ocr-capabilities", HOCR_CAPABILITIES),
                          ("ocr-number-of-pages", str(len(pages))), ("ocr-langs", " ".join(langs)),
                          ("ocr-scripts", " ".join(scripts))):
        if content:  # (a set of the user's own: no languages said)
            ET.SubElement(head, "meta", {"name": name, "content": content})
    body = ET.SubElement(html, "body")
    spacing: list[tuple[ET.Element, list[bool]]] = []
    for page in pages:
        p = page.number
        div = ET.SubElement(body, "div", {"class": "ocr_page", "id": f"page_{p}",
                                          "title": f"bbox 0 0 {page.width} {page.height}; ppageno {p - 1}"})
        for b, members in enumerate(page.line_blocks(), 1):
            box = _union([page.lines[i].bbox for i in members])
            area = ET.SubElement(div, "div", {"class": "ocr_carea", "id": f"block_{p}_{b}", "title": _bbox(box)})
            par = ET.SubElement(area, "p", {"class": "ocr_par", "id": f"par_{p}_{b}", "title": _bbox(box)})
            for n in members:
                spacing.append(_hocr_line(par, page.lines[n], p, n + 1))
    ET.indent(html, space=" ")
    # Between a line's words exactly what its text has: a space, or nothing
    # (between Chinese characters); indent's newlines would read as spaces.
    for span, spaced in spacing:
        words = list(span)
        span.text = None
        for i, word in enumerate(words):
            word.tail = " " if i + 1 < len(words) and spaced[i + 1] else None
    xml = ET.tostring(html, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{HOCR_DOCTYPE}\n{xml}\n'


# -- ALTO 4.4 --------------------------------------------------------------------


def render_alto(pages: list[Page]) -> str:
    ET.register_namespace("", ALTO_NS)
    ET.register_namespace("xlink", XLINK_NS)
    ET.register_namespace("xsi", XSI_NS)

    def el(parent: Optional[ET.Element], tag: str, **attrs: Any) -> ET.Element:
        attrs = {k: str(v) for k, v in attrs.items()}
        name = f"{{{ALTO_NS}}}{tag}"
        return ET.Element(name, attrs) if parent is None else ET.SubElement(parent, name, attrs)

    alto = el(None, "alto")
    alto.set(f"{{{XSI_NS}}}schemaLocation", f"{ALTO_NS} {ALTO_SCHEMA}")
    desc = el(alto, "Description")
    el(desc, "MeasurementUnit").text = "pixel"
    proc = el(desc, "Processing", ID="ocr_processing")
    el(el(proc, "processingSoftware"), "softwareName").text = OCR_SYSTEM
    layout = el(alto, "Layout")
    for page in pages:
        p = page.number
        pg = el(layout, "Page", ID=f"page_{p}", PHYSICAL_IMG_NR=p, WIDTH=page.width, HEIGHT=page.height)
        space = el(pg, "PrintSpace", HPOS=0, VPOS=0, WIDTH=page.width, HEIGHT=page.height)
        for b, members in enumerate(page.line_blocks(), 1):
            x0, y0, x1, y1 = _union([page.lines[i].bbox for i in members])
            block = el(space, "TextBlock", ID=f"block_{p}_{b}", HPOS=x0, VPOS=y0, WIDTH=x1 - x0, HEIGHT=y1 - y0)
            for i in members:
                _alto_line(el, block, page.lines[i], p, i + 1)
    ET.indent(alto, space=" ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(alto, encoding="unicode") + "\n"


def _alto_line(el, block: ET.Element, line: Line, p: int, n: int) -> None:
    """Line n of page p as a TextLine in block, its words as Strings."""
    x0, y0, x1, y1 = line.bbox
    box = dict(HPOS=x0, VPOS=y0, WIDTH=x1 - x0, HEIGHT=y1 - y0)
    tl = el(block, "TextLine", ID=f"line_{p}_{n}", **box)
    prev: Optional[Word] = None
    for k, word in enumerate(line.words, 1):
        if prev is not None and word.space_before:
            gap_at = prev.bbox[2]
            el(tl, "SP", HPOS=gap_at, VPOS=y0, WIDTH=max(0, word.bbox[0] - gap_at))
        a0, b0, a1, b1 = word.bbox
        el(tl, "String", ID=f"string_{p}_{n}_{k}", HPOS=a0, VPOS=b0, WIDTH=a1 - a0, HEIGHT=b1 - b0,
           WC=f"{max(0.0, min(1.0, word.score)):.4f}", CONTENT=word.text)
        prev = word
