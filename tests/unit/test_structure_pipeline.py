"""The pipeline's structure step (serve_app.flow.pipeline) over stand-in stages:
regions only when asked, a clear 400 where no structure stages are served, the
table bound (the largest tables recognised, the others noted), the words used to
split lines between cells kept out of the answer unless asked. No models."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serve_app.core.engine_config import EngineConfig, StructureOptions
from serve_app.core.errors import BadRequest
from serve_app.core.request_options import OcrOptions
from serve_app.core.results import Recognition
from serve_app.flow.pipeline import Pipeline, Stages
from serve_app.structure.layout import LayoutBox
from serve_app.structure.table_structure import TableStructure

pytestmark = pytest.mark.unit

TITLE = [[10, 10], [300, 10], [300, 40], [10, 40]]
CELL_LINE = [[20, 110], [190, 110], [190, 130], [20, 130]]  # "a b": over both cells of the table


class Fake:
    def __init__(self, layout):
        self.layout_boxes = layout
        self.tables: list[tuple[int, int]] = []

    async def detect(self, work, params=None, ctx=None):
        return np.array([TITLE, CELL_LINE], np.float32)

    async def recognize(self, crops, ctx=None):
        texts = ["Report", "a b"]
        return [Recognition(t, 0.9, tuple((i / len(t), (i + 1) / len(t)) for i in range(len(t)))) for t in texts]

    async def layout(self, page, ctx=None):
        return self.layout_boxes

    async def table(self, crop, ctx=None):
        self.tables.append(crop.shape[:2])
        h, w = crop.shape[:2]
        return TableStructure(("<tr>", "<td></td>", "<td></td>", "</tr>"),
                              np.array([[0, 0, w / 2, h], [w / 2, 0, w, h]], np.float32))

    def stages(self, structure=True):
        return Stages(self.detect, None, self.recognize, self.layout if structure else None,
                      self.table if structure else None)


def read(fake, config=None, structure=True, stages=True, **opts):
    page = np.full((300, 400, 3), 255, np.uint8)
    pipe = Pipeline(fake.stages(stages), config or EngineConfig())
    return asyncio.run(pipe.read(page, OcrOptions(structure=structure, **opts)))


LAYOUT = [LayoutBox("table", (10, 100, 210, 140), 0.9), LayoutBox("title", (5, 5, 310, 45), 0.8)]


def test_structure_gives_regions_in_order_with_the_table_filled_and_no_words_unless_asked():
    fake = Fake(LAYOUT)
    r = read(fake)
    assert [(g.type, g.lines) for g in r.regions] == [("title", (0,)), ("table", (1,))]
    assert r.regions[1].table.html == "<table><tr><td>a</td><td>b</td></tr></table>"
    assert fake.tables == [(40, 200)]  # the region's crop
    assert all(line.words is None for line in r.lines)
    assert "structure" in r.timings_ms
    assert read(Fake(LAYOUT), return_words=True).lines[1].words is not None


def test_without_structure_there_are_no_regions_and_no_structure_stage_is_called():
    fake = Fake(LAYOUT)
    r = read(fake, structure=False)
    assert r.regions is None and fake.tables == [] and "regions" not in r.to_dict()
    assert [line.text for line in r.lines] == ["Report", "a b"]


def test_structure_where_no_structure_stages_are_served_is_a_400_naming_it():
    with pytest.raises(BadRequest, match="structure"):
        read(Fake(LAYOUT), stages=False)


def test_tables_past_max_tables_are_not_recognised_and_say_so():
    many = [LayoutBox("table", (10, 60 + 40 * k, 10 + 100 + 10 * k, 90 + 40 * k), 0.9) for k in range(5)]
    fake = Fake(many)
    config = EngineConfig(structure=StructureOptions(max_tables=2))
    r = read(fake, config)
    assert len(fake.tables) == 2
    assert sorted(w for _, w in fake.tables) == [130, 140]  # the two largest (widths 100 to 140)
    tables = [g for g in r.regions if g.type == "table"]
    assert sum(g.table is not None for g in tables) == 2
    noted = [g for g in tables if g.table is None]
    assert len(noted) == 3 and all("max_tables" in g.note for g in noted)


def test_regions_past_max_regions_keep_the_best():
    boxes = [LayoutBox("text", (0, 200 + k, 10, 205 + k), 0.5 + k / 100) for k in range(10)]
    r = read(Fake(boxes), EngineConfig(structure=StructureOptions(max_regions=3)))
    assert sorted(round(g.score, 2) for g in r.regions if g.score) == [0.57, 0.58, 0.59]
