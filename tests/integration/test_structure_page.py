"""The web page shows a structure answer (options.structure): each region a
rectangle coloured by its type, a legend of the types, and each table as a
table with its spans. In a real browser (Debian's Chromium, Playwright)
against the real HTTP app over a stand-in pipeline that answers a fixed
body: no Ray, no models (the page's drawing is what is checked here; the
models' answers are checked in test_structure_service.py)."""

from __future__ import annotations

import socket
import threading
import time
import types

import pytest

from harness.front import Method, stand_in_front
from serve_app.http.app import build_app


def quad(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def cell(row, col, text, rowspan=1, colspan=1):
    return {"row": row, "col": col, "rowspan": rowspan, "colspan": colspan, "box": quad(0, 0, 1, 1), "text": text}


BODY = {
    "image": {"width": 400, "height": 300}, "timings_ms": {"total": 1.0},
    "results": [{"text": "Report", "score": 0.99, "box": quad(10, 10, 120, 40)},
                {"text": "<b>Sales</b>", "score": 0.98, "box": quad(10, 100, 200, 120)},
                {"text": "North", "score": 0.97, "box": quad(10, 130, 100, 150)},
                {"text": "3", "score": 0.97, "box": quad(110, 130, 200, 150)}],
    "regions": [{"type": "title", "box": quad(5, 5, 130, 45), "score": 0.9, "lines": [0]},
                {"type": "table", "box": quad(5, 95, 210, 155), "score": 0.8, "lines": [1, 2, 3],
                 "table": {"html": "<table>...</table>",
                           "cells": [cell(0, 0, "<b>Sales</b>", colspan=2), cell(1, 0, "North"), cell(1, 1, "3")]}},
                {"type": "footer", "box": quad(5, 280, 100, 295), "score": 0.7, "lines": []}],
}


@pytest.fixture()
def page_url():
    import uvicorn

    front = stand_in_front()

    async def answer(upload, options, ctx=None):
        return BODY

    front.pipeline = types.SimpleNamespace(ocr=Method(answer))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(front), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_regions_are_drawn_by_type_and_a_table_is_rendered(page_url, tmp_path):
    from browser import chromium_page

    png = tmp_path / "page.png"
    from PIL import Image

    Image.new("RGB", (400, 300), "white").save(png)
    with chromium_page() as page:
        page.goto(f"{page_url}/")
        page.set_input_files("#file", str(png))
        page.wait_for_selector("svg .region")
        classes = page.locator("svg .region").evaluate_all("els => els.map(e => e.getAttribute('class'))")
        assert classes == ["region region-title", "region region-table", "region region-footer"]
        colours = page.locator("svg .region").evaluate_all("els => els.map(e => getComputedStyle(e).stroke)")
        assert len(set(colours)) == 3  # one colour per type
        assert page.locator(".regions-legend .region-key").all_text_contents() == ["title", "table", "footer"]
        table = page.locator("#lines table.rendered")
        assert table.locator("tr").count() == 2
        first = table.locator("td >> nth=0")
        assert first.text_content() == "<b>Sales</b>" and first.get_attribute("colspan") == "2"  # text, not markup
        assert table.locator("td").all_text_contents() == ["<b>Sales</b>", "North", "3"]
        assert page.locator("#lines li[data-i] .text").all_text_contents() == [r["text"] for r in BODY["results"]]
        assert page.errors == []
