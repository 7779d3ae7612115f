"""The web page (GET / and /ui): its files, served by the ingress from
serve_app/static (package data, no build step, nothing from elsewhere), and
the one list of the request options it offers (GET /ui/options.json), from
which the page builds its option form. No Ray.

To offer a new option (an OcrOptions field) or output format on the page,
add an entry below; a unit test checks that every OcrOptions field has one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

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
    {"name": "det", "label": "Detect lines", "kind": "bool", "default": True,
     "help": "off: read the whole image as one line (a crop already cut out)"},
    {"name": "return_chars", "label": "Character boxes", "kind": "bool", "default": False,
     "help": "a box for every character of each line"},
    {"name": "visualize", "label": "Server picture", "kind": "bool", "default": False,
     "help": "the service draws the boxes and text into a JPEG (visualize)"},
)

# Output formats (the `format` query parameter); the page draws boxes for
# json and shows any other answer as text.
FORMATS: tuple[str, ...] = ("json",)


def page_config() -> dict[str, Any]:
    return {"options": list(OPTIONS), "formats": list(FORMATS)}


def static_file(name: str) -> Optional[tuple[bytes, str]]:
    """(content, media type) of one of the page's files; None for any other name."""
    media = FILES.get(name)
    if media is None:
        return None
    return (STATIC / name).read_bytes(), media
