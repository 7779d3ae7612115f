"""options.structure through every door (sync /v1/ocr, ?format=markdown,
the batch, a job's submit, the handle): each asks the one read path with
structure on, and answers with the regions or the Markdown written from
them. The HTTP app over a stand-in pipeline; no Ray, no models."""

from __future__ import annotations

import asyncio
import base64
import types

from fastapi.testclient import TestClient

from harness.front import Fake, Method, stand_in_front
from serve_app.http.app import build_app


def quad(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


BODY = {"image": {"width": 100, "height": 60}, "timings_ms": {"total": 1.0},
        "results": [{"text": "Invoice", "score": 0.9, "box": quad(5, 5, 80, 20)}]}
REGIONS = [{"type": "title", "box": quad(0, 0, 90, 25), "score": 0.9, "lines": [0]}]


def app():
    front = stand_in_front()
    seen = []

    async def read(upload, options, ctx=None):
        seen.append(options)
        return {**BODY, "regions": REGIONS} if options.structure else BODY

    front.pipeline = types.SimpleNamespace(ocr=Method(read))
    return TestClient(build_app(front)), front, seen


def test_sync_reads_ask_for_structure_and_markdown_implies_it():
    client, _, seen = app()
    plain = client.post("/v1/ocr", content=b"img", headers={"Content-Type": "image/png"})
    assert "regions" not in plain.json() and not seen[-1].structure
    asked = client.post("/v1/ocr", json={"image": {"base64": base64.b64encode(b"img").decode()},
                                         "options": {"structure": True}})
    assert asked.json()["regions"] == REGIONS and seen[-1].structure
    md = client.post("/v1/ocr?format=markdown", content=b"img", headers={"Content-Type": "image/png"})
    assert md.headers["content-type"] == "text/markdown; charset=utf-8" and md.text == "# Invoice\n"
    assert seen[-1].structure and seen[-1].format == "markdown"


def test_a_batch_reads_each_item_with_structure():
    client, _, seen = app()
    images = [{"base64": base64.b64encode(b).decode()} for b in (b"a", b"b")]
    r = client.post("/v1/ocr/batch", json={"images": images, "options": {"structure": True}})
    assert [i["regions"] for i in r.json()["items"]] == [REGIONS, REGIONS] and all(o.structure for o in seen)


def test_a_job_is_submitted_with_structure_and_the_handle_writes_markdown():
    client, front, seen = app()
    import cv2
    import numpy as np

    png = cv2.imencode(".png", np.full((20, 30, 3), 255, np.uint8))[1].tobytes()
    r = client.post("/v1/ocr/jobs?format=markdown", content=png, headers={"Content-Type": "image/png"})
    assert r.status_code == 202, r.text
    submitted = Fake.calls[-1][1]  # the options the job store is given
    assert submitted.structure is True and submitted.format == "markdown"
    assert asyncio.run(front.ocr(b"img", {"format": "markdown"})) == "# Invoice\n" and seen[-1].structure
    assert asyncio.run(front.ocr(b"img", {"structure": True}))["regions"] == REGIONS
