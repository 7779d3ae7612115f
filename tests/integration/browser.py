"""Headless Chromium for the web page's tests: Debian's chromium
(tests/system/packages.txt, installed by tests/system/install.sh), driven by
Playwright from PyPI. Nothing is downloaded: Playwright's own browsers are
never installed, and the flags keep Chromium off the network (without the
background-networking ones it keeps trying to reach Google's services)."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from typing import Iterator

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def chromium_page(width: int = 1440, height: int = 900) -> Iterator:
    """A Playwright page in a fresh Chromium (its own new profile); page
    errors (uncaught exceptions in the page's scripts) are collected in
    `page.errors` for the test to check."""
    if not os.path.exists(CHROMIUM):
        raise AssertionError(f"{CHROMIUM} is missing: install the tests' Debian packages "
                             f"(bash tests/system/install.sh, which `make test` runs)")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="ocr-chromium-") as profile, sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": width, "height": height})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.errors = []
            page.on("pageerror", lambda e: page.errors.append(str(e)))
            page.set_default_timeout(60_000)
            yield page
        finally:
            context.close()
