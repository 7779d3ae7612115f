"""PDFs, batches and the PaddleX route on the real service (real Ray, real
models, real HTTP), deployed from deployments.yaml once for this module and
test_serve_app (SHARED_SERVICE).
PDFs are made here from peer images, each stored losslessly at the render
DPI, so a page renders back to the image's exact pixels: a page must then
read exactly what /v1/ocr reads on that image."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import requests

from harness.pdfs import blank_pdf, encrypted_pdf, image_pdf, text_pdf
from harness.peer import PEER
from harness.service import load_config
from serve_app.core.app_args import AppArgs

PAGES = ["rapidocr_ch_en_num.jpg", "paddleocr_00006737.jpg", "rapidocr_issue_170.png"]


# deployments.yaml as it is: the service this module shares with test_serve_app (tests/conftest.py).
SHARED_SERVICE = "deployments.yaml"


@pytest.fixture(scope="module")
def service(shared_services):
    return shared_services.get(SHARED_SERVICE, load_config())


@pytest.fixture(scope="module")
def page_images() -> list[np.ndarray]:
    return [cv2.imread(str(PEER / n), cv2.IMREAD_COLOR) for n in PAGES]


@pytest.fixture(scope="module")
def pdf3(service, page_images) -> bytes:
    dpi = AppArgs.model_validate(service[1]["applications"][0]["args"]).engine.documents.render_dpi
    return image_pdf(page_images, dpi=dpi)


def png(img: np.ndarray) -> bytes:
    return cv2.imencode(".png", img)[1].tobytes()


@pytest.fixture(scope="module")
def image_reads(service, page_images) -> list[dict]:
    """What /v1/ocr answers for each page's image (sent as PNG: the same pixels)."""
    url, _ = service
    out = []
    for img in page_images:
        r = requests.post(f"{url}/v1/ocr", data=png(img), headers={"Content-Type": "image/png"}, timeout=120)
        assert r.status_code == 200, r.text
        out.append(r.json())
    return out


def texts(results: list[dict]) -> list[str]:
    return [line["text"] for line in results]


def test_pdf_pages_come_back_in_order_reading_what_each_image_reads(service, pdf3, image_reads):
    url, _ = service
    r = requests.post(f"{url}/v1/ocr", data=pdf3, headers={"Content-Type": "application/pdf"}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["document"] == {"type": "pdf", "pages": 3} and "request_id" in body
    assert [p["page"] for p in body["pages"]] == [1, 2, 3]
    for page, image in zip(body["pages"], image_reads):
        assert (page["width"], page["height"]) == (image["image"]["width"], image["image"]["height"])
        assert page["source"] == "ocr"
        assert texts(page["results"]) == texts(image["results"]) and page["results"]
    assert "total" in body["timings_ms"]


def test_bad_pdfs_are_refused(service):
    url, _ = service
    r = requests.post(f"{url}/v1/ocr", data=encrypted_pdf(), headers={"Content-Type": "application/pdf"}, timeout=60)
    assert r.status_code == 400 and "encrypted" in r.json()["error"]["message"]
    r = requests.post(f"{url}/v1/ocr", data=blank_pdf(501), headers={"Content-Type": "application/pdf"}, timeout=60)
    assert r.status_code == 413 and "501 pages, over the limit of 500" in r.json()["error"]["message"]
    r = requests.post(f"{url}/v1/ocr", data=b"%PDF-1.4 broken", headers={"Content-Type": "application/pdf"},
                      timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"


def test_text_layer_only_where_asked(service):
    url, _ = service
    data = base64.b64encode(text_pdf([["Hello PDF 2024"]], size_pt=(400, 120), font_pt=24)).decode()
    asked = requests.post(f"{url}/v1/ocr", json={"image": {"base64": data}, "options": {"pdf_text_layer": True}},
                          timeout=60).json()
    assert asked["pages"][0]["source"] == "text_layer" and texts(asked["pages"][0]["results"]) == ["Hello PDF 2024"]
    ocr = requests.post(f"{url}/v1/ocr", json={"image": {"base64": data}}, timeout=60).json()
    assert ocr["pages"][0]["source"] == "ocr" and texts(ocr["pages"][0]["results"]) == ["Hello PDF 2024"]


def test_batch_with_one_junk_item(service, page_images, image_reads, pdf3):
    url, _ = service
    files = [("file", ("a.png", png(page_images[0]), "image/png")), ("file", ("junk.png", b"not an image", "image/png")),
             ("file", ("c.png", png(page_images[2]), "image/png")), ("file", ("doc.pdf", pdf3, "application/pdf"))]
    r = requests.post(f"{url}/v1/ocr/batch", files=files, timeout=120)
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert [i["index"] for i in items] == [0, 1, 2, 3]
    assert items[1]["error"]["code"] == "bad_image" and "results" not in items[1]
    assert texts(items[0]["results"]) == texts(image_reads[0]["results"])
    assert texts(items[2]["results"]) == texts(image_reads[2]["results"])
    assert [texts(p["results"]) for p in items[3]["pages"]] == [texts(i["results"]) for i in image_reads]


def test_paddlex_documented_example_request(service, page_images, image_reads):
    """The client code in PaddleX's OCR serving docs, unchanged but for the URL."""
    url, _ = service
    API_URL = f"{url}/ocr"
    file_bytes = png(page_images[2])
    file_data = base64.b64encode(file_bytes).decode("ascii")
    payload = {"file": file_data, "fileType": 1}
    response = requests.post(API_URL, json=payload, timeout=120)
    assert response.status_code == 200
    body = response.json()
    assert body["errorCode"] == 0 and body["errorMsg"] == "Success"
    result = body["result"]
    (res,) = result["ocrResults"]
    assert res["prunedResult"]["rec_texts"] == texts(image_reads[2]["results"])
    assert len(res["prunedResult"]["rec_polys"]) == len(image_reads[2]["results"])
    ocr_img = cv2.imdecode(np.frombuffer(base64.b64decode(res["ocrImage"]), np.uint8), cv2.IMREAD_COLOR)
    assert ocr_img.shape == page_images[2].shape  # under PaddleX's 2000 px cap: full size
    assert result["dataInfo"] == {"width": page_images[2].shape[1], "height": page_images[2].shape[0],
                                  "type": "image"}
    r = requests.post(API_URL, json={"file": "https://example.com/a.pdf", "fileType": 0}, timeout=30)
    assert r.status_code == 400 and r.json()["errorCode"] == 400 and "fetches nothing" in r.json()["errorMsg"]


def test_pdf_job_reports_pages_and_ends_with_all_of_them(service, pdf3, image_reads):
    url, _ = service
    r = requests.post(f"{url}/v1/ocr/jobs", data=pdf3, headers={"Content-Type": "application/pdf"}, timeout=60)
    assert r.status_code == 202, r.text
    job_url = f"{url}{r.headers['location']}"
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        view = requests.get(job_url, timeout=30).json()
        seen.append(view)
        if view["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.02)
    assert view["status"] == "succeeded", view
    assert (view["pages_done"], view["pages_total"]) == (3, 3)
    assert [texts(p["results"]) for p in view["pages"]] == [texts(i["results"]) for i in image_reads]
    running = [v for v in seen if v["status"] == "running"]
    assert running and all(v.get("pages_total") in (None, 3) for v in running)
    assert any(v.get("pages_total") == 3 for v in running)  # progress shown while it ran


def test_handle_and_client_take_pdf_bytes(service, pdf3, image_reads):
    from ray import serve

    from serve_app.client import OcrClient

    result = serve.get_app_handle("ocr").ocr.remote(pdf3).result(timeout_s=120)
    assert [texts(p["results"]) for p in result["pages"]] == [texts(i["results"]) for i in image_reads]
    item = next(OcrClient().map([pdf3]))
    assert item.error is None and item.result["document"] == {"type": "pdf", "pages": 3}


def test_engine_and_cli_read_the_pdf_as_the_service_does(engine, pdf3, image_reads, tmp_path, capsys):
    """The in-process engine (the session's, shared with other modules) and
    the CLI's output for a PDF."""
    import json

    from serve_app.__main__ import main

    doc = engine.read_document(pdf3)
    assert [[line.text for line in p.lines] for p in doc.pages] == [texts(i["results"]) for i in image_reads]
    path = tmp_path / "three.pdf"
    path.write_bytes(pdf3)
    assert main([str(path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["image"] == str(path) and out["document"] == {"type": "pdf", "pages": 3}
    assert [texts(p["results"]) for p in out["pages"]] == [texts(i["results"]) for i in image_reads]


def test_the_web_page_reads_a_pdf_page_by_page(service, pdf3, tmp_path):
    """In a real browser: drop a 3-page PDF on the page; it shows three
    pages, each over the service's picture of it, and the lines the API
    reads for the PDF, in order, under a heading per page."""
    from browser import chromium_page

    url, _ = service
    r = requests.post(f"{url}/v1/ocr", data=pdf3, headers={"Content-Type": "application/pdf"}, timeout=120)
    api = r.json()["pages"]
    path = tmp_path / "three.pdf"
    path.write_bytes(pdf3)
    with chromium_page() as page:
        page.goto(f"{url}/")
        page.set_input_files("#file", str(path))
        page.wait_for_selector("#lines li[data-i]")
        assert page.locator("figure.page").count() == 3
        captions = page.locator("figure.page figcaption").all_text_contents()
        assert [c.split(" · ")[0] for c in captions] == ["Page 1", "Page 2", "Page 3"]
        shown = page.locator("#lines li[data-i] .text").all_text_contents()
        assert shown == [line["text"] for p in api for line in p["results"]]
        assert page.locator("#lines li.pagehead").all_text_contents() == [
            f"Page {p['page']}" for p in api if p["results"]]
        assert page.locator("svg .box").count() == len(shown)
        # Each page is drawn over the service's picture of it (visualize), not a blank.
        styles = [page.locator("figure.page .frame .blank").nth(k).get_attribute("style") for k in range(3)]
        assert all("data:image/jpeg;base64," in (s or "") for s in styles)
        if os.environ.get("UPDATE_SCREENSHOTS") == "1":
            page.screenshot(path=str(Path(__file__).resolve().parents[2] / "docs" / "ui-pdf.png"), full_page=True)
        assert page.errors == []


# -- multi-page TIFF: a document like a PDF (#25 item 1) ----------------------------


def tiff_of(images: list[np.ndarray], **save) -> bytes:
    import io

    from PIL import Image

    pil = [Image.fromarray(np.ascontiguousarray(img[..., ::-1])) for img in images]
    buf = io.BytesIO()
    pil[0].save(buf, format="TIFF", save_all=True, append_images=pil[1:], **save)
    return buf.getvalue()


@pytest.fixture(scope="module")
def tiff3(page_images) -> bytes:
    return tiff_of(page_images, compression="tiff_lzw")


def test_tiff_pages_come_back_in_order_on_every_door(service, tiff3, image_reads):
    """Sync (raw body and multipart), a batch item, the handle and the
    client: pages[] in page order, each reading what its image reads."""
    from ray import serve

    from serve_app.client import OcrClient

    url, _ = service
    want = [texts(i["results"]) for i in image_reads]
    r = requests.post(f"{url}/v1/ocr", data=tiff3, headers={"Content-Type": "image/tiff"}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["document"] == {"type": "tiff", "pages": 3}
    assert [p["page"] for p in body["pages"]] == [1, 2, 3]
    assert [texts(p["results"]) for p in body["pages"]] == want
    r = requests.post(f"{url}/v1/ocr/batch", files=[("file", ("fax.tif", tiff3, "image/tiff"))], timeout=120)
    assert [texts(p["results"]) for p in r.json()["items"][0]["pages"]] == want
    result = serve.get_app_handle("ocr").ocr.remote(tiff3).result(timeout_s=120)
    assert [texts(p["results"]) for p in result["pages"]] == want
    item = next(OcrClient().map([tiff3]))
    assert item.error is None and item.result["document"] == {"type": "tiff", "pages": 3}
    text = requests.post(f"{url}/v1/ocr?format=text", data=tiff3, headers={"Content-Type": "image/tiff"},
                         timeout=120).text
    assert text.count("\f") == 2  # three pages, form feeds between them


def test_tiff_job_reports_pages_done(service, tiff3, image_reads):
    url, _ = service
    r = requests.post(f"{url}/v1/ocr/jobs", data=tiff3, headers={"Content-Type": "image/tiff"}, timeout=60)
    assert r.status_code == 202, r.text
    job_url = f"{url}{r.headers['location']}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        view = requests.get(job_url, timeout=30).json()
        if view["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.05)
    assert view["status"] == "succeeded", view
    assert (view["pages_done"], view["pages_total"]) == (3, 3)
    assert [texts(p["results"]) for p in view["pages"]] == [texts(i["results"]) for i in image_reads]


def test_hostile_tiffs_are_refused_at_the_door_before_any_page_is_decoded(service):
    """The most pages and pixels for the fewest bytes: 501 blank 1-bit G4
    pages (a few kB), and two pages of 20000x20000 (400 MP each, ~50 kB)."""
    import io

    from PIL import Image

    url, _ = service
    blank = Image.new("1", (64, 64), 1)
    buf = io.BytesIO()
    blank.save(buf, format="TIFF", compression="group4", save_all=True, append_images=[blank] * 500)
    many = buf.getvalue()
    assert len(many) < 200_000
    for door in ("/v1/ocr", "/v1/ocr/jobs"):
        r = requests.post(f"{url}{door}", data=many, headers={"Content-Type": "image/tiff"}, timeout=60)
        assert r.status_code == 413, r.text
        assert "more than 500 pages" in r.json()["error"]["message"]
    big = Image.new("1", (20000, 20000), 1)
    buf = io.BytesIO()
    big.save(buf, format="TIFF", compression="group4", save_all=True, append_images=[big])
    r = requests.post(f"{url}/v1/ocr", data=buf.getvalue(), headers={"Content-Type": "image/tiff"}, timeout=60)
    assert r.status_code == 413 and "20000x20000" in r.json()["error"]["message"], r.text


def test_engine_and_cli_read_a_tiff_as_a_document(engine, tiff3, image_reads, tmp_path, capsys):
    import json

    from serve_app.__main__ import main

    doc = engine.read_document(tiff3)
    assert doc.kind == "tiff"
    assert [[line.text for line in p.lines] for p in doc.pages] == [texts(i["results"]) for i in image_reads]
    path = tmp_path / "three.tif"
    path.write_bytes(tiff3)
    assert main([str(path)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["document"] == {"type": "tiff", "pages": 3}
    assert [texts(p["results"]) for p in out["pages"]] == [texts(i["results"]) for i in image_reads]


def test_an_animated_gif_reads_its_first_frame_and_says_so(service, page_images, image_reads):
    import io

    from PIL import Image

    url, _ = service
    small = [cv2.resize(img, (320, 240)) for img in page_images[:2]]
    frames = [Image.fromarray(np.ascontiguousarray(i[..., ::-1])) for i in small]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=200)
    r = requests.post(f"{url}/v1/ocr", data=buf.getvalue(), headers={"Content-Type": "image/gif"}, timeout=60)
    assert r.status_code == 200, r.text
    image = r.json()["image"]
    assert image["frames"] == 2 and "only its first frame was read" in image["note"]
    assert "document" not in r.json()
