"""The PaddleX-compatible request/response mapping (serve_app.http.paddlex). No Ray."""

from __future__ import annotations

import base64
import json

import cv2
import numpy as np
import pytest

from harness.pdfs import blank_pdf
from serve_app.core.engine_config import EngineConfig
from serve_app.core.errors import BadRequest
from serve_app.core.request_options import FIELDS, OcrOptions
from serve_app.http.paddlex import (
    OPTION_FIELDS, PaddleXDefaults, PaddleXValidation, failure, images_of, parse_request, result, success, to_call,
)

PNG = cv2.imencode(".png", np.full((20, 30, 3), 255, np.uint8))[1].tobytes()
B64 = base64.b64encode(PNG).decode("ascii")


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_the_documented_client_request_maps_to_the_image_and_default_options():
    data, opts = to_call(parse_request(body(file=B64, fileType=1)))
    assert data == PNG and opts == OcrOptions()


def test_file_type_is_inferred_from_the_bytes_when_null_and_checked_when_given():
    pdf = base64.b64encode(blank_pdf(1)).decode()
    assert to_call(parse_request(body(file=pdf)))[0][:5] == b"%PDF-"
    assert to_call(parse_request(body(file=pdf, fileType=0)))[0][:5] == b"%PDF-"
    with pytest.raises(BadRequest, match="fileType is 0"):
        to_call(parse_request(body(file=B64, fileType=0)))
    with pytest.raises(BadRequest, match="fileType is 1"):
        to_call(parse_request(body(file=pdf, fileType=1)))


@pytest.mark.parametrize("payload, needle", [
    (body(fileType=1), "file"),
    (body(file=B64, fileType=2), "fileType"),
    (b"not json", "body"),
    (b"[" * 100, "nested"),
])
def test_a_request_that_does_not_validate_is_422(payload, needle):
    with pytest.raises(PaddleXValidation, match=needle) as e:
        parse_request(payload)
    assert e.value.status == 422


def test_urls_are_refused_not_fetched():
    with pytest.raises(BadRequest, match="fetches nothing") as e:
        to_call(parse_request(body(file="https://example.com/a.png", fileType=1)))
    assert e.value.status == 400
    with pytest.raises(BadRequest, match="not valid base64"):
        to_call(parse_request(body(file="@@@", fileType=1)))


def test_option_mapping_table():
    assert set(OPTION_FIELDS) == {
        "useDocOrientationClassify", "useDocUnwarping", "useTextlineOrientation", "textDetLimitSideLen",
        "textDetLimitType", "textDetThresh", "textDetBoxThresh", "textDetUnclipRatio", "textRecScoreThresh",
        "model"}  # model: this service's extension (a served model set)
    for name, field in OPTION_FIELDS.items():
        assert field is None or field in FIELDS, name  # a mapped name sets an existing OcrOptions field
    samples = {"textDetLimitSideLen": 960, "textDetLimitType": "max", "textDetThresh": 0.3,
               "textDetBoxThresh": 0.6, "textDetUnclipRatio": 1.5, "textRecScoreThresh": 0.5, "model": "ppocrv6_small"}
    for name, field in OPTION_FIELDS.items():
        value = samples.get(name, True)
        if field is None:  # refused, naming it
            with pytest.raises(BadRequest, match=name):
                to_call(parse_request(body(file=B64, fileType=1, **{name: value})))
        else:
            _, opts = to_call(parse_request(body(file=B64, fileType=1, **{name: value})))
            assert getattr(opts, field) == value


def test_switches_off_or_null_are_accepted_and_textline_orientation_sets_cls():
    _, opts = to_call(parse_request(body(file=B64, fileType=1, useDocOrientationClassify=False,
                                         useDocUnwarping=None, useTextlineOrientation=False)))
    assert opts == OcrOptions(cls=False)


DEFAULTS = PaddleXDefaults.of(EngineConfig())
LINES = [{"text": "TEST", "score": 0.999, "box": [[83.0, 166.0], [770.4, 164.0], [771.0, 409.6], [84.0, 411.0]]},
         {"text": "two", "score": 0.8, "box": [[1.0, 2.0], [9.0, 2.0], [9.0, 7.0], [1.0, 7.0]]}]


def test_image_result_shape():
    image_body = {"request_id": "r", "image": {"width": 800, "height": 566}, "results": LINES, "timings_ms": {}}
    out = result(image_body, OcrOptions(), DEFAULTS)
    assert out["dataInfo"] == {"width": 800, "height": 566, "type": "image"}
    assert len(out["ocrResults"]) == 1 and set(out["ocrResults"][0]) == {"prunedResult"}
    pr = out["ocrResults"][0]["prunedResult"]
    assert pr["rec_texts"] == ["TEST", "two"] and pr["rec_scores"] == [0.999, 0.8]
    assert pr["rec_polys"][0] == [[83, 166], [770, 164], [771, 410], [84, 411]]
    assert pr["rec_boxes"][0] == [83, 164, 771, 411] and pr["dt_polys"] == pr["rec_polys"]
    assert pr["page_index"] is None and pr["text_type"] == "general"
    assert pr["model_settings"] == {"use_doc_preprocessor": False, "use_textline_orientation": True}
    assert pr["text_det_params"]["thresh"] == 0.2 and pr["text_rec_score_thresh"] == 0.5
    assert result(image_body, OcrOptions(cls=False), DEFAULTS)["ocrResults"][0]["prunedResult"][
        "model_settings"]["use_textline_orientation"] is False


def test_document_result_shape_one_item_per_page():
    doc = {"document": {"type": "pdf", "pages": 2}, "pages": [
        {"page": 1, "width": 100, "height": 50, "source": "ocr", "results": LINES[:1]},
        {"page": 2, "width": 60, "height": 40, "source": "ocr", "results": []}]}
    images = [{"ocrImage": "a", "inputImage": "b"}, {"ocrImage": "c", "inputImage": "d"}]
    out = result(doc, OcrOptions(), DEFAULTS, images)
    assert out["dataInfo"] == {"numPages": 2, "pages": [{"width": 100, "height": 50}, {"width": 60, "height": 40}],
                               "type": "pdf"}
    assert [r["prunedResult"]["page_index"] for r in out["ocrResults"]] == [0, 1]
    assert [r["prunedResult"]["rec_texts"] for r in out["ocrResults"]] == [["TEST"], []]
    assert out["ocrResults"][1]["ocrImage"] == "c" and out["ocrResults"][1]["inputImage"] == "d"


def test_envelopes():
    assert success("id", {"x": 1}) == {"logId": "id", "result": {"x": 1}, "errorCode": 0, "errorMsg": "Success"}
    assert failure("id", 413, "too big") == {"logId": "id", "errorCode": 413, "errorMsg": "too big"}


def test_a_pages_images_are_the_pipelines_boxes_picture_and_its_input():
    page = {"results": [], "visualization": {"media_type": "image/jpeg", "width": 3, "height": 2, "base64": "pic",
                                             "input": {"media_type": "image/jpeg", "width": 3, "height": 2,
                                                       "base64": "in"}}}
    assert images_of(page) == {"ocrImage": "pic", "inputImage": "in"}
    assert images_of({"results": []}) == {}  # a page without a picture: PaddleX leaves the fields out