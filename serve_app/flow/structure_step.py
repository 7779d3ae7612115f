"""The pipeline's structure step (options.structure), after the page's
lines are read: its layout regions from the layout stage, each table
region's structure from the table stage (bounded: engine.structure), the
lines matched into cells and regions (serve_app.structure, off the loop).
No Ray import."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import numpy as np

from serve_app.core.engine_config import StructureOptions
from serve_app.core.request_context import RequestContext
from serve_app.core.results import Region, Table, TextLine, WordBox
from serve_app.flow.assemble import all_or_none
from serve_app.ocr.orientation import move_box, to_upright, turn_lines, upright
from serve_app.structure.layout import LayoutBox
from serve_app.structure.regions import assemble_regions, assign_lines
from serve_app.structure.settle import settle_layout
from serve_app.structure.table_match import match_table


async def read_structure(stages: Any, opts: StructureOptions, img: np.ndarray, lines: tuple[TextLine, ...],
                         ctx: RequestContext, angle: int = 0) -> tuple[Region, ...]:
    """The page's regions in reading order: its layout, each table
    region's structure (at most structure.max_tables of them, the
    largest; concurrently), the lines matched into them. The layout is
    settled against the lines first (serve_app.structure.settle). A page
    turned `angle` degrees clockwise (serve_app.ocr.orientation) is read
    upright, its lines moved into that view, and the regions' and cells'
    boxes moved back into the page's pixels (the models were trained on
    upright pages: sideways, a table is found as text)."""
    if not angle:
        return await _read_structure(stages, opts, img, lines, ctx)
    h, w = img.shape[:2]
    up = await asyncio.to_thread(upright, img, angle)
    regions = await _read_structure(stages, opts, up, turn_lines(lines, angle, w, h, to_upright), ctx)
    back = lambda box: move_box(box, angle, w, h)  # noqa: E731 - (w, h: the page as sent)
    return tuple(replace(r, box=back(r.box), table=None if r.table is None else replace(
        r.table, cells=tuple(replace(c, box=back(c.box)) for c in r.table.cells))) for r in regions)


async def _read_structure(stages: Any, opts: StructureOptions, img: np.ndarray, lines: tuple[TextLine, ...],
                          ctx: RequestContext) -> tuple[Region, ...]:
    ctx.check("layout")
    boxes: list[LayoutBox] = list(await stages.layout(img, ctx=ctx))
    notes: dict[int, str] = {}
    if len(boxes) > opts.max_regions:  # a stage of another config: the bound is this pipeline's
        boxes = sorted(boxes, key=lambda b: -b.score)[: opts.max_regions]
    boxes = await asyncio.to_thread(settle_layout, boxes, lines, opts.layout_score, img)  # off the loop
    h, w = img.shape[:2]
    tables = [j for j, b in enumerate(boxes) if b.type == "table"]
    tables.sort(key=lambda j: -(boxes[j].box[2] - boxes[j].box[0]) * (boxes[j].box[3] - boxes[j].box[1]))
    wanted = []
    for j in tables:
        x0, y0, x1, y1 = (int(round(v)) for v in boxes[j].box)
        x0, y0, x1, y1 = max(0, x0), max(0, y0), min(w, x1), min(h, y1)
        if len(wanted) >= opts.max_tables:
            notes[j] = (f"table not recognised: the page has more than {opts.max_tables} table regions "
                        f"(engine.structure.max_tables); its lines are in this region")
        elif x1 - x0 < opts.min_table_side or y1 - y0 < opts.min_table_side:
            notes[j] = (f"table not recognised: {x1 - x0}x{y1 - y0} px is under "
                        f"engine.structure.min_table_side ({opts.min_table_side} px)")
        else:
            wanted.append((j, (x0, y0, x1, y1)))
    ctx.check("table structure")
    found = await all_or_none([stages.table(np.ascontiguousarray(img[y0:y1, x0:x1]), ctx=ctx)
                               for _, (x0, y0, x1, y1) in wanted])
    assigned = await asyncio.to_thread(assign_lines, boxes, lines)  # off the loop, as the matching below
    matched: dict[int, Table] = {}
    for (j, (x0, y0, _, _)), structure in zip(wanted, found):
        note = None
        if structure.truncated:
            note = (f"table cut after {len(structure.cells)} cells (engine.structure.max_table_cells, or the "
                    f"recogniser's 501 tokens): the lines of the rest are in the cells nearest them")
        matched[j] = await asyncio.to_thread(match_table, structure, (x0, y0), [lines[i] for i in assigned[j]], note)
    return await asyncio.to_thread(assemble_regions, boxes, lines, matched, notes)



def text_layer_words(lines: tuple[TextLine, ...]) -> tuple[TextLine, ...]:
    """A PDF text layer's lines with words made from their characters'
    boxes (a run of characters is one line, a table's row included): a
    word ends at a space, or where the next character starts more than a
    quarter of the line's height after the last one ended; its box is its
    characters' (score 1.0, as the line's). A line without characters is
    left whole."""
    out = []
    for line in lines:
        if not line.chars:
            out.append(line)
            continue
        pts = [np.asarray(c.box, dtype=np.float64).reshape(-1, 2) for c in line.chars]
        height = float(np.median([p[:, 1].max() - p[:, 1].min() for p in pts])) or 1.0
        words: list[list[tuple[str, np.ndarray]]] = [[]]
        last_x = None
        for char, p in zip(line.chars, pts):
            if char.text.isspace() or (last_x is not None and p[:, 0].min() - last_x > 0.25 * height):
                if words[-1]:
                    words.append([])
            if not char.text.isspace():
                words[-1].append((char.text, p))
            last_x = p[:, 0].max()
        boxes = []
        for word in (w for w in words if w):
            allp = np.concatenate([p for _, p in word])
            x0, y0, x1, y1 = allp[:, 0].min(), allp[:, 1].min(), allp[:, 0].max(), allp[:, 1].max()
            boxes.append(WordBox("".join(t for t, _ in word), [[x0, y0], [x1, y0], [x1, y1], [x0, y1]], 1.0))
        out.append(replace(line, words=tuple(boxes)))
    return tuple(out)
