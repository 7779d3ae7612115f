"""The web page (GET / and /ui): its files, served by the ingress from
serve_app/http/static (package data, no build step, nothing from elsewhere), and
the one list of the request options it offers (GET /ui/options.json), from
which the page builds its option form. No Ray.

To offer a new option (an OcrOptions field) or output format on the page,
add an entry below; a unit test checks that every OcrOptions field has one
(`format` is the page's format select, from FORMATS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from serve_app.core.model_sets import SETS

STATIC = Path(__file__).resolve().parent / "static"

# name -> media type: the only files served (no paths from the request).
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}

# The option form. kind: "bool" (a checkbox), "choice" (a select; the
# value "" sends nothing: the service's default), "number" (blank sends
# nothing). Each name is an OcrOptions field, sent in the request's options.
OPTIONS: tuple[dict[str, Any], ...] = (
    {"name": "cls", "label": "Direction classifier", "kind": "choice",
     "choices": [["", "service default"], [True, "on"], [False, "off"]],
     "help": "turn upside-down lines before reading them"},
    {"name": "model", "label": "Model set", "kind": "choice",
     "choices": [["", "service default"], *([name, s.title] for name, s in SETS.items())],
     "help": "the models to read with (GET /v1/models: those this service serves)"},
    {"name": "det", "label": "Detect lines", "kind": "bool", "default": True,
     "help": "off: read the whole image as one line (a crop already cut out)"},
    {"name": "return_chars", "label": "Character boxes", "kind": "bool", "default": False,
     "help": "a box for every character of each line"},
    {"name": "return_words", "label": "Word boxes", "kind": "bool", "default": False,
     "help": "a box for every word of each line"},
    {"name": "visualize", "label": "Server picture", "kind": "bool", "default": False,
     "help": "the service draws the boxes and text into a JPEG (visualize)"},
    {"name": "priority", "label": "Priority", "kind": "choice",
     "choices": [["", "service default (interactive)"], ["interactive", "interactive"], ["bulk", "bulk"]],
     "help": "bulk work gets the capacity interactive work leaves spare"},
    {"name": "pdf_text_layer", "label": "PDF text layer", "kind": "bool", "default": False,
     "help": "PDF pages that have a text layer take their lines from it"},
    {"name": "page_orientation", "label": "Page orientation", "kind": "choice",
     "choices": [["", "service default"], [True, "on"], [False, "off"]],
     "help": "find a page turned 90, 180 or 270 degrees and read it upright"},
    {"name": "blocks", "label": "Blocks and columns", "kind": "choice",
     "choices": [["", "service default"], [True, "on"], [False, "off"]],
     "help": "group lines into blocks and read columns one after the other"},
    {"name": "structure", "label": "Document structure", "kind": "bool", "default": False,
     "help": "layout regions (title, text, table, figure ...) and tables as rows and cells"},
    # Detection per request (bounds: serve_app.core.request_options.RANGES; blank: the config's value).
    {"name": "limit_side_len", "label": "Detector side limit", "kind": "number", "min": 32, "max": 4096,
     "step": 1, "default": None, "help": "px; rounded down to a warmed input size (640, 960, 1280)"},
    {"name": "thresh", "label": "Binarisation threshold", "kind": "number", "min": 0.01, "max": 0.99,
     "step": 0.01, "default": 0.3, "help": "of the text probability map"},
    {"name": "box_thresh", "label": "Box threshold", "kind": "number", "min": 0.01, "max": 0.99,
     "step": 0.01, "default": 0.5, "help": "a box's mean probability must reach it"},
    {"name": "unclip_ratio", "label": "Unclip ratio", "kind": "number", "min": 0.5, "max": 5,
     "step": 0.1, "default": 1.6, "help": "how far a box grows around its text"},
    {"name": "drop_score", "label": "Drop score", "kind": "number", "min": 0, "max": 1,
     "step": 0.01, "default": 0.5, "help": "lines read with a lower score are dropped"},
)

# Output formats (the `format` query parameter); the page draws boxes for
# json and shows any other answer as text.
FORMATS: tuple[str, ...] = ("json", "text", "hocr", "alto", "markdown")


def page_config() -> dict[str, Any]:
    return {"options": list(OPTIONS), "formats": list(FORMATS)}




def static_file(name: str) -> Optional[tuple[bytes, str]]:
    """(content, media type) of one of the page's files; None for any other name."""
    media = FILES.get(name)
    if media is None:
        return None
    return (STATIC / name).read_bytes(), media
