"""The OCRmyPDF plugin (serve_app.integrations.ocrmypdf_plugin) as OCRmyPDF loads it:
its engine replaces Tesseract, its options resolve, and a service that is
not there stops OCRmyPDF before any page with a message saying what to do.
The whole path against a running service is tests/e2e/test_serve_run.py.
No Ray, no models."""

from __future__ import annotations

import socket
import types

import pytest


def test_ocrmypdf_loads_the_plugin_with_its_engine_in_place_of_tesseract():
    from ocrmypdf.api import setup_plugin_infrastructure

    pm = setup_plugin_infrastructure(plugins=["serve_app.integrations.ocrmypdf_plugin"])
    names = {pm.pluggy_manager.get_name(p) for p in pm.pluggy_manager.get_plugins()}
    assert "ocrmypdf.builtin_plugins.tesseract_ocr" not in names  # blocked: no tesseract program needed
    engine = pm.get_ocr_engine(options=None)
    assert str(engine) == "PP-OCR OCR service (serve_app)"
    assert {"eng", "chi_sim", "deu", "fra", "pol"} <= engine.languages(None)
    with pytest.raises(NotImplementedError, match="pdf-renderer"):
        engine.generate_pdf(None, None, None, None)


def test_server_url_from_option_environment_or_default(monkeypatch):
    from serve_app.integrations.ocrmypdf_plugin import DEFAULT_URL, OcrServerOptions

    monkeypatch.delenv("OCR_SERVER_URL", raising=False)
    assert OcrServerOptions().base_url() == DEFAULT_URL
    monkeypatch.setenv("OCR_SERVER_URL", "http://ocr.example:9000/")
    assert OcrServerOptions().base_url() == "http://ocr.example:9000"
    assert OcrServerOptions(url="http://other:1").base_url() == "http://other:1"


def test_an_unreachable_service_stops_ocrmypdf_before_any_page():
    from ocrmypdf.exceptions import MissingDependencyError

    from serve_app.integrations.ocrmypdf_plugin import OcrServerOptions, check_options

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = types.SimpleNamespace(ocr_server=OcrServerOptions(url=f"http://127.0.0.1:{port}", timeout=5))
    with pytest.raises(MissingDependencyError, match="cannot be reached.*serve run deployments.yaml"):
        check_options(options)


def test_a_page_is_sent_with_word_boxes_and_the_bearer_token_and_written_as_hocr_and_text(tmp_path, monkeypatch):
    """The request the plugin makes (what the service's API takes), against
    a local listener that records it; the real service: tests/e2e."""
    import base64
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from PIL import Image

    from serve_app.integrations.ocrmypdf_plugin import OcrServerOptions, ServiceOcrEngine

    seen = {}
    answer = {"request_id": "r", "image": {"width": 40, "height": 20}, "timings_ms": {},
              "results": [{"text": "hi there", "score": 0.9, "box": [[1, 1], [39, 1], [39, 19], [1, 19]]}]}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen["path"], seen["auth"] = self.path, self.headers.get("Authorization")
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            out = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page = tmp_path / "page.png"
        Image.new("RGB", (40, 20), "white").save(page)
        monkeypatch.setenv("OCR_SERVER_TOKEN", "s3cret")
        options = types.SimpleNamespace(ocr_server=OcrServerOptions(url=f"http://127.0.0.1:{server.server_port}"))
        ServiceOcrEngine.generate_hocr(page, tmp_path / "p.hocr", tmp_path / "p.txt", options)
    finally:
        server.shutdown()
    assert seen["path"] == "/v1/ocr" and seen["auth"] == "Bearer s3cret"
    assert seen["body"]["options"] == {"return_words": True}
    assert base64.b64decode(seen["body"]["image"]["base64"]) == page.read_bytes()
    assert (tmp_path / "p.txt").read_text() == "hi there\n"
    assert 'class="ocrx_word"' in (tmp_path / "p.hocr").read_text()


def test_the_token_never_travels_in_clear_nor_follows_a_redirect(tmp_path, monkeypatch):
    """A token with a plain-http URL to another machine stops OCRmyPDF
    before anything is sent; a service that answers a redirect is an error,
    and the token never reaches where it points."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from ocrmypdf.exceptions import MissingDependencyError, SubprocessOutputError
    from PIL import Image

    from serve_app.integrations.ocrmypdf_plugin import OcrServerOptions, check_options, read_page

    monkeypatch.setenv("OCR_SERVER_TOKEN", "s3cret")
    for url in ("http://ocr.example:8000", "http://10.1.2.3:8000"):
        with pytest.raises(MissingDependencyError, match="in clear; use an https:// URL"):
            check_options(types.SimpleNamespace(ocr_server=OcrServerOptions(url=url, timeout=5)))
    page = tmp_path / "page.png"
    Image.new("RGB", (40, 20), "white").save(page)
    with pytest.raises(MissingDependencyError, match="in clear"):
        read_page(page, OcrServerOptions(url="http://ocr.example:8000"))

    elsewhere: list = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            elsewhere.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    target = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirecting(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{target.server_port}/steal")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    for s in (server, target):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        with pytest.raises(SubprocessOutputError, match="answered 302"):
            read_page(page, OcrServerOptions(url=f"http://127.0.0.1:{server.server_port}"))
    finally:
        server.shutdown()
        target.shutdown()
    assert elsewhere == []
