"""The Serve application with real Ray, real models and real HTTP."""

from __future__ import annotations

import base64
import json
import os
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from harness.peer import PEER
from harness.service import REPO, apply_config, load_config, replica_stats

IMAGES = [
    "rapidocr_ch_en_num.jpg", "rapidocr_issue_170.png", "rapidocr_white_font_color_transparent.png",
    "rapidocr_two_dim_image_LA.png", "rapidocr_text_cls_v3.jpg", "rapidocr_empty_black.jpg",
    "rapidocr_test_letterbox_like.jpg", "rapidocr_short.png", "paddleocr_00006737.jpg",
    "paddleocr_00111002.jpg", "paddleocr_1.jpg", "mmocr_wildreceipt_2.jpeg", "mmocr_icdar15_img_8.jpg",
    "mmocr_word_1036169.jpg", "paddleocr_img_12.jpg", "rapidocr_img_exif_orientation.jpg",
]


# deployments.yaml as it is: the service this module shares with test_documents_service (tests/conftest.py).
SHARED_SERVICE = "deployments.yaml"


@pytest.fixture(scope="module")
def service(shared_services):
    """The app as deployments.yaml describes it (CPU default profile)."""
    return shared_services.get(SHARED_SERVICE, load_config())


# (image, per-request options) read by the engine too: the service must
# answer each what the in-process engine answers with the same options.
OPTION_CASES = [
    ("rapidocr_ch_en_num.jpg", {"box_thresh": 0.8}),
    ("rapidocr_ch_en_num.jpg", {"thresh": 0.4, "unclip_ratio": 2.0, "limit_side_len": 640, "drop_score": 0.9}),
    ("paddleocr_img_12.jpg", {"return_words": True}),
]


def case_key(name: str, opts: dict) -> str:
    return name + json.dumps(opts, sort_keys=True)


@pytest.fixture(scope="module")
def engine_reads(engine):  # the session's engine: each engine made in this process keeps ~1 GB
    reads = {n: [l.to_dict() for l in engine.read(PEER / n).lines] for n in IMAGES}
    for name, opts in OPTION_CASES:
        reads[case_key(name, opts)] = [l.to_dict() for l in engine.read(PEER / name, **opts).lines]
    return reads


def post_file(url: str, name: str, **kw) -> requests.Response:
    with open(PEER / name, "rb") as f:
        return requests.post(f"{url}/v1/ocr", files={"file": (name, f)}, timeout=120, **kw)


def test_health_and_ready(service):
    url, _ = service
    assert requests.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
    r = requests.get(f"{url}/readyz", timeout=10)
    assert r.status_code == 200
    # The test service serves its profile's default set (harness.service.load_config);
    # test_light_profile checks the readiness of every set of the shipped profile.
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
        # "orientation": the page voted turned and was read once more upright (serve_app.ocr.orientation)
        assert {"decode", "det", "cls", "rec", "total"} <= set(body["timings_ms"]) <= \
            {"decode", "det", "cls", "rec", "total", "orientation"}
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


def test_phone_formats_heic_and_avif_read_what_the_jpeg_reads(service):
    """iPhones save HEIC, Android phones and browsers AVIF. The same photo
    in each reads within 3% of the JPEG's characters; a HEIC stored turned
    with its rotation in the file (a phone held sideways) comes back upright,
    at its upright size, without a second pass. Junk sent as image/heic is a
    400 naming the formats."""
    import io

    from PIL import Image

    from harness.peer import label_errors

    url, _ = service
    name = "paddleocr_00056221.jpg"  # 670x510: turned, its size would show it
    photo = Image.open(PEER / name).convert("RGB")

    def read(data: bytes, ctype: str) -> dict:
        r = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": ctype, "Cache-Control": "no-cache"},
                          timeout=120)
        assert r.status_code == 200, (ctype, r.text)
        return r.json()

    def encoded(img: Image.Image, fmt: str, **kw) -> bytes:
        buf = io.BytesIO()
        img.save(buf, fmt, quality=90, **kw)
        return buf.getvalue()

    want = [x["text"] for x in read((PEER / name).read_bytes(), "image/jpeg")["results"]]
    exif = Image.Exif()
    exif[0x0112] = 6  # to view, turn 90 degrees clockwise: the pixels are stored turned the other way
    sideways = encoded(photo.rotate(90, expand=True), "HEIF", exif=exif.tobytes())
    for label, data, ctype in (("heic", encoded(photo, "HEIF"), "image/heic"),
                               ("avif", encoded(photo, "AVIF"), "image/avif"),
                               ("heic turned", sideways, "image/heic")):
        body = read(data, ctype)
        got = [x["text"] for x in body["results"]]
        errors, chars = label_errors(got, want)
        assert chars > 150 and errors <= 0.03 * chars, (label, errors, chars, got)
        assert (body["image"]["width"], body["image"]["height"]) == photo.size, (label, body["image"])
        assert body.get("orientation", 0) == 0 and "orientation" not in body["timings_ms"], label
    junk = requests.post(f"{url}/v1/ocr", data=b"\x00\x00\x00\x18ftypheic" + b"\x00" * 200,
                         headers={"Content-Type": "image/heic"}, timeout=60)
    assert junk.status_code == 400 and "HEIC" in junk.json()["error"]["message"], junk.text


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


def test_visualize_returns_a_bounded_jpeg_of_the_same_reading(service):
    import io

    from PIL import Image

    url, _ = service
    with open(PEER / "mmocr_wildreceipt_1.jpeg", "rb") as f:
        plain = post_file(url, "mmocr_wildreceipt_1.jpeg").json()
        r = requests.post(f"{url}/v1/ocr", files={"file": f}, data={"options": json.dumps({"visualize": True})},
                          timeout=120)
    body = r.json()
    assert r.status_code == 200 and body["results"] == plain["results"]
    vis = body["visualization"]
    img = Image.open(io.BytesIO(base64.b64decode(vis["base64"])))
    assert vis["media_type"] == "image/jpeg" and img.format == "JPEG"
    assert img.size == (vis["width"], vis["height"]) == (1600, 600)  # a 1600x1200 image, two wide, within 1600
    assert "visualization" not in plain


def test_stats_report_each_stage_its_replicas_batches_and_the_recent_requests(service):
    from ray import serve

    url, _ = service

    def answered():
        return sum(b["requests"] for b in requests.get(f"{url}/v1/stats", timeout=30).json()["history"]["buckets"])

    before = answered()
    assert post_file(url, "rapidocr_ch_en_num.jpg").status_code == 200
    assert post_file(url, "rapidocr_issue_170.png").status_code == 200
    time.sleep(1.1)  # past the 1 s the gathered figures are reused
    stats = requests.get(f"{url}/v1/stats", timeout=30).json()
    running = {name: d.replica_states.get("RUNNING", 0)
               for name, d in serve.status().applications["ocr"].deployments.items()}
    assert {n: d["running"] for n, d in stats["deployments"].items()} == running
    assert set(stats["stages"]) == {"det", "cls", "rec"}
    for s in stats["stages"].values():
        assert 1 <= s["replicas_answered"] <= running[s["deployment"]]
        assert s["recent"]["batches"] >= 1 and s["recent"]["max_items"] >= 1  # this test's request, at least
    assert stats["stages"]["rec"]["max_batch_size"] == 24
    buckets = stats["history"]["buckets"]
    assert len(buckets) == 120 and sum(b["requests"] for b in buckets) == before + 2
    assert buckets[-1]["t"] <= stats["time"] < buckets[-1]["t"] + 5
    assert any(b["p50_ms"] and set(b["steps_ms"]) >= {"det", "rec"} for b in buckets[-2:])


def test_the_web_page_reads_an_image_links_boxes_and_lines_and_shows_the_live_view(service, tmp_path):
    """In a real browser: upload a peer image, see the API's lines in the
    API's order, hover linked both ways, then the live view's replica counts.
    Screenshots go to tmp; with UPDATE_SCREENSHOTS=1 to docs/ (the README's)."""
    from ray import serve

    from browser import chromium_page

    url, _ = service
    shots = REPO / "docs" if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path
    name = "paddleocr_11.jpg"
    api = post_file(url, name).json()["results"]
    assert len(api) >= 10
    with chromium_page() as page:
        page.goto(f"{url}/")
        page.set_input_files("#file", str(PEER / name))
        page.wait_for_selector("#lines li[data-i]")
        assert page.locator("#lines li[data-i] .text").all_text_contents() == [r["text"] for r in api]
        assert page.locator("#lines li[data-i] .score").all_text_contents() == [f"{r['score']:.3f}" for r in api]
        assert page.locator("svg .box").count() == len(api)
        # Hover a box: its line lights up; hover a line: its box does.
        page.hover("svg .box >> nth=4")
        assert page.locator("#lines li.active").get_attribute("data-i") == "4"
        assert page.locator("svg .box.active").get_attribute("data-i") == "4"
        page.hover("#lines li[data-i='1']")
        assert page.locator("svg .box.active").get_attribute("data-i") == "1"
        assert page.locator("#lines li.active").count() == 1
        timings = page.text_content("#timings")
        assert all(step in timings for step in ("det", "cls", "rec"))
        page.hover("svg .box >> nth=4")
        page.screenshot(path=str(shots / "ui.png"))

        # An iPhone's HEIC (most browsers cannot show one): the same lines as
        # the API answers for it, over the service's drawing of the photo.
        import io

        from PIL import Image

        heic = tmp_path / "photo.heic"
        buf = io.BytesIO()
        Image.open(PEER / name).convert("RGB").save(buf, "HEIF", quality=90)
        heic.write_bytes(buf.getvalue())
        want = [r["text"] for r in requests.post(f"{url}/v1/ocr", data=heic.read_bytes(),
                                                 headers={"Content-Type": "image/heic"}, timeout=120).json()["results"]]
        page.set_input_files("#file", str(heic))
        page.wait_for_function("document.querySelector('#picked').textContent.startsWith('photo.heic')")
        page.wait_for_selector(".frame .blank")
        page.wait_for_function(f"document.querySelectorAll('#lines li[data-i]').length === {len(want)}")
        assert page.locator("#lines li[data-i] .text").all_text_contents() == want
        assert page.locator(".frame img").count() == 0  # no broken picture of the file itself
        assert page.locator(".frame .blank").get_attribute("style").count("data:image/jpeg;base64,") == 1

        page.click("#tab-live")
        page.wait_for_selector(".dep[data-deployment='TextRecognizer'] .replicas")
        page.wait_for_selector("#summary .tile")
        deps = ("TextDetector", "DirectionClassifier", "TextRecognizer", "OcrPipeline", "OcrIngress")
        for _ in range(10):  # the page polls every 2 s; an autoscaled replica may start in between
            running = {n: str(d.replica_states.get("RUNNING", 0))
                       for n, d in serve.status().applications["ocr"].deployments.items()}
            shown = {d: page.text_content(f".dep[data-deployment='{d}'] .replicas .count") for d in deps}
            if shown == {d: running[d] for d in deps}:
                break
            page.wait_for_timeout(1000)
        assert shown == {d: running[d] for d in deps}
        assert "batches (last 60 s)" in page.text_content(".dep[data-deployment='TextRecognizer']")
        page.screenshot(path=str(shots / "ui-live.png"))
        assert page.errors == []


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
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            after = replica_stats(rec, n)
            if all(st["max_batch_size"] == 7 for st in after.values()) and len(after) == n:
                break
            time.sleep(0.5)
        assert set(after) == set(before)
        assert {(st["max_batch_size"], st["batch_wait_timeout_s"]) for st in after.values()} == {(7, 0.02)}
        assert post_file(url, "rapidocr_issue_170.png").json()["results"][0]["text"] == "TEST"
    finally:
        apply_config(config)  # the shared service's config again, for the tests after this one


def post_with_options(url: str, name: str, options: dict, query: str = "") -> requests.Response:
    data = base64.b64encode((PEER / name).read_bytes()).decode()
    return requests.post(f"{url}/v1/ocr{query}", json={"image": {"base64": data}, "options": options}, timeout=120)


def test_detection_options_change_what_is_read_as_in_the_engine_and_are_bounded(service, engine_reads):
    """A high box_thresh reads fewer lines than the default; every option
    case answers what the in-process engine answers with the same options;
    out of bounds is a 400 naming the option and its range."""
    url, _ = service
    default = post_file(url, "rapidocr_ch_en_num.jpg").json()["results"]
    strict = post_with_options(url, "rapidocr_ch_en_num.jpg", {"box_thresh": 0.8}).json()["results"]
    assert 0 < len(strict) < len(default) == 18
    for name, opts in OPTION_CASES:
        r = post_with_options(url, name, opts)
        assert r.status_code == 200, r.text
        assert r.json()["results"] == engine_reads[case_key(name, opts)], (name, opts)
    for opts, needle in [({"box_thresh": 1.5}, "box_thresh must be in (0, 1)"),
                         ({"limit_side_len": 10}, "limit_side_len must be in [32, 4096]"),
                         ({"unclip_ratio": 9}, "unclip_ratio must be in [0.5, 5]"),
                         ({"drop_score": -1}, "drop_score must be in [0, 1]")]:
        r = post_with_options(url, "rapidocr_issue_170.png", opts)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", r.text
        assert needle in r.json()["error"]["message"]


def test_concurrent_requests_with_other_thresholds_each_get_their_own_answer(service):
    """Interleaved requests with box_thresh 0.8 and the default: each answer
    is what that request gets alone (thresholds are applied per image, and
    the recogniser batches crops of both)."""
    url, _ = service
    alone = {t: post_with_options(url, "paddleocr_00006737.jpg", {"box_thresh": t}).json()["results"]
             for t in (0.5, 0.8)}
    assert len(alone[0.8]) < len(alone[0.5])
    order = [0.8, 0.5] * 4
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda t: post_with_options(url, "paddleocr_00006737.jpg", {"box_thresh": t}), order))
    for t, r in zip(order, got):
        assert r.status_code == 200 and r.json()["results"] == alone[t], t


def test_formats_over_http_are_read_by_hocr_and_alto_readers(service, engine_reads, tmp_path):
    from lxml import etree

    from harness.xml_checks import ALTO, alto_schema, hocr_page, hocr_words

    url, _ = service
    name = "paddleocr_img_12.jpg"
    lines = engine_reads[case_key(name, {"return_words": True})]
    assert [w["text"] for w in lines[1]["words"]] == lines[1]["text"].split() == [
        "We", "would", "like", "to", "thank", "all", "the", "designers", "and"]
    text = post_with_options(url, name, {"format": "text"})
    assert text.headers["content-type"] == "text/plain; charset=utf-8"
    # the lines in reading order, a blank line between blocks (issue #25)
    assert [t for t in text.text.split("\n") if t] == [ln["text"] for ln in lines] and text.text.endswith("\n")
    blocks = post_with_options(url, name, {}).json()["blocks"]
    assert len(text.text.strip("\n").split("\n\n")) == len(blocks)
    hocr = post_with_options(url, name, {}, "?format=hocr")
    assert hocr.headers["content-type"].startswith("application/xhtml+xml")
    words = hocr_words(hocr_page(hocr.text, tmp_path))
    assert [w.text for w in words] == [w["text"] for ln in lines for w in ln["words"]]
    assert all(0 < w.confidence <= 1 for w in words)
    alto = post_with_options(url, name, {"format": "alto"})
    tree = etree.fromstring(alto.content)
    assert alto_schema().validate(tree), alto_schema().error_log
    assert [s.get("CONTENT") for s in tree.iter(f"{ALTO}String")] == [w.text for w in words]
    bad = post_with_options(url, name, {}, "?format=docx")
    assert bad.status_code == 400 and "format is one of json, text, hocr, alto, markdown" in bad.json()["error"]["message"]


def test_handle_and_job_give_a_format(service):
    import time

    from ray import serve

    url, _ = service
    data = (PEER / "rapidocr_issue_170.png").read_bytes()
    assert serve.get_app_handle("ocr").ocr.remote(data, {"format": "text"}).result(timeout_s=120) == "TEST\n"
    job = requests.post(f"{url}/v1/ocr/jobs?format=hocr", data=data, headers={"Content-Type": "image/png"},
                        timeout=60).json()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = requests.get(f"{url}/v1/ocr/jobs/{job['job_id']}", timeout=30).json()
        if status["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.2)
    assert status["status"] == "succeeded" and status["results"][0]["words"][0]["text"] == "TEST"
    r = requests.get(f"{url}/v1/ocr/jobs/{job['job_id']}?format=text", timeout=30)
    assert r.text == "TEST\n"


# --- the README's examples, run as a newcomer runs them (tests/unit/test_readme.py checks the rest)


def test_readme_examples_curl_answers_200_with_the_text_shown(service):
    """Each `$ curl` of the README, as written but sent to this service's
    port: 200 and the lines the README shows under it."""
    import subprocess

    from harness.readme_blocks import URL, commands, texts

    url, _ = service
    curls = [c for c in commands() if c.line.startswith("curl ")]
    assert curls
    for c in curls:
        line = c.line.replace(URL, url) + " -w '\\n%{http_code}'"
        done = subprocess.run(["bash", "-c", line], cwd=REPO, capture_output=True, text=True, timeout=120)
        body, _, status = done.stdout.rpartition("\n")
        assert (done.returncode, status) == (0, "200"), (c.line, done.stdout[-500:], done.stderr[-500:])
        assert [r["text"] for r in json.loads(body)["results"]] == texts(c.shown), c.line


def test_readme_examples_handle_reads_what_the_readme_curl_shows(service, monkeypatch, capsys):
    """The README's handle example, run in this driver (already connected to
    the cluster, so its `ray.init(address="auto")` is the one line not run)."""
    import ray

    from harness.readme_blocks import blocks, commands, texts

    handle_code = next(b.text for b in blocks() if b.lang == "python" and "get_app_handle" in b.text)
    monkeypatch.setattr(ray, "init", lambda *a, **kw: None)
    monkeypatch.chdir(REPO)
    exec(compile(handle_code, "README.md", "exec"), {})
    shown = next(c.shown for c in commands() if c.line.startswith("curl "))
    assert capsys.readouterr().out.strip() == repr(texts(shown))


def test_readme_examples_cli_prints_what_the_readme_shows():
    """The README's `python -m serve_app ...`, in a process of its own (no
    Ray): one line per image, each the image's lines or its error, as shown."""
    import subprocess
    import sys

    from harness.readme_blocks import commands, error_codes, texts

    clis = [c for c in commands() if " -m serve_app " in c.line]
    assert clis
    for c in clis:
        argv = [sys.executable] + c.line.split()[1:]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        got, want = done.stdout.splitlines(), c.shown.splitlines()
        assert len(got) == len(want), (done.stdout, done.stderr[-1000:])
        for g, w in zip(got, want):
            answer = json.loads(g)
            assert f'"image": "{answer["image"]}"' in w
            assert [r["text"] for r in answer.get("results", [])] == texts(w)
            assert ([answer["error"]["code"]] if "error" in answer else []) == error_codes(w)
