"""PDF input (serve_app.documents) on PDFs made in the test, and the
pipeline's document reading over stand-in stages. No Ray, no models."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from pdfs import blank_pdf, encrypted_pdf, image_pdf, text_pdf
from serve_app.config import DocumentLimits, EngineConfig
from serve_app.documents import PdfFile, check_pdf, is_pdf, page_geometry
from serve_app.errors import BadRequest, DeadlineExceeded, TooLarge
from serve_app.options import OcrOptions
from serve_app.pipeline import Pipeline, Stages
from serve_app.results import Recognition


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
    """Stages that read a page's line as the page's mean grey level, after
    a random pause (pages finish out of order)."""

    def __init__(self):
        self.active = 0
        self.most = 0

    async def detect(self, work, params=None, ctx=None):
        self.active += 1
        self.most = max(self.most, self.active)
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
    stand = Stand()
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
