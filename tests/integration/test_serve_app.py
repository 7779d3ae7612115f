"""The Serve application with real Ray, real models and real HTTP."""

from __future__ import annotations

import base64
import json
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from peer import PEER
from serve_fixtures import apply_config, deploy_config, free_port, load_config, replica_stats, start_ray, stop_all

IMAGES = [
    "rapidocr_ch_en_num.jpg", "rapidocr_issue_170.png", "rapidocr_white_font_color_transparent.png",
    "rapidocr_two_dim_image_LA.png", "rapidocr_text_cls_v3.jpg", "rapidocr_empty_black.jpg",
    "rapidocr_test_letterbox_like.jpg", "rapidocr_short.png", "paddleocr_00006737.jpg",
    "paddleocr_00111002.jpg", "paddleocr_1.jpg", "mmocr_wildreceipt_2.jpeg", "mmocr_icdar15_img_8.jpg",
    "mmocr_word_1036169.jpg", "paddleocr_img_12.jpg", "rapidocr_img_exif_orientation.jpg",
]


@pytest.fixture(scope="module")
def service():
    """The app as deployments.yaml describes it (CPU default profile)."""
    start_ray()
    try:
        config = load_config()
        url = deploy_config(config, free_port())
        yield url, config
    finally:
        stop_all()


@pytest.fixture(scope="module")
def engine_reads():
    from serve_app.engine import OcrEngine

    with OcrEngine() as eng:
        return {n: [l.to_dict() for l in eng.read(PEER / n).lines] for n in IMAGES}


def post_file(url: str, name: str, **kw) -> requests.Response:
    with open(PEER / name, "rb") as f:
        return requests.post(f"{url}/v1/ocr", files={"file": (name, f)}, timeout=120, **kw)


def test_health_and_ready(service):
    url, _ = service
    assert requests.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
    r = requests.get(f"{url}/readyz", timeout=10)
    assert r.status_code == 200
    assert r.json() == {"ready": True, "stages": {"det": True, "rec": True, "cls": True}}
    assert requests.get(f"{url}/docs", timeout=10).status_code == 200


def test_http_reads_what_the_engine_reads_under_concurrency(service, engine_reads):
    """16 concurrent requests: every answer is the in-process engine's, text
    and boxes, and belongs to its own request."""
    url, _ = service
    with ThreadPoolExecutor(16) as pool:
        answers = dict(zip(IMAGES, pool.map(lambda n: post_file(url, n), IMAGES)))
    for name, r in answers.items():
        assert r.status_code == 200, (name, r.text)
        body = r.json()
        assert body["results"] == engine_reads[name], name
        assert set(body["timings_ms"]) == {"decode", "det", "cls", "rec", "total"}
        assert body["request_id"]
    assert answers["rapidocr_ch_en_num.jpg"].json()["results"][0]["text"] == "正品促销"
    assert answers["rapidocr_empty_black.jpg"].json()["results"] == []
    assert answers["rapidocr_ch_en_num.jpg"].json()["image"] == {"width": 323, "height": 430}


def test_recognizer_batches_crops_across_requests(service):
    from ray import serve

    url, _ = service
    rec = serve.get_deployment_handle("TextRecognizer", app_name="ocr")
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda n: post_file(url, n).status_code, IMAGES))
    assert codes == [200] * len(IMAGES)
    # Word crops read without detection reach the recognisers at once (the
    # pages above reach them one by one, as the detector finishes each; and
    # a page's two parts now go to distinct replicas).
    word = {"image": {"base64": base64.b64encode((PEER / "rapidocr_text_rec.jpg").read_bytes()).decode()},
            "options": {"det": False, "cls": False}}
    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(lambda _: [x["text"] for x in requests.post(f"{url}/v1/ocr", json=word, timeout=60)
                                         .json()["results"]], range(32)))
    assert texts == [["韩国小馆"]] * 32
    n = serve.status().applications["ocr"].deployments["TextRecognizer"].replica_states["RUNNING"]
    batches = [b for st in replica_stats(rec, n).values() for b in st["recent_batches"]]
    assert any(b["requests"] > 1 for b in batches), batches


def test_raw_body_and_json_base64_give_the_same_answer(service):
    url, _ = service
    data = (PEER / "rapidocr_issue_170.png").read_bytes()
    raw = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/png"}, timeout=60)
    octet = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "application/octet-stream"}, timeout=60)
    js = requests.post(f"{url}/v1/ocr", json={"image": {"base64": base64.b64encode(data).decode()}}, timeout=60)
    texts = [[x["text"] for x in r.json()["results"]] for r in (raw, octet, js)]
    assert texts == [["TEST"]] * 3


def test_request_id_is_honoured(service):
    url, _ = service
    r = post_file(url, "rapidocr_issue_170.png", headers={"X-Request-ID": "my-id-123"})
    assert r.json()["request_id"] == "my-id-123"
    assert r.headers["x-request-id"] == "my-id-123"


def test_options_rec_only_and_char_boxes(service):
    url, _ = service
    data = base64.b64encode((PEER / "rapidocr_text_rec.jpg").read_bytes()).decode()
    r = requests.post(f"{url}/v1/ocr", json={"image": {"base64": data}, "options": {"det": False, "cls": False}}, timeout=60)
    assert [x["text"] for x in r.json()["results"]] == ["韩国小馆"]
    data = base64.b64encode((PEER / "rapidocr_issue_170.png").read_bytes()).decode()
    r = requests.post(f"{url}/v1/ocr", json={"image": {"base64": data}, "options": {"return_chars": True}}, timeout=60)
    assert [c["text"] for c in r.json()["results"][0]["chars"]] == ["T", "E", "S", "T"]


def _png_header(w: int, h: int) -> bytes:
    def chunk(kind, payload):
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


BAD = [
    ("empty", b"", "image/png", 400, "bad_image"),
    ("random", os.urandom(2048), "application/octet-stream", 400, "bad_image"),
    ("truncated", (PEER / "rapidocr_ch_en_num.jpg").read_bytes()[:700], "image/jpeg", 400, "bad_image"),
    ("bomb", _png_header(60000, 60000), "image/png", 413, "too_large"),
    ("wrong type", b"hello", "text/plain", 415, "unsupported_media_type"),
]


@pytest.mark.parametrize("label,body,ctype,status,code", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_json_4xx_and_service_keeps_answering(service, label, body, ctype, status, code):
    url, _ = service
    r = requests.post(f"{url}/v1/ocr", data=body, headers={"Content-Type": ctype}, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["error"]["code"] == code and err["error"]["message"] and err["request_id"]
    ok = post_file(url, "rapidocr_issue_170.png")
    assert ok.status_code == 200 and ok.json()["results"][0]["text"] == "TEST"


@pytest.mark.parametrize("payload,needle", [
    ('{"image": {"base64": "!!notbase64!!"}}', "base64"),
    ('{"image": "abc"}', "image"),
    ('{"image": {"base64": ""}, "options": {"nope": 1}}', "nope"),
    ("[1, 2", "JSON"),
])
def test_malformed_json_gets_400(service, payload, needle):
    url, _ = service
    r = requests.post(f"{url}/v1/ocr", data=payload, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_body_over_limit_is_413_before_reading(service):
    url, _ = service
    r = requests.post(f"{url}/v1/ocr", data=b"\0" * (30 * 1024 * 1024), headers={"Content-Type": "image/png"}, timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "too_large"


def test_handle_api_returns_the_http_body(service):
    from ray import serve

    url, _ = service
    data = (PEER / "rapidocr_ch_en_num.jpg").read_bytes()
    handle = serve.get_app_handle("ocr")
    resp = handle.ocr.remote(data)
    result = resp.result(timeout_s=120)
    http = post_file(url, "rapidocr_ch_en_num.jpg").json()
    assert result["results"] == http["results"]
    assert result["image"] == {"width": 323, "height": 430}


def test_live_reconfigure_keeps_the_replica(service):
    """A new user_config, deployed as `serve deploy` would, reaches the
    running replicas: same processes, new batch size."""
    import copy
    import time

    from ray import serve

    url, config = service
    rec = serve.get_deployment_handle("TextRecognizer", app_name="ocr")
    n = serve.status().applications["ocr"].deployments["TextRecognizer"].replica_states["RUNNING"]

    before = replica_stats(rec, n)
    assert len(before) == n
    new = copy.deepcopy(config)
    new.pop("http_options", None)
    for d in new["applications"][0]["deployments"]:
        if d["name"] == "TextRecognizer":
            d["user_config"] = {"max_batch_size": 7, "batch_wait_timeout_s": 0.02}
    apply_config(new)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        after = replica_stats(rec, n)
        if all(st["max_batch_size"] == 7 for st in after.values()) and len(after) == n:
            break
        time.sleep(0.5)
    assert set(after) == set(before)
    assert {(st["max_batch_size"], st["batch_wait_timeout_s"]) for st in after.values()} == {(7, 0.02)}
    assert post_file(url, "rapidocr_issue_170.png").json()["results"][0]["text"] == "TEST"
