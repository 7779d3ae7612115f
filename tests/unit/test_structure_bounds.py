"""Issue 58's hostile cases where a model's answer is the attack, over the
real pipeline (serve_app.flow.pipeline's structure step) with stand-in
stages: the layout model finding 300 "tables" (at most
engine.structure.max_tables recognised, the rest noted), or 2,000 regions
(max_regions kept), and a table whose decoder ran to its bound (the note
says so); the answer comes back whole in each, and markdown writes it.
No Ray, no models."""

from __future__ import annotations

import asyncio

import cv2
import numpy as np

from serve_app.core.engine_config import EngineConfig
from serve_app.core.request_options import OcrOptions
from serve_app.flow.markdown import render_markdown
from serve_app.flow.pipeline import Pipeline, Stages
from serve_app.core.results import Recognition
from serve_app.structure.layout import LayoutBox
from serve_app.structure.table_structure import TableStructure

W, H = 1000, 1000


def page() -> bytes:
    return cv2.imencode(".png", np.full((H, W, 3), 255, np.uint8))[1].tobytes()


class Stand:
    def __init__(self, layout_boxes, structure):
        self.layout_boxes, self.structure = layout_boxes, structure
        self.tables: list[tuple[int, int]] = []
        self.boxes = np.array([[[20, 20], [300, 20], [300, 50], [20, 50]]], np.float32)

    async def detect(self, work, params=None, ctx=None):
        return self.boxes

    async def recognize(self, crops, ctx=None):
        return [Recognition("Total", 0.9, ((0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 1.0)))
                for _ in crops]

    async def layout(self, img, ctx=None):
        return list(self.layout_boxes)

    async def table(self, crop, ctx=None):
        self.tables.append(crop.shape[:2])
        return self.structure

    def read(self, **opts):
        stages = Stages(self.detect, None, self.recognize, self.layout, self.table)
        return asyncio.run(Pipeline(stages, EngineConfig()).read(page(), OcrOptions(structure=True, **opts)))


ONE_CELL = TableStructure(("<tr>", "<td></td>", "</tr>"), np.array([[0, 0, 20, 20]], np.float32), 0.9)


def grid_boxes(n: int, kind: str) -> list[LayoutBox]:
    side = int(np.ceil(np.sqrt(n)))
    step = W // side
    return [LayoutBox(kind, (float(k % side * step), float(k // side * step), float(k % side * step + step - 4),
                             float(k // side * step + step - 4)), 0.9) for k in range(n)]


def test_300_tables_found_on_a_page_are_bounded_and_noted():
    cfg = EngineConfig().structure
    s = Stand(grid_boxes(300, "table"), ONE_CELL)
    result = s.read()
    tables = [r for r in result.regions if r.type == "table"]
    assert len(s.tables) == cfg.max_tables  # only the bound's worth of tables went to the recogniser
    assert sum(r.table is not None and r.table.note is None for r in tables) <= cfg.max_tables
    noted = [r for r in tables if r.note and "max_tables" in r.note]
    assert len(tables) <= cfg.max_regions and len(noted) == len(tables) - cfg.max_tables
    assert render_markdown(result.to_dict())  # and it is written


def test_2000_regions_are_cut_to_max_regions():
    cfg = EngineConfig().structure
    s = Stand(grid_boxes(2000, "text"), ONE_CELL)
    result = s.read()
    assert len(result.regions) <= cfg.max_regions + 1  # (+ the text region of lines no region held)
    assert s.tables == []


def test_a_table_cut_at_the_decoders_bound_says_so():
    cut = TableStructure(("<tr>", "<td></td>", "</tr>"), np.array([[0, 0, 20, 20]], np.float32), 0.9, truncated=True)
    s = Stand([LayoutBox("table", (10.0, 10.0, 500.0, 500.0), 0.9)], cut)
    (region,) = [r for r in s.read().regions if r.type == "table"]
    assert region.table is not None and "max_table_cells" in region.table.note
