"""Typed carriers passed between stages. Plain frozen dataclasses: cheap to
pickle across Ray processes and free of framework imports."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Optional

Box = list[list[float]]  # four [x, y] corners, clockwise from top-left


@dataclass(frozen=True)
class CharBox:
    """One recognised character and the quad it occupies in the image."""

    text: str
    box: Box

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "box": self.box}


@dataclass(frozen=True)
class WordBox:
    """One word (a run of characters between spaces; in Chinese and
    Japanese text one character: serve_app.ocr.words), its quad, and
    the mean probability of its characters."""

    text: str
    box: Box
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "box": self.box, "score": round(float(self.score), 6)}


@dataclass(frozen=True)
class TextLine:
    text: str
    score: float
    box: Box
    chars: Optional[tuple[CharBox, ...]] = None
    words: Optional[tuple[WordBox, ...]] = None

    def to_dict(self) -> dict[str, Any]:
        d = {"text": self.text, "score": round(float(self.score), 6), "box": self.box}
        if self.chars is not None:
            d["chars"] = [c.to_dict() for c in self.chars]
        if self.words is not None:
            d["words"] = [w.to_dict() for w in self.words]
        return d


@dataclass(frozen=True)
class Recognition:
    text: str
    score: float
    # Per character, where it lies along the crop: (start, end) as fractions
    # of the crop's width, from the CTC steps that emitted it.
    char_spans: tuple[tuple[float, float], ...] = ()
    # Per character, the probability of the CTC step that emitted it.
    char_scores: tuple[float, ...] = ()


@dataclass(frozen=True)
class Direction:
    label: str  # "0" or "180"
    score: float


@dataclass(frozen=True)
class Block:
    """A block of lines (a column's paragraph, a title, a sidebar, a table):
    its box around its lines, and their indices in the answer's results."""

    box: Box
    lines: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"box": [[round(float(x), 1), round(float(y), 1)] for x, y in self.box], "lines": list(self.lines)}


@dataclass(frozen=True)
class TableCell:
    """One cell of a table region: its grid place (0-based, spans of at
    least 1), its box in the page's pixels, and the text of the page's
    recognised lines that fall in it."""

    row: int
    col: int
    rowspan: int
    colspan: int
    box: Box
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row, "col": self.col, "rowspan": self.rowspan, "colspan": self.colspan,
                "box": [[round(float(x), 1), round(float(y), 1)] for x, y in self.box], "text": self.text}


@dataclass(frozen=True)
class Table:
    """A table's structure: its HTML (<table> with rowspan/colspan, cell
    text escaped) and its cells as data."""

    html: str
    cells: tuple[TableCell, ...] = ()
    note: Optional[str] = None  # a bound that left it partial (engine.structure), said in words

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"html": self.html, "cells": [c.to_dict() for c in self.cells]}
        if self.note is not None:
            d["note"] = self.note
        return d


# The layout detector's region types (PicoDet trained on CDLA), snake_case.
REGION_TYPES = ("text", "title", "figure", "figure_caption", "table", "table_caption", "header", "footer",
                "reference", "equation")


@dataclass(frozen=True)
class Region:
    """A layout region of a page (options.structure): its type (one of
    REGION_TYPES), box, the detector's score, the indices of the page's
    lines inside it, and for a table its structure."""

    type: str
    box: Box
    score: float
    lines: tuple[int, ...] = ()
    table: Optional[Table] = None
    note: Optional[str] = None  # a bound that left it partial (engine.structure), said in words

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type,
                             "box": [[round(float(x), 1), round(float(y), 1)] for x, y in self.box],
                             "score": round(float(self.score), 6), "lines": list(self.lines)}
        if self.table is not None:
            d["table"] = self.table.to_dict()
        if self.note is not None:
            d["note"] = self.note
        return d


@dataclass(frozen=True)
class Visualization:
    """The picture of a result (serve_app.ocr.visualize), encoded."""

    media_type: str
    data: bytes
    width: int
    height: int
    # `visualize: "boxes"` (PaddleX's ocrImage): the input image, scaled as
    # the picture is (PaddleX's inputImage).
    input: Optional["Visualization"] = None

    def to_dict(self) -> dict[str, Any]:
        d = {"media_type": self.media_type, "width": self.width, "height": self.height,
             "base64": base64.b64encode(self.data).decode("ascii")}
        if self.input is not None:
            d["input"] = self.input.to_dict()
        return d


@dataclass(frozen=True)
class OcrResult:
    width: int
    height: int
    lines: tuple[TextLine, ...] = ()
    timings_ms: dict[str, float] = field(default_factory=dict)
    visualization: Optional[Visualization] = None  # with the `visualize` option
    frames: int = 1  # an animated image's frames: only the first is read
    blocks: Optional[tuple[Block, ...]] = None  # None: blocks off (one per line, in formats)
    orientation: Optional[int] = None  # degrees the page was turned clockwise; None: not looked for
    regions: Optional[tuple[Region, ...]] = None  # options.structure; None: not asked

    def to_dict(self) -> dict[str, Any]:
        image: dict[str, Any] = {"width": self.width, "height": self.height}
        if self.frames > 1:
            image["frames"] = self.frames
            image["note"] = (f"an image of {self.frames} frames (an animation, a burst or a stereo pair): only its "
                             f"first frame was read; send each frame as an image of its own to read the others")
        return {"image": image, **_read_body(self.lines, self.timings_ms, self.visualization, self.blocks,
                                             self.orientation, self.regions)}


@dataclass(frozen=True)
class PageResult:
    """One page of a document: its size as rendered (the pixels its boxes
    are in) and its lines, read by OCR or taken from the PDF's text layer
    (only when the request asked for that: `source` says which)."""

    page: int  # 1-based
    width: int
    height: int
    lines: tuple[TextLine, ...] = ()
    timings_ms: dict[str, float] = field(default_factory=dict)
    source: str = "ocr"  # or "text_layer"
    visualization: Optional[Visualization] = None  # with options.visualize, for OCR'd pages
    blocks: Optional[tuple[Block, ...]] = None
    orientation: Optional[int] = None
    # A page over its budget (serve_app.flow.documents: render time, memory) while
    # other pages were read: {"code", "message"}, and no lines.
    error: Optional[dict[str, str]] = None
    regions: Optional[tuple[Region, ...]] = None  # options.structure; None: not asked

    def to_dict(self) -> dict[str, Any]:
        d = {"page": self.page, "width": self.width, "height": self.height, "source": self.source,
             **_read_body(self.lines, self.timings_ms, self.visualization, self.blocks, self.orientation,
                          self.regions)}
        if self.error is not None:
            d["error"] = dict(self.error)
        return d


@dataclass(frozen=True)
class DocumentResult:
    pages: tuple[PageResult, ...]
    timings_ms: dict[str, float] = field(default_factory=dict)
    kind: str = "pdf"

    def to_dict(self) -> dict[str, Any]:
        return {
            "document": {"type": self.kind, "pages": len(self.pages)},
            "pages": [p.to_dict() for p in self.pages],
            "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items()},
        }


def _read_body(lines: tuple[TextLine, ...], timings_ms: dict[str, float],
               visualization: Optional[Visualization], blocks: Optional[tuple[Block, ...]] = None,
               orientation: Optional[int] = None, regions: Optional[tuple[Region, ...]] = None) -> dict[str, Any]:
    """What an image's and a page's bodies share: lines, blocks, regions,
    the page's orientation, timings, picture."""
    d: dict[str, Any] = {"results": [line.to_dict() for line in lines]}
    if blocks is not None:
        d["blocks"] = [b.to_dict() for b in blocks]
    if regions is not None:
        d["regions"] = [r.to_dict() for r in regions]
    if orientation is not None:
        d["orientation"] = orientation
    d["timings_ms"] = {k: round(v, 2) for k, v in timings_ms.items()}
    if visualization is not None:
        d["visualization"] = visualization.to_dict()
    return d
