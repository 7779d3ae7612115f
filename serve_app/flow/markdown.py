"""An answer as Markdown (format=markdown, which implies options.structure),
written from each page's typed `regions` in reading order: a title as a `#`
heading; text, references and equations as paragraphs (a line of the page
per line); a table as a pipe table (its HTML where a cell spans rows or
columns; its lines as a paragraph when its structure was not read: a bound
passed). Headers, footers, captions and figures are left out. A line no
region holds is a paragraph where it stands in reading order; a page
without regions (a job read without structure) is its blocks as
paragraphs. A document's pages in order, each after a `<!-- page N -->`
comment. Pure functions over the JSON body (serve_app.flow.formats.render
calls it); no Ray, no models."""

from __future__ import annotations

import math
import re
from typing import Any, Optional



def clean(text: str) -> str:
    """Text without control characters (a dictionary may have some)."""
    return "".join(ch for ch in text if ch.isprintable() or ch in "\t")


def raw_blocks(body: dict) -> list[Optional[list[list[int]]]]:
    """Each page's blocks as lists of indices into its results (None: none)."""
    out = []
    for p in body["pages"] if "pages" in body else [body]:
        blocks = p.get("blocks")
        out.append(None if not isinstance(blocks, list) else
                   [[int(i) for i in b.get("lines", [])] for b in blocks if isinstance(b, dict)])
    return out

# Region types whose text the Markdown leaves out: page furniture and what
# belongs to a picture rather than to the running text.
MARKDOWN_SKIPS = ("header", "footer", "figure", "figure_caption", "table_caption")
_MD_LEADING = re.compile(r"^(\s*)(\d+(?=[.)])|)([#>+\-=|.)])")  # what would start a heading, quote, list or table


def md_text(text: str) -> str:
    """A line's text as Markdown reads it literally: characters that would
    make it markup escaped (a leading marker, emphasis, links, HTML)."""
    text = clean(text).replace("\\", "\\\\")
    text = re.sub(r"([`*_\[\]<>])", r"\\\1", text)
    return _MD_LEADING.sub(lambda m: m.group(1) + m.group(2) + "\\" + m.group(3), text)


def _md_cell(text: str) -> str:
    return md_text(" ".join(text.split())).replace("|", "\\|")


def md_table(table: dict) -> str:
    """A table region's `table` as a pipe table (the first row its header),
    or its HTML when a cell spans (a pipe table cannot say so)."""
    cells = [c for c in table.get("cells") or () if isinstance(c, dict)]
    if not cells or any(int(c.get("rowspan", 1)) > 1 or int(c.get("colspan", 1)) > 1 for c in cells):
        return str(table.get("html") or "")
    rows = 1 + max(int(c.get("row", 0)) for c in cells)
    cols = 1 + max(int(c.get("col", 0)) for c in cells)
    grid = [[""] * cols for _ in range(rows)]
    for c in cells:
        grid[int(c.get("row", 0))][int(c.get("col", 0))] = _md_cell(str(c.get("text", "")))
    out = ["| " + " | ".join(grid[0]) + " |", "|" + " --- |" * cols]
    out += ["| " + " | ".join(r) + " |" for r in grid[1:]]
    return "\n".join(out)


def _page_markdown(results: list, regions: Optional[list], blocks: Optional[list[list[int]]]) -> list[str]:
    """One page's Markdown parts (blocks of text, in reading order)."""
    texts = [clean(r.get("text", "")) for r in results]

    def paragraph(indices) -> str:
        return "\n".join(md_text(texts[i]) for i in indices if 0 <= i < len(texts) and texts[i].strip())

    if not isinstance(regions, list):  # not read with structure: blocks (or all lines) as paragraphs
        groups = blocks if blocks is not None else [list(range(len(texts)))]
        placed = {i for g in groups for i in g}
        groups = list(groups) + [[i for i in range(len(texts)) if i not in placed]]
        return [p for p in (paragraph(g) for g in groups) if p]
    regions = [r for r in regions if isinstance(r, dict)]
    held = {int(i) for r in regions for i in r.get("lines") or ()}
    loose = [i for i in range(len(texts)) if i not in held]  # in reading order
    tops = [_top(r.get("box")) for r in regions]
    parts: list[str] = []
    at = 0  # the next loose line
    for region, top in zip(regions, tops):
        run = []
        while at < len(loose) and _line_mid(results[loose[at]]) < top:
            run.append(loose[at])
            at += 1
        if run:
            parts.append(paragraph(run))
        kind, lines = region.get("type"), [int(i) for i in region.get("lines") or ()]
        if kind in MARKDOWN_SKIPS:
            continue
        if kind == "title":
            heading = " ".join(md_text(texts[i]) for i in lines if 0 <= i < len(texts) and texts[i].strip())
            parts.append("# " + heading if heading else "")
        elif kind == "table" and isinstance(region.get("table"), dict):
            parts.append(md_table(region["table"]))
        else:
            parts.append(paragraph(lines))
    parts.append(paragraph(loose[at:]))
    return [p for p in parts if p]


def _top(box: Any) -> float:
    try:
        return float(min(y for _, y in box))
    except (TypeError, ValueError):
        return math.inf


def _line_mid(result: dict) -> float:
    try:
        ys = [float(y) for _, y in result["box"]]
        return (min(ys) + max(ys)) / 2
    except (KeyError, TypeError, ValueError):
        return math.inf


def render_markdown(body: dict) -> str:
    """An image's or a document's body as Markdown (module docstring)."""
    document = "pages" in body
    pages = body["pages"] if document else [body]
    out = []
    for page, blocks in zip(pages, raw_blocks(body)):
        parts = _page_markdown(page.get("results") or [], page.get("regions"), blocks)
        if document:
            parts.insert(0, f"<!-- page {int(page.get('page', len(out) + 1))} -->")
        out.append("\n\n".join(parts))
    text = "\n\n".join(p for p in out if p)
    return text + "\n" if text else ""
