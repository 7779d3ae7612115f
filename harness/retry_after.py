"""A client that follows 503 + Retry-After, as the service asks one to
(a model set's first request while it loads: serve_app/serving/set_cache.py)."""

from __future__ import annotations

import time
from typing import Any


def post_following_retry_after(url: str, body: dict, limit_s: float = 300) -> tuple[Any, int]:
    """POST /v1/ocr, following 503 + Retry-After as a client would: the answer and how many 503s came first."""
    import requests

    end, retries = time.monotonic() + limit_s, 0
    while True:
        r = requests.post(f"{url}/v1/ocr", json=body, timeout=120, headers={"Cache-Control": "no-cache"})
        if r.status_code != 503 or time.monotonic() > end:
            return r, retries
        assert r.json()["error"]["code"] == "model_loading" and int(r.headers["Retry-After"]) >= 1, r.text
        retries += 1
        time.sleep(min(int(r.headers["Retry-After"]), 5))
