"""PaddleX's PP-StructureV3 route, POST /layout-parsing (serve_app.http.paddlex
to_layout_call, layout_result; serve_app/http/routes/paddlex.py): its
request mapped to this service's options, its answer's shape, and the route
on a stand-in pipeline. No Ray, no models."""

from __future__ import annotations

import base64
import json
import types

import cv2
import numpy as np
import pytest
from fastapi.testclient import TestClient

from harness.front import Method, stand_in_front
from harness.pdfs import blank_pdf
from serve_app.core.errors import BadRequest
from serve_app.core.request_options import FIELDS
from serve_app.http.app import build_app
from serve_app.http.paddlex import (
    LAYOUT_LABELS, LAYOUT_OPTION_FIELDS, PaddleXDefaults, PaddleXLayoutRequest, join_lines, layout_result,
    parse_request, to_layout_call,
)
from serve_app.core.results import REGION_TYPES

PNG = cv2.imencode(".png", np.full((20, 30, 3), 255, np.uint8))[1].tobytes()
B64 = base64.b64encode(PNG).decode("ascii")
DEFAULTS = PaddleXDefaults({"limit_side_len": 960}, 0.5, True)


def layout_request(**fields):
    return parse_request(json.dumps(fields).encode(), PaddleXLayoutRequest)


def quad(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def line(text, x0, y0, x1, y1):
    return {"text": text, "score": 0.9, "box": quad(x0, y0, x1, y1)}


TABLE = {"html": "<table><tr><td>a</td><td>b</td></tr></table>",
         "cells": [{"row": 0, "col": 0, "rowspan": 1, "colspan": 1, "box": quad(10, 60, 50, 80), "text": "a"},
                   {"row": 0, "col": 1, "rowspan": 1, "colspan": 1, "box": quad(50, 60, 90, 80), "text": "b"}]}
BODY = {"request_id": "r", "image": {"width": 200, "height": 120}, "timings_ms": {},
        "results": [line("Annual", 10, 5, 80, 20), line("Report", 85, 5, 150, 20), line("Sales rose", 10, 30, 100, 45),
                    line("again.", 10, 46, 60, 58), line("a", 10, 60, 50, 80), line("b", 50, 60, 90, 80),
                    line("p. 1", 10, 100, 40, 115)],
        "regions": [{"type": "title", "box": quad(5, 2, 160, 22), "score": 0.91, "lines": [0, 1]},
                    {"type": "text", "box": quad(5, 28, 160, 59), "score": 0.8, "lines": [2, 3]},
                    {"type": "table", "box": quad(5, 59, 95, 82), "score": 0.7, "lines": [4, 5], "table": TABLE},
                    {"type": "footer", "box": quad(5, 98, 45, 117), "score": 0.6, "lines": [6]}]}


def test_the_request_reads_with_structure_and_refuses_what_has_no_model_here():
    data, opts = to_layout_call(layout_request(file=B64, fileType=1, textDetThresh=0.4))
    assert data == PNG and opts.structure and opts.thresh == 0.4
    for name, value in (("useSealRecognition", True), ("useFormulaRecognition", True), ("useChartRecognition", True),
                        ("useRegionDetection", True), ("layoutThreshold", 0.3), ("layoutNms", True),
                        ("useDocUnwarping", True)):
        with pytest.raises(BadRequest, match=name):
            to_layout_call(layout_request(file=B64, fileType=1, **{name: value}))
    with pytest.raises(BadRequest, match="useTableRecognition=false"):
        to_layout_call(layout_request(file=B64, fileType=1, useTableRecognition=False))
    for ok in ({"useTableRecognition": True}, {"useSealRecognition": False}, {"useChartRecognition": None}):
        assert to_layout_call(layout_request(file=B64, fileType=1, **ok))[1].structure
    for name, field in LAYOUT_OPTION_FIELDS.items():
        assert field is None or field in FIELDS, name


def test_the_answer_has_pp_structurev3s_shape():
    from serve_app.core.request_options import OcrOptions

    got = layout_result(BODY, OcrOptions(structure=True), DEFAULTS)
    assert got["dataInfo"] == {"width": 200, "height": 120, "type": "image"}
    (item,) = got["layoutParsingResults"]
    assert set(item) == {"prunedResult", "markdown"}  # no pictures unless asked: None fields left out
    pruned = item["prunedResult"]
    blocks = pruned["parsing_res_list"]
    assert [b["block_label"] for b in blocks] == ["paragraph_title", "text", "table", "footer"]
    assert [b["block_content"] for b in blocks] == ["Annual Report", "Sales rose again.", TABLE["html"], "p. 1"]
    assert blocks[0]["block_bbox"] == [5, 2, 160, 22] and [b["block_order"] for b in blocks] == [1, 2, 3, None]
    assert [b["label"] for b in pruned["layout_det_res"]["boxes"]] == ["paragraph_title", "text", "table", "footer"]
    assert pruned["layout_det_res"]["boxes"][2]["cls_id"] == REGION_TYPES.index("table")
    assert pruned["table_res_list"] == [{"pred_html": TABLE["html"], "cell_box_list": [[10, 60, 50, 80], [50, 60, 90, 80]]}]
    assert pruned["overall_ocr_res"]["rec_texts"][:2] == ["Annual", "Report"]
    assert item["markdown"]["text"].startswith("# Annual Report\n\nSales rose\nagain.\n\n| a | b |")
    assert item["markdown"]["images"] == {} and item["markdown"]["isStart"] and item["markdown"]["isEnd"]
    assert set(LAYOUT_LABELS) == set(REGION_TYPES)


def test_a_document_is_one_item_per_page_with_its_index():
    from serve_app.core.request_options import OcrOptions

    page = {k: BODY[k] for k in ("results", "regions")}
    doc = {"document": {"type": "pdf", "pages": 2}, "timings_ms": {},
           "pages": [{"page": 1, "width": 200, "height": 120, **page}, {"page": 2, "width": 50, "height": 40,
                                                                        "results": [], "regions": []}]}
    got = layout_result(doc, OcrOptions(structure=True), DEFAULTS)
    assert [i["prunedResult"]["page_index"] for i in got["layoutParsingResults"]] == [0, 1]
    assert got["layoutParsingResults"][1]["prunedResult"]["parsing_res_list"] == []
    assert got["dataInfo"]["numPages"] == 2 and got["dataInfo"]["type"] == "pdf"


def test_lines_join_as_pp_structurev3_writes_a_block():
    assert join_lines(["Sales rose", "again."]) == "Sales rose again."
    assert join_lines(["docu-", "ment"]) == "document"
    assert join_lines(["正品", "促销"]) == "正品促销"


def test_the_route_asks_for_structure_and_answers_in_paddlex_shape():
    front = stand_in_front()
    seen = []

    async def read(upload, options, ctx=None):
        seen.append(options)
        return BODY

    front.pipeline = types.SimpleNamespace(ocr=Method(read))
    client = TestClient(build_app(front))
    r = client.post("/layout-parsing", json={"file": B64, "fileType": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["errorCode"] == 0 and body["logId"]
    assert body["result"]["layoutParsingResults"][0]["prunedResult"]["parsing_res_list"][0]["block_content"] == \
        "Annual Report"
    assert seen[0].structure and not seen[0].visualize
    bad = client.post("/layout-parsing", json={"file": B64, "fileType": 1, "useSealRecognition": True})
    assert bad.status_code == 400 and set(bad.json()) == {"logId", "errorCode", "errorMsg"}
    assert "useSealRecognition" in bad.json()["errorMsg"]
    pdf = base64.b64encode(blank_pdf(1)).decode()
    assert client.post("/layout-parsing", json={"file": pdf, "fileType": 1}).json()["errorCode"] == 400
    assert client.post("/layout-parsing", json={"fileType": 1}).status_code == 422
