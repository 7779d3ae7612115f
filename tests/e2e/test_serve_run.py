"""The README's start command, `make serve`'s `serve run deployments.light.yaml`,
as a user runs it: a fresh local Ray, the real config file (only the port changed, so a
service already on 8000 is left alone), real HTTP. Started once for the
module: the README's first request, and OCRmyPDF making a searchable PDF
through it (serve_app.integrations.ocrmypdf_plugin)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest
import requests
import yaml

from harness.in_child import call_in_child
from harness.peer import PEER, engine_lines

REPO = Path(__file__).resolve().parents[2]

from harness.service import free_port  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`serve run` of deployments.light.yaml (what `make serve` runs) on a free port, ready; its URL."""
    tmp_path = tmp_path_factory.mktemp("serve_run")
    cfg = yaml.safe_load((REPO / "deployments.light.yaml").read_text())
    port = free_port()
    cfg["http_options"]["port"] = port
    config = tmp_path / "deployments.light.yaml"
    config.write_text(yaml.safe_dump(cfg))
    serve_bin = Path(sys.executable).parent / "serve"
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([str(serve_bin), "run", str(config)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if requests.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError("not ready in 300 s:\n" + (tmp_path / "serve.log").read_text()[-3000:])
        yield url
    finally:
        # `serve run` from a non-interactive shell ignores SIGINT; SIGTERM makes
        # it shut down the local Ray it started (and nothing else).
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_serve_run_of_the_make_serve_profile(served):
    url = served
    with open(PEER / "rapidocr_ch_en_num.jpg", "rb") as f:
        r = requests.post(f"{url}/v1/ocr", files={"file": f}, timeout=120)
    assert r.status_code == 200
    body = r.json()
    assert body["results"][0]["text"] == "正品促销"
    # The engine in a child: this process keeps ~1 GB of an engine after close.
    assert body["results"] == call_in_child(engine_lines, "rapidocr_ch_en_num.jpg")


def _squeeze(text: str) -> str:
    """Text compared modulo whitespace and Unicode compatibility forms (a
    PDF text layer gives back U+2103 as "°C")."""
    return "".join(unicodedata.normalize("NFKC", text).split())


def test_ocrmypdf_with_the_plugin_makes_a_pdf_searchable_with_what_the_service_reads(served, tmp_path):
    """OCRmyPDF (no Tesseract, no Ghostscript) on a 2-page PDF of peer
    images, its OCR engine the service: the output's text layer, read back
    with pypdfium2, is per page what the service reads on the very page
    images OCRmyPDF rasterised (kept with -k)."""
    import img2pdf
    import pypdfium2 as pdfium
    from PIL import Image

    pages = []
    for name in ("paddleocr_img_12.jpg", "paddleocr_1.jpg"):  # an English page, a Chinese one
        buf = io.BytesIO()
        Image.open(PEER / name).convert("RGB").save(buf, "PNG")
        pages.append(buf.getvalue())
    src, out = tmp_path / "in.pdf", tmp_path / "out.pdf"
    src.write_bytes(img2pdf.convert(pages, layout_fun=img2pdf.get_fixed_dpi_layout_fun((150, 150))))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "OCR_SERVER_URL": served, "TMPDIR": str(work)}
    ocrmypdf = Path(sys.executable).parent / "ocrmypdf"
    run = subprocess.run([str(ocrmypdf), "-k", "--plugin", "serve_app.integrations.ocrmypdf_plugin", str(src), str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    layer = [page.get_textpage().get_text_range() for page in pdfium.PdfDocument(str(out))]
    assert len(layer) == 2
    assert "We would like to thank all the designers and" in " ".join(layer[0].split())
    assert "土地整治与土壤修复研究中心" in _squeeze(layer[1])
    page_images = sorted(work.glob("ocrmypdf.io.*/*_ocr.png"))
    assert len(page_images) == 2, sorted(p.name for p in work.rglob("*"))
    for text, image in zip(layer, page_images):
        with open(image, "rb") as f:
            read = requests.post(f"{served}/v1/ocr?format=text", files={"file": f}, timeout=120)
        assert read.status_code == 200
        assert _squeeze(text) == _squeeze(read.text)
