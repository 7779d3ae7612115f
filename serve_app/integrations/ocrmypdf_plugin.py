"""An OCRmyPDF OCR engine that reads each page with the running OCR service
(with its default model set: PP-OCRv6 small in the shipped profiles), so that

    ocrmypdf --plugin serve_app.integrations.ocrmypdf_plugin in.pdf out.pdf

makes a searchable PDF without Tesseract. OCRmyPDF rasterises each page
(pypdfium2), calls `generate_hocr` here with the page image (on its worker
threads or processes, pages in parallel); this sends the image to
`POST /v1/ocr` with `return_words` and writes the answer as hOCR and plain
text (serve_app.flow.formats), which OCRmyPDF's own renderer lays under the page
as invisible text.

Where the service is: `--ocr-server-url URL` or the environment variable
OCR_SERVER_URL (default http://127.0.0.1:8000); a bearer token from the
environment variable OCR_SERVER_TOKEN (never a command-line argument: it
would show in the process list); `--ocr-server-timeout SECONDS` per page
(default 120). The service is asked `GET /readyz` once before any page.

Needs only OCRmyPDF and its Python dependencies: Tesseract is blocked (this
plugin is the OCR engine), pages are rasterised with pypdfium2, and
OCRmyPDF's output-type `auto` makes a PDF/A without Ghostscript where it can
(else a plain PDF). OCRmyPDF options that call other programs (Ghostscript
for its PDF/A backend, pngquant and jbig2enc for `--optimize 2|3`) need them
as usual (not run here). `--pdf-renderer sandwich` is not supported (it
needs an engine-made PDF)."""

from __future__ import annotations

import base64
import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from ocrmypdf import hookimpl
from ocrmypdf.exceptions import MissingDependencyError, SubprocessOutputError
from ocrmypdf.pluginspec import OcrEngine, OrientationConfidence
from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8000"
TOKEN_ENV = "OCR_SERVER_TOKEN"
URL_ENV = "OCR_SERVER_URL"
# The service's default image limit is 20 MiB; a lossless page image over
# this is sent as a JPEG instead (a 600 dpi colour scan can be larger).
MAX_PNG_BYTES = 16 * 1024 * 1024


class OcrServerOptions(BaseModel):
    """`options.ocr_server`: where the service is."""

    url: Optional[str] = Field(None, description="the OCR service's base URL")
    timeout: float = Field(120.0, gt=0, description="seconds per page")

    def base_url(self) -> str:
        return (self.url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


@hookimpl
def initialize(plugin_manager) -> None:
    # This plugin is the OCR engine: Tesseract is not needed (its plugin
    # would refuse to start without the tesseract program).
    plugin_manager.set_blocked("ocrmypdf.builtin_plugins.tesseract_ocr")


@hookimpl
def add_options(parser) -> None:
    group = parser.add_argument_group("OCR service", "PP-OCR over HTTP (serve_app)")
    group.add_argument("--ocr-server-url", metavar="URL",
                       help=f"the OCR service (default: ${URL_ENV}, else {DEFAULT_URL}); "
                            f"a bearer token is read from ${TOKEN_ENV}")
    group.add_argument("--ocr-server-timeout", type=float, metavar="SECONDS", help="per page (default 120)")


@hookimpl
def register_options():
    # OCRmyPDF's own option checks read `options.tesseract` whatever the
    # engine; its plugin (blocked above) would have registered the model.
    from ocrmypdf.builtin_plugins.tesseract_ocr import TesseractOptions

    return {"ocr_server": OcrServerOptions, "tesseract": TesseractOptions}


@hookimpl
def check_options(options) -> None:
    """Fail before any page if the service is not there or not ready."""
    server = options.ocr_server
    _auth_headers(server.base_url())  # a token that would travel in clear stops it here
    url = f"{server.base_url()}/readyz"
    try:
        with _OPENER.open(url, timeout=min(server.timeout, 30)) as r:
            ready = json.loads(r.read()).get("ready")
    except urllib.error.HTTPError as e:
        ready = False if e.code == 503 else None
        if ready is None:
            raise MissingDependencyError(f"the OCR service at {server.base_url()} answered {e.code} to /readyz") from None
    except (OSError, ValueError) as e:
        raise MissingDependencyError(f"the OCR service at {server.base_url()} cannot be reached ({e}); start it "
                                     f"(`serve run deployments.yaml`) or give --ocr-server-url") from None
    if not ready:
        raise MissingDependencyError(f"the OCR service at {server.base_url()} is not ready yet (GET /readyz); retry "
                                     f"when its models are loaded")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as the error it is for this API, never
    followed: urllib would send the Authorization header on to wherever
    the redirect points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _auth_headers(base_url: str) -> dict:
    """The bearer token's header; refused (before anything is sent) when the
    token would cross a network in clear: plain http to a host that is not
    this machine."""
    token = os.environ.get(TOKEN_ENV)
    if not token:
        return {}
    u = urllib.parse.urlsplit(base_url)
    if u.scheme != "https" and not _is_loopback(u.hostname or ""):
        raise MissingDependencyError(f"${TOKEN_ENV} is set but {base_url} is plain http to another machine: the "
                                     f"token would travel in clear; use an https:// URL (or a loopback address)")
    return {"Authorization": f"Bearer {token}"}


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_page(image: Path, server: OcrServerOptions) -> dict:
    """The service's JSON answer for one page image, with word boxes."""
    data = image.read_bytes()
    if len(data) > MAX_PNG_BYTES:
        data = _as_jpeg(image)
    payload = json.dumps({"image": {"base64": base64.b64encode(data).decode()},
                          "options": {"return_words": True}}).encode()
    headers = {"Content-Type": "application/json", **_auth_headers(server.base_url())}
    req = urllib.request.Request(f"{server.base_url()}/v1/ocr", data=payload, headers=headers, method="POST")
    try:
        with _OPENER.open(req, timeout=server.timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read())["error"]["message"]
        except Exception:  # noqa: BLE001 - any body: report the status
            message = e.reason
        raise SubprocessOutputError(f"the OCR service answered {e.code} for {image.name}: {message}") from None
    except OSError as e:
        raise SubprocessOutputError(f"the OCR service at {server.base_url()} failed on {image.name}: {e}") from None


def _as_jpeg(image: Path) -> bytes:
    import io

    from PIL import Image

    with Image.open(image) as im:
        buf = io.BytesIO()
        im.convert("RGB").save(buf, "JPEG", quality=92)
        return buf.getvalue()


class ServiceOcrEngine(OcrEngine):
    """OCRmyPDF's OCR engine, answered by the service."""

    @staticmethod
    def version() -> str:
        return "PP-OCR"

    @staticmethod
    def creator_tag(options) -> str:
        return "serve_app PP-OCR (Paddle Inference)"

    def __str__(self) -> str:
        return "PP-OCR OCR service (serve_app)"

    @staticmethod
    def languages(options) -> set[str]:
        # The service's default set (PP-OCRv6 small) reads Chinese, English,
        # Japanese kana and the Latin languages its dictionary writes
        # (serve_app.core.model_sets); Tesseract's names for them are accepted.
        return {"eng", "chi_sim", "chi_tra", "jpn", "deu", "fra", "spa", "por", "ita", "nld", "pol", "ces", "swe",
                "dan", "nor", "fin", "en", "zh"}

    @staticmethod
    def get_orientation(input_file: Path, options) -> OrientationConfidence:
        # The service turns upside-down lines itself (its direction
        # classifier); it does not report a page's rotation.
        return OrientationConfidence(angle=0, confidence=0.0)

    @staticmethod
    def get_deskew(input_file: Path, options) -> float:
        return 0.0

    @staticmethod
    def generate_hocr(input_file: Path, output_hocr: Path, output_text: Path, options) -> None:
        from serve_app.flow.formats import render

        body = read_page(Path(input_file), options.ocr_server)
        Path(output_hocr).write_text(render(body, "hocr")[0], encoding="utf-8")
        Path(output_text).write_text(render(body, "text")[0], encoding="utf-8")

    @staticmethod
    def generate_pdf(input_file: Path, output_pdf: Path, output_text: Path, options) -> None:
        raise NotImplementedError("the OCR service gives hOCR, not a PDF: use --pdf-renderer auto (fpdf2), "
                                  "not sandwich")


@hookimpl
def get_ocr_engine(options):
    return ServiceOcrEngine()
