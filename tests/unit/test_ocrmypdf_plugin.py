"""The OCRmyPDF plugin (serve_app.ocrmypdf_plugin) as OCRmyPDF loads it:
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

    pm = setup_plugin_infrastructure(plugins=["serve_app.ocrmypdf_plugin"])
    names = {pm.pluggy_manager.get_name(p) for p in pm.pluggy_manager.get_plugins()}
    assert "ocrmypdf.builtin_plugins.tesseract_ocr" not in names  # blocked: no tesseract program needed
    engine = pm.get_ocr_engine(options=None)
    assert str(engine) == "PP-OCRv4 OCR service (serve_app)"
    assert {"eng", "chi_sim"} <= engine.languages(None)
    with pytest.raises(NotImplementedError, match="pdf-renderer"):
        engine.generate_pdf(None, None, None, None)


def test_server_url_from_option_environment_or_default(monkeypatch):
    from serve_app.ocrmypdf_plugin import DEFAULT_URL, OcrServerOptions

    monkeypatch.delenv("OCR_SERVER_URL", raising=False)
    assert OcrServerOptions().base_url() == DEFAULT_URL
    monkeypatch.setenv("OCR_SERVER_URL", "http://ocr.example:9000/")
    assert OcrServerOptions().base_url() == "http://ocr.example:9000"
    assert OcrServerOptions(url="http://other:1").base_url() == "http://other:1"


def test_an_unreachable_service_stops_ocrmypdf_before_any_page():
    from ocrmypdf.exceptions import MissingDependencyError

    from serve_app.ocrmypdf_plugin import OcrServerOptions, check_options

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

    from serve_app.ocrmypdf_plugin import OcrServerOptions, ServiceOcrEngine

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


def test_the_token_is_not_sent_on_a_redirect_nor_over_plain_http_to_another_host(tmp_path, monkeypatch):
    """Issue 24: a redirect is an error (the token goes only where it was
    told), and a token with an http:// URL to another machine stops
    OCRmyPDF before any page."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from PIL import Image

    from ocrmypdf.exceptions import MissingDependencyError, SubprocessOutputError
    from serve_app.ocrmypdf_plugin import OcrServerOptions, ServiceOcrEngine, auth_headers

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen.append((self.path, self.headers.get("Authorization")))
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(307)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page = tmp_path / "page.png"
        Image.new("RGB", (40, 20), "white").save(page)
        monkeypatch.setenv("OCR_SERVER_TOKEN", "s3cret")
        options = types.SimpleNamespace(ocr_server=OcrServerOptions(url=f"http://127.0.0.1:{server.server_port}"))
        with pytest.raises(SubprocessOutputError, match="307"):
            ServiceOcrEngine.generate_hocr(page, tmp_path / "p.hocr", tmp_path / "p.txt", options)
    finally:
        server.shutdown()
    assert seen == [("/v1/ocr", "Bearer s3cret")]  # the redirect was not followed
    with pytest.raises(MissingDependencyError, match="in clear"):
        auth_headers("http://ocr.example.com:8000")
    assert auth_headers("https://ocr.example.com") == {"Authorization": "Bearer s3cret"}
    assert auth_headers("http://localhost:8000") == {"Authorization": "Bearer s3cret"}
