"""Document structure through the service a newcomer starts (the light
profile, `make serve`'s, shared with the front-stall tests: behind a token):
nothing loaded until a request asks; the first one loads the layout and
table models in the pipeline's process (a 503 with Retry-After while they
load, never a stall); a report page's title, paragraph and table come back
typed, through /v1/ocr, ?format=markdown and PaddleX's /layout-parsing; and
issue 58's hostile cases, each beside harness.stall's probes (/healthz p99
under 100 ms over the baseline, another client's one-word reads answered):
a page of 2,000 ruled boxes, a table of 1,500 cells, a page of 300 small
tables, a 1 x 10,000 strip, and a 300-page PDF as Markdown."""

from __future__ import annotations

import base64
import time

import pytest
import requests

from harness import stall, structure_pages
from harness.pdfs import blank_pdf
from harness.peer import PEER

SHARED_SERVICE = stall.FRONT
SMALL = (PEER / "mmocr_word_1036169.jpg").read_bytes()
HEALTHZ_P99_MS = 100.0
LOAD_S = 240.0  # the structure models' first load on this shared box, at most


@pytest.fixture(scope="module")
def front(shared_services):
    url = shared_services.get(SHARED_SERVICE, stall.front_config())[0]
    return stall.started(url, SMALL)


def post(front, body: bytes, options: str = '{"structure": true}', fmt: str = "", ctype="image/png",
         timeout: float = 300) -> requests.Response:
    return requests.post(f"{front.url}/v1/ocr{fmt}", files={"file": ("page", body, ctype)},
                         data={"options": options}, headers={**front.auth, "Cache-Control": "no-cache"},
                         timeout=timeout)


def loaded_read(front, body: bytes, **kw) -> requests.Response:
    """A structure read, retried while the models load (503 ModelLoading: its Retry-After)."""
    end = time.monotonic() + LOAD_S
    while True:
        r = post(front, body, **kw)
        if r.status_code != 503 or time.monotonic() > end:
            return r
        assert "structure" in r.json()["error"]["message"] and int(r.headers["retry-after"]) >= 1
        time.sleep(min(5, int(r.headers["retry-after"])))


def test_nothing_is_loaded_until_a_request_asks_and_a_plain_read_is_unchanged(front):
    ready = requests.get(f"{front.url}/readyz", timeout=30).json()
    if "layout" in ready["stages"]:
        pytest.skip("another module of this session asked for structure first")
    plain = post(front, SMALL, options="{}", ctype="image/jpeg")
    assert plain.status_code == 200 and "regions" not in plain.json()
    assert "structure" not in plain.json()["timings_ms"]
    assert "layout" not in requests.get(f"{front.url}/readyz", timeout=30).json()["stages"]


def test_a_report_page_comes_back_typed_through_every_door(front):
    page = structure_pages.report_page()
    r = loaded_read(front, page)
    assert r.status_code == 200, r.text
    body = r.json()
    types = [g["type"] for g in body["regions"]]
    assert "title" in types and "table" in types, types
    texts = [line["text"] for line in body["results"]]
    title = next(g for g in body["regions"] if g["type"] == "title")
    assert [texts[i] for i in title["lines"]] == ["Quarterly Report"]
    table = next(g for g in body["regions"] if g["type"] == "table")["table"]
    grid = {(c["row"], c["col"]): c["text"] for c in table["cells"]}
    assert grid[(0, 0)] == "Region" and grid[(1, 1)] == "120" and grid[(2, 2)] == "70", grid
    # /readyz answers from its last probe (ingress.ready_cache_s; a state up to READY_IDLE_S old when it was
    # not asked meanwhile): the next probes show both structure stages ready.
    end = time.monotonic() + 30
    while not ((ready := requests.get(f"{front.url}/readyz", timeout=30).json()["stages"]).get("layout")
               and ready.get("table")):
        assert time.monotonic() < end, ready
        time.sleep(0.5)

    md = post(front, page, options="{}", fmt="?format=markdown")
    assert md.status_code == 200 and md.headers["content-type"] == "text/markdown; charset=utf-8"
    assert md.text.startswith("# Quarterly Report\n") and "| Region | Sales | Costs |" in md.text

    px = requests.post(f"{front.url}/layout-parsing", json={"file": base64.b64encode(page).decode(), "fileType": 1},
                       headers=front.auth, timeout=300).json()
    (item,) = px["result"]["layoutParsingResults"]
    labels = [b["block_label"] for b in item["prunedResult"]["parsing_res_list"]]
    assert "paragraph_title" in labels and "table" in labels
    assert item["markdown"]["text"] == md.text.removesuffix("\n") or item["markdown"]["text"] == md.text


def checked_beside(front, baseline, work) -> tuple[requests.Response, stall.BesideReport]:
    with front.beside() as beside:
        got = work()
    report = beside.report
    print(f"\n  beside it: {report.line()}")
    assert report.healthz_codes and set(report.healthz_codes) == {200}
    assert report.healthz_p99_ms < HEALTHZ_P99_MS + baseline.healthz_p99_ms, report.line()
    assert report.normal and all(c == 200 for c, _ in report.normal), report.line()
    return got, report


@pytest.fixture(scope="module")
def baseline(front):
    loaded_read(front, structure_pages.report_page())  # the models loaded before anything is measured
    with front.beside() as alone:
        time.sleep(5)
    return alone.report


def test_a_page_of_2000_ruled_boxes(front, baseline):
    r, _ = checked_beside(front, baseline, lambda: post(front, structure_pages.ruled_boxes_page()))
    assert r.status_code == 200, r.text
    regions = r.json()["regions"]
    assert len(regions) <= 101 and sum(g["type"] == "table" for g in regions) <= 200


def test_a_table_of_1500_cells(front, baseline):
    r, _ = checked_beside(front, baseline, lambda: post(front, structure_pages.big_table_page()))
    assert r.status_code == 200, r.text
    for g in r.json()["regions"]:
        if g["type"] == "table" and g.get("table"):
            assert len(g["table"]["cells"]) <= 1000  # engine.structure.max_table_cells


def test_a_page_of_300_tables(front, baseline):
    r, _ = checked_beside(front, baseline, lambda: post(front, structure_pages.many_tables_page()))
    assert r.status_code == 200, r.text
    tables = [g for g in r.json()["regions"] if g["type"] == "table"]
    assert sum("table" in g for g in tables) <= 10  # engine.structure.max_tables recognised, the rest noted
    assert all("note" in g for g in tables if "table" not in g)


def test_a_1_by_10000_strip_with_structure(front, baseline):
    r, _ = checked_beside(front, baseline, lambda: post(front, structure_pages.strip()))
    assert r.status_code == 400 and "aspect" in r.json()["error"]["message"], r.text


def test_a_300_page_pdf_as_markdown_is_sent_to_the_jobs_api(front, baseline):
    pdf = blank_pdf(300)
    r, _ = checked_beside(front, baseline, lambda: post(front, pdf, options="{}", fmt="?format=markdown",
                                                         ctype="application/pdf", timeout=60))
    assert r.status_code in (413, 503) and "/v1/ocr/jobs" in r.json()["error"]["message"], r.text
