"""serve_app.http.ui: the page's files and its option form's one list."""

from __future__ import annotations

import re

from serve_app.core.request_options import FIELDS
from serve_app.http.ui import FILES, FORMATS, OPTIONS, STATIC, page_config, static_file


def test_every_request_option_has_a_control_on_the_page_and_no_other():
    # A new OcrOptions field fails here until ui.OPTIONS offers it.
    names = [o["name"] for o in OPTIONS]
    assert sorted(names + ["format"]) == sorted(FIELDS) and len(set(names)) == len(names)  # format: FORMATS
    for o in OPTIONS:
        assert o["kind"] in ("bool", "choice", "number") and o["label"]
        if o["kind"] == "choice":
            assert all(len(c) == 2 for c in o["choices"])
    assert FORMATS == ("json", "text", "hocr", "alto", "markdown") and page_config()["options"][0]["name"] == OPTIONS[0]["name"]


def test_the_page_files_are_package_files_and_nothing_else_is_served():
    for name in FILES:
        content, media = static_file(name)
        assert content and media.endswith("charset=utf-8")
    for bad in ("../ui.py", "..%2Fui.py", "ui.py", "", "static/app.js", "/etc/passwd"):
        assert static_file(bad) is None


def test_the_page_loads_nothing_from_elsewhere():
    html = (STATIC / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs and all(not re.match(r"^(https?:)?//", r) for r in refs), refs
    for name in FILES:
        text = (STATIC / name).read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text, name
    # Every file the page names is one the ingress serves.
    assert {r.removeprefix("ui/") for r in refs if not r.startswith("data:")} == set(FILES) - {"index.html"}
