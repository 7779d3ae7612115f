"""PDF input (serve_app.flow.documents) on PDFs made in the test, and the
pipeline's document reading over stand-in stages. No Ray, no models."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from harness.pdfs import (
    blank_pdf, encrypted_pdf, image_pdf, lying_count_pdf, mediabox_pdf, nested_forms_pdf, shared_text_pdf, text_pdf,
)
from serve_app.core.engine_config import DocumentLimits, EngineConfig
from serve_app.flow.documents import PdfFile, check_pdf, is_pdf, page_geometry
import time

from serve_app.core.errors import BadRequest, DeadlineExceeded, PageOverBudget, TooLarge
from serve_app.flow.pdf_worker import WorkerPool
from serve_app.core.request_options import OcrOptions
from serve_app.flow.pipeline import Pipeline, Stages
from serve_app.core.results import Recognition


def page_image(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_pdfs_are_known_by_their_magic_bytes(tmp_path):
    pdf = blank_pdf(1)
    assert is_pdf(pdf) and is_pdf(memoryview(pdf)) and is_pdf(b"junk before the header %PDF-1.7 ...")
    assert not is_pdf(b"\x89PNG\r\n\x1a\n....") and not is_pdf(b"") and not is_pdf(np.zeros(3))
    path = tmp_path / "doc.bin"
    path.write_bytes(pdf)
    assert is_pdf(path) and is_pdf(str(path)) and not is_pdf(tmp_path / "missing.pdf")


def test_page_count_and_lossless_round_trip_at_the_render_dpi():
    pages = [page_image(430, 323, 1), page_image(528, 896, 2), page_image(1001, 21, 3)]
    data = image_pdf(pages, dpi=144)
    assert check_pdf(data, DocumentLimits()) == 3
    with PdfFile(data, DocumentLimits(render_dpi=144)) as pdf:
        assert pdf.pages == 3
        for k, img in enumerate(pages):
            out = pdf.render(k)
            assert out.dtype == np.uint8 and out.shape == img.shape
            assert np.array_equal(out, img)  # a page made at 144 DPI renders back to its own pixels


def test_dpi_and_the_pixel_limit_set_the_render_size():
    data = image_pdf([page_image(400, 600, 4)], dpi=144)
    with PdfFile(data, DocumentLimits(render_dpi=72)) as pdf:
        assert pdf.render(0).shape == (200, 300, 3)
    with PdfFile(data, DocumentLimits(render_dpi=144, max_page_pixels=60_000)) as pdf:
        h, w = pdf.render(0).shape[:2]
        assert h * w <= 60_000 and (h, w) == (200, 300)  # scaled down to fit, aspect kept, never refused


def test_page_geometry():
    a4 = page_geometry(595.276, 841.89, 200, 16_000_000)
    assert (a4.width, a4.height) == (1654, 2339)
    big = page_geometry(2384, 3370, 200, 16_000_000)  # A0
    assert big.width * big.height <= 16_000_000 and abs(big.width / big.height - 2384 / 3370) < 0.01
    assert page_geometry(154.80000305, 100, 200, 10**8).width == 430  # float32 noise is not a pixel
    with pytest.raises(BadRequest, match="no area"):
        page_geometry(0, 100, 200, 10**8)


def test_encrypted_pdf_is_a_400_naming_the_password():
    data = encrypted_pdf(user_password="secret")
    with pytest.raises(BadRequest, match="encrypted with a password") as e:
        PdfFile(data, DocumentLimits())
    assert e.value.status == 400
    import pypdfium2 as pdfium  # the fixture is really encrypted: it opens with its password

    doc = pdfium.PdfDocument(data, password="secret")
    assert doc[0].get_textpage().get_text_range() == "Secret text"
    doc.close()


@pytest.mark.parametrize("data", [b"%PDF-1.4 garbage", b"", blank_pdf(2)[:200], b"%PDF-1.7\n" + b"\0" * 5000])
def test_broken_pdf_is_a_400(data):
    with pytest.raises(BadRequest) as e:
        PdfFile(data, DocumentLimits())
    assert e.value.status == 400


def test_too_many_pages_is_a_413_before_any_page_is_read():
    with pytest.raises(TooLarge, match="6 pages, over the limit of 5") as e:
        check_pdf(blank_pdf(6), DocumentLimits(max_pages=5))
    assert e.value.status == 413
    assert check_pdf(blank_pdf(5), DocumentLimits(max_pages=5)) == 5


def test_text_layer_lines_with_boxes_in_rendered_pixels():
    data = text_pdf([["Hello PDF", "Second line"], []], size_pt=(300, 200), font_pt=20)
    with PdfFile(data, DocumentLimits(render_dpi=144)) as pdf:  # 2 px per point
        geo, lines = pdf.text_lines(0, return_chars=True)
        assert (geo.width, geo.height) == (600, 400)
        assert [line.text for line in lines] == ["Hello PDF", "Second line"]
        (x0, y0), _, (x1, y1), _ = lines[0].box
        # Baseline at 40 pt from the top, 20 pt Helvetica, x from 20 pt:
        assert 38 <= x0 <= 44 and 40 <= y0 <= 60 and 80 <= y1 <= 84 and x1 > x0 + 150
        assert lines[1].box[0][1] > lines[0].box[2][1]  # the second line is below the first
        assert "".join(c.text for c in lines[0].chars) == "HelloPDF" and lines[0].score == 1.0
        assert pdf.text_lines(1) is None  # no text layer: nothing to take, OCR it


# -- the pipeline over a document ---------------------------------------------------


class Stand:
    """Stages that read a page's line as the page's mean grey level. A page
    waits in detection until `width` pages are there (or every page of the
    `total` has come): explicit steps, not a race of sleeps, show the
    concurrency; then a random pause (pages finish out of order)."""

    def __init__(self, width: int = 1, total: int = 1):
        self.active = 0
        self.most = 0
        self.width, self.total, self.started = width, total, 0
        self.cond = None

    async def detect(self, work, params=None, ctx=None):
        self.cond = self.cond or asyncio.Condition()
        self.active += 1
        self.started += 1
        self.most = max(self.most, self.active)
        async with self.cond:
            self.cond.notify_all()
            await self.cond.wait_for(lambda: self.active >= self.width or self.started >= self.total)
        await asyncio.sleep(random.uniform(0, 0.02))
        self.active -= 1
        h, w = work.shape[:2]
        self.level = None
        return np.array([[[5, 5], [w - 5, 5], [w - 5, h - 5], [5, h - 5]]], dtype=np.float32)

    async def recognize(self, crops, ctx=None):
        return [Recognition(f"grey{int(round(float(c.mean())))}", 0.99) for c in crops]


def grey_pdf(levels: list[int]) -> bytes:
    return image_pdf([np.full((80, 200, 3), v, np.uint8) for v in levels])


def test_pages_are_read_concurrently_and_come_back_in_order():
    random.seed(1)
    levels = [10 * k for k in range(1, 12)]
    stand = Stand(3, len(levels))
    cfg = EngineConfig(documents=DocumentLimits(page_concurrency=3))
    seen = []
    doc = asyncio.run(Pipeline(Stages(stand.detect, None, stand.recognize), cfg).read_document(
        grey_pdf(levels), OcrOptions(), progress=lambda d, n: seen.append((d, n))))
    assert [p.page for p in doc.pages] == list(range(1, 12))
    assert [p.lines[0].text for p in doc.pages] == [f"grey{v}" for v in levels]
    assert stand.most == 3  # bounded by page_concurrency
    assert seen[0] == (0, 11) and seen[-1] == (11, 11) and len(seen) == 12
    body = doc.to_dict()
    assert body["document"] == {"type": "pdf", "pages": 11}
    first = body["pages"][0]
    assert (first["page"], first["width"], first["height"], first["source"]) == (1, 200, 80, "ocr")
    assert {"render", "det", "rec", "total"} <= set(first["timings_ms"]) and "total" in body["timings_ms"]


def test_text_layer_only_when_asked_and_marked_per_page():
    stand = Stand()
    pipe = Pipeline(Stages(stand.detect, None, stand.recognize), EngineConfig())
    data = text_pdf([["Hello PDF"], []])
    asked = asyncio.run(pipe.read_any(data, OcrOptions(pdf_text_layer=True)))
    assert [p.source for p in asked.pages] == ["text_layer", "ocr"]
    assert [line.text for line in asked.pages[0].lines] == ["Hello PDF"]
    unasked = asyncio.run(pipe.read_any(data, OcrOptions()))
    assert [p.source for p in unasked.pages] == ["ocr", "ocr"]
    assert unasked.pages[0].lines[0].text.startswith("grey")  # read by the (stand-in) OCR, not the text layer


def test_a_passed_deadline_reads_no_page():
    stand = Stand()
    pipe = Pipeline(Stages(stand.detect, None, stand.recognize), EngineConfig())
    with pytest.raises(DeadlineExceeded):
        asyncio.run(pipe.read_document(grey_pdf([10, 20]), OcrOptions(), 1.0))
    assert stand.most == 0


def test_document_limits_apply_in_the_pipeline():
    stand = Stand()
    cfg = EngineConfig(documents=DocumentLimits(max_pages=2))
    with pytest.raises(TooLarge):
        asyncio.run(Pipeline(Stages(stand.detect, None, stand.recognize), cfg).read_any(blank_pdf(3)))


# -- hostile PDFs (issue 24): each bounded, each a 4xx naming what it hit -------------


def test_a_page_that_renders_for_minutes_is_stopped_at_its_budget_naming_it():
    data = nested_forms_pdf(depth=6)  # 10**6 nested fills: minutes of PDFium time, ~3.4 KB
    pool = WorkerPool(1)
    try:
        with PdfFile(data, DocumentLimits(page_timeout_s=0.5), pool=pool) as pdf:
            with pytest.raises(PageOverBudget, match="page 1 took over 0.5 s") as e:
                pdf.render(0)
            assert e.value.status == 413 and pool.killed == 1
        # the pool serves the next document with a fresh child
        with PdfFile(blank_pdf(1), DocumentLimits(), pool=pool) as pdf:
            assert pdf.render(0).shape == (200, 400, 3)
    finally:
        pool.close()


def test_the_request_deadline_bounds_a_page_below_its_budget():
    pool = WorkerPool(1)
    try:
        with PdfFile(nested_forms_pdf(depth=6), DocumentLimits(page_timeout_s=60), pool=pool,
                     deadline=time.time() + 60) as pdf:
            # the deadline set once the PDF is open: its child's start (seconds beside a busy
            # core) is not what this bounds, the page's render is
            pdf.deadline = time.time() + 1.0
            with pytest.raises(DeadlineExceeded, match="page 1"):
                pdf.render(0)
    finally:
        pool.close()


def test_a_slow_page_is_an_error_on_that_page_and_the_others_are_read():
    mixed = nested_forms_pdf(depth=6, pages=3, slow={1})  # page 2 renders for minutes, pages 1 and 3 are blank
    slow = nested_forms_pdf(depth=6)
    stand = Stand()
    cfg = EngineConfig(documents=DocumentLimits(page_timeout_s=0.5))
    doc = asyncio.run(Pipeline(Stages(stand.detect, None, stand.recognize), cfg).read_document(mixed))
    body = doc.to_dict()
    assert [p.get("error", {}).get("code") for p in body["pages"]] == [None, "page_over_budget", None]
    assert "page 2" in body["pages"][1]["error"]["message"]
    assert [p["results"][0]["text"] for p in body["pages"] if "error" not in p] == ["grey255", "grey255"]
    # a document of only such pages is the error itself
    with pytest.raises(PageOverBudget, match="page 1"):
        asyncio.run(Pipeline(Stages(stand.detect, None, stand.recognize), cfg).read_document(slow))


def test_a_shared_long_content_stream_is_bounded_in_characters():
    data = shared_text_pdf(pages=100, chars=200_000)  # ~17 KB; 20 million characters if taken whole
    assert len(data) < 20_000
    stand = Stand()
    pipe = Pipeline(Stages(stand.detect, None, stand.recognize), EngineConfig())
    with pytest.raises(TooLarge, match="page 1's text layer has 2\\d{5} characters, over the limit of 100000"):
        asyncio.run(pipe.read_document(data, OcrOptions(pdf_text_layer=True)))
    # under the page cap, the document's cap stops it
    small = shared_text_pdf(pages=30, chars=90_000)
    # a pool of its own (3 workers): the first document's pages still in flight when page 1
    # refused it finish in the shared pool's children (each within its page budget), and
    # beside a busy core this document's pages waited past theirs for a free child (503)
    cfg = EngineConfig(documents=DocumentLimits(max_document_chars=1_000_000, workers=3))
    with pytest.raises(TooLarge, match="passed 1000000 characters at page"):
        asyncio.run(Pipeline(Stages(stand.detect, None, stand.recognize), cfg).read_document(
            small, OcrOptions(pdf_text_layer=True)))


@pytest.mark.parametrize("box", [(0, 0, 1e9, 0.1), (0, 0, 5e5, 3), (0, 0, 3, 1e7)])
def test_an_extreme_mediabox_is_a_400_naming_the_page(box):
    data = mediabox_pdf(box)
    assert len(data) < 500
    with PdfFile(data, DocumentLimits()) as pdf:
        with pytest.raises(BadRequest, match="page 1 is .* times as long as it is wide"):
            pdf.render(0)


def test_a_huge_mediabox_renders_within_the_pixel_bound_counted_in_whole_pixels():
    with PdfFile(mediabox_pdf((0, 0, 1e6, 1e6)), DocumentLimits(max_page_pixels=1_000_000)) as pdf:
        geo = pdf.geometry(0)
        assert geo.width * geo.height <= 1_000_000 and geo.width == geo.height == 1000
    # after rounding up: 0.3 pt at 2 px/pt is 0.6 px, one whole pixel
    geo = page_geometry(99.7, 0.3, 144, 200, 1e9)
    assert geo.width * geo.height <= 200
    for w, h in [(1000.3, 1000.3), (4321.7, 1234.5), (1.4, 999.9)]:
        g = page_geometry(w, h, 144, 100_000, 1e9)
        assert g.width * g.height <= 100_000


def test_a_page_count_that_lies_is_a_400_naming_the_page():
    data = lying_count_pdf(400)
    stand = Stand()
    with pytest.raises(BadRequest, match=r"page \d+ cannot be loaded"):  # pages are read concurrently
        asyncio.run(Pipeline(Stages(stand.detect, None, stand.recognize), EngineConfig()).read_document(data))


def test_a_render_over_the_memory_bound_is_refused_in_the_child():
    pool = WorkerPool(1, memory_mb=256)
    try:
        limits = DocumentLimits(render_dpi=144, max_page_pixels=144_000_000)
        with PdfFile(mediabox_pdf((0, 0, 6000, 6000)), limits, max_pixels=144_000_000, pool=pool) as pdf:
            with pytest.raises(PageOverBudget, match="memory"):
                pdf.render(0)  # 12000 x 12000 x 3 bytes: 432 MB, over the child's 256 MB
    finally:
        pool.close()


def test_a_worker_dies_with_its_parent_even_mid_render():
    """A replica killed while its PDF child draws a page for minutes leaves
    no orphan behind (the child has PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, threading
        from harness.pdfs import nested_forms_pdf
        from serve_app.core.engine_config import DocumentLimits
        from serve_app.flow.documents import PdfFile
        pdf = PdfFile(nested_forms_pdf(depth=7), DocumentLimits(page_timeout_s=600))
        child = pdf.pool.idle[0].proc.pid
        threading.Thread(target=pdf.render, args=(0,), daemon=True).start()
        print(child, flush=True)
        threading.Event().wait()
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=root,
                              stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(200):  # explicit steps: poll until the kernel has delivered the signal (at most 10 s)
        try:
            os.kill(child, 0)
            with open(f"/proc/{child}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    break  # a zombie: dead, waiting for init to reap it
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the PDF child outlived its parent")


def test_a_worker_started_from_a_short_lived_thread_outlives_that_thread():
    import threading

    pool = WorkerPool(1)
    try:
        opened = []
        t = threading.Thread(target=lambda: opened.append(PdfFile(blank_pdf(1), DocumentLimits(), pool=pool)))
        t.start()
        t.join()  # the thread that asked for the child has ended
        assert opened[0].render(0).shape == (200, 400, 3) and pool.started == 1
    finally:
        pool.close()


def test_a_pdf_child_that_does_not_start_in_time_is_a_503_to_retry_not_the_documents_fault(monkeypatch):
    from serve_app.core.errors import Overloaded
    from serve_app.flow import pdf_worker

    monkeypatch.setattr(pdf_worker, "CHILD_START_S", 0.0)  # no child can say "ready" in no time
    pool = WorkerPool(1)
    try:
        with pytest.raises(Overloaded, match="retry"):
            PdfFile(blank_pdf(1), DocumentLimits(), pool=pool)
        assert pool.started == 0  # nothing left checked out
        monkeypatch.setattr(pdf_worker, "CHILD_START_S", 30.0)
        with PdfFile(blank_pdf(1), DocumentLimits(), pool=pool) as pdf:  # the pool still serves
            assert pdf.pages == 1
    finally:
        pool.close()


# -- documents share the children (issue 38, item 4) ----------------------------------------


def test_a_document_of_slow_pages_is_abandoned_after_a_few_and_the_rest_are_not_read(monkeypatch):
    """500 pages that each burn the page budget held both children for up
    to 600 s; now the document ends after max_pages_over_budget of them."""
    import serve_app.flow.documents as documents

    bomb = nested_forms_pdf(depth=6, pages=40)
    stand = Stand()
    pool = WorkerPool(2)
    monkeypatch.setattr(documents, "shared_pool", lambda *a: pool)
    cfg = EngineConfig(documents=DocumentLimits(page_timeout_s=0.3, max_pages_over_budget=3, page_concurrency=2))
    try:
        with pytest.raises(PageOverBudget, match="abandoned after 3 pages over their budget") as e:
            asyncio.run(Pipeline(Stages(stand.detect, None, stand.recognize), cfg).read_document(bomb))
        assert e.value.status == 413 and "max_pages_over_budget" in e.value.message
        assert 3 <= pool.killed <= 4  # the pages in flight when it was given up, not 40
    finally:
        pool.close()


def test_one_document_holds_at_most_its_share_of_children_while_another_waits():
    """Two children, a document of slow pages reading two pages at once
    (each stopped at its 0.5 s budget): another document's page gets the
    next child that frees, not after the bomb's twelve pages (before, each
    freed child could go back to the bomb's next page, and the other's
    wait run out: a 503)."""
    import threading

    pool = WorkerPool(2)
    slow = nested_forms_pdf(depth=6, pages=6)
    limits = DocumentLimits(page_timeout_s=0.5)  # worker_share 0: half of 2 = 1
    patient = DocumentLimits(page_timeout_s=30)  # the other's wait for a child: far past a bomb page's 0.5 s
    try:
        with PdfFile(slow, limits, pool=pool) as bomb, PdfFile(blank_pdf(1), patient, pool=pool) as other:
            done = [0]  # bomb pages finished (each over its budget)
            both = threading.Barrier(3)

            def bomb_pages():
                both.wait()
                from serve_app.core.errors import Overloaded

                for k in range(6):
                    with pytest.raises((PageOverBudget, Overloaded)):  # its share taken: a wait that ran out
                        bomb.render(k)
                    done[0] += 1

            threads = [threading.Thread(target=bomb_pages) for _ in range(2)]
            for t in threads:
                t.start()
            both.wait()
            while pool.in_use.get(bomb.key, 0) < 2:  # both children drawing the bomb (an explicit step)
                time.sleep(0.005)
            got_child_at = []
            hold = pool._hold

            def noting(key):  # when the other document is given its child: the bomb pages done by then
                if key == other.key:
                    got_child_at.append(done[0])
                hold(key)

            pool._hold = noting
            shape = other.render(0).shape
            pages_before = got_child_at[0]
            for t in threads:
                t.join(120)
        assert shape == (200, 400, 3)
        assert pages_before <= 2  # the page that freed its child (at most one per thread), not all 12
        assert done[0] == 12  # every bomb page ended: over its budget, or refused while over its share
    finally:
        pool.close()


def test_the_pool_gives_a_document_over_its_share_a_child_only_while_nobody_else_waits():
    pool = WorkerPool(2)
    try:
        with pool.cond:
            pool.in_use = {"a": 1}
            assert pool._may_take("a", 1) is True  # nobody waits: a free child is used
            pool.waiting, pool.shares = {"b": 1}, {"b": 1}
            assert pool._may_take("a", 1) is False  # b is within its share: it goes first
            assert pool._may_take("a", 2) is True  # a within a share of 2
            pool.in_use = {"a": 1, "b": 1}
            assert pool._may_take("a", 1) is True  # b over its own share does not block a
            pool.in_use, pool.waiting, pool.shares = {}, {}, {}
    finally:
        pool.close()


# -- a child under a low hard RLIMIT_AS says so (issue 38, item 7) -----------------------------

_UNDER_A_LIMIT = """
import resource, sys
from harness.pdfs import blank_pdf
from serve_app.core.engine_config import DocumentLimits
from serve_app.flow.documents import PdfFile
from serve_app.flow.pdf_worker import WorkerPool

data = blank_pdf(2)
pool = WorkerPool(1)
pool._spawner.submit(lambda: None).result()  # this process's own threads before its limit
limit = int(sys.argv[1]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # hard too: the child inherits it
try:
    with PdfFile(data, DocumentLimits(), pool=pool) as pdf:
        print("pages", pdf.pages)
except Exception as e:
    print("error", getattr(e, "status", None), e)
"""


@pytest.mark.parametrize("limit_mb", [60, 1000])
def test_a_pdf_child_under_a_low_hard_address_space_limit_starts_within_it_or_says_why(limit_mb):
    """The child set its limit to its start-up plus worker_memory_mb (3 GB)
    over the service's hard one: it crashed, and every PDF got 503 `busy,
    retry shortly` forever. Now it keeps within the hard limit; where even
    its start-up does not fit, a 500 names RLIMIT_AS."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", _UNDER_A_LIMIT, str(limit_mb)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": root}, timeout=120).stdout.strip().splitlines()[-1]
    if limit_mb == 60:
        assert out.startswith("error 500 the document worker cannot start") and "RLIMIT_AS" in out
        assert "60 MB" in out
    else:
        assert out == "pages 2"


def test_pictures_are_drawn_for_a_documents_first_pages_only():
    """`visualize` on a 500-page document asked for ~1.8 GB of base64
    pictures (PaddleX's ocrImage and inputImage per page); now only the
    first documents.max_picture_pages pages have one."""
    stand = Stand()
    cfg = EngineConfig(documents=DocumentLimits(max_picture_pages=2))
    doc = asyncio.run(Pipeline(Stages(stand.detect, None, stand.recognize), cfg).read_document(
        blank_pdf(5), OcrOptions(visualize="boxes")))
    body = doc.to_dict()
    assert ["visualization" in p for p in body["pages"]] == [True, True, False, False, False]
    assert [p["results"][0]["text"] for p in body["pages"]] == ["grey255"] * 5  # every page still read


def test_a_document_whose_page_ran_past_its_budget_keeps_to_its_share_and_its_close_stops_its_calls():
    """A PDF of slow pages read two pages at a time, alone: before, its
    pages took both children (both cores, on a 2-core box) from the first
    page to the last; once a page of it has run past its budget it holds
    at most its share (one of two), whoever waits, the other child kept
    for everyone else. Closing it (the document given up) stops its call
    waiting for a child at once, not after that wait."""
    import threading

    from serve_app.core.errors import Overloaded

    pool = WorkerPool(2)
    slow = nested_forms_pdf(depth=6, pages=6)
    held_after_a_kill: list[int] = []
    hold = pool._hold

    def noting(key):  # children the document holds, each time it is given one after a page was stopped
        hold(key)
        if pool.killed:
            held_after_a_kill.append(pool.in_use[key])

    pool._hold = noting
    try:
        with PdfFile(slow, DocumentLimits(page_timeout_s=0.4), pool=pool) as bomb:
            def pages(ks):
                for k in ks:
                    with pytest.raises((PageOverBudget, Overloaded)):
                        bomb.render(k)

            threads = [threading.Thread(target=pages, args=(ks,)) for ks in ((0, 2, 4), (1, 3, 5))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert pool.killed >= 2 and held_after_a_kill and max(held_after_a_kill) == 1, held_after_a_kill
            assert bomb.key in pool.strict
            # a call of it waiting for a child while both are busy: closing it ends that wait
            with pool.cond:
                pool.in_use, taken = {"x": 2}, pool.started
                pool.started = pool.workers
            waiting = threading.Thread(target=pages, args=((0,),))
            waiting.start()
            while bomb.key not in pool.waiting:  # an explicit step: the call waits for a child
                time.sleep(0.005)
            t0 = time.monotonic()
            bomb.close()
            waiting.join(30)
            assert not waiting.is_alive() and time.monotonic() - t0 < 0.8  # not its 0.8 s wait for a child
            assert bomb.key not in pool.strict and bomb.key not in pool.closed_keys
            with pool.cond:
                pool.in_use, pool.started = {}, taken
    finally:
        pool.close()
