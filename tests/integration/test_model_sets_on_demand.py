"""deployments.yaml's catalogue on real Ray, real models and real HTTP: the
default set (PP-OCRv6 small) is ready at start and reads a German line with
its accents and spaces; the further sets' deployments are at zero replicas
(nothing of theirs in memory) until a request names one; that request is
answered 200, after Serve has started its stages (waited for, or by
following 503 + Retry-After); GET /v1/models shows each set's state
throughout. (make serve's one-process profile: test_light_profile.)"""

from __future__ import annotations

import base64

import pytest
import requests

from harness.latin import GERMAN_LINE, line_png
from harness.retry_after import post_following_retry_after
from harness.service import DEFAULT_CONFIG, deploy_config, free_port, load_config
from harness.service import start_ray, stop_all


@pytest.fixture(scope="module")
def url():
    start_ray()
    try:
        yield deploy_config(load_config(DEFAULT_CONFIG, model_sets=True), free_port())
    finally:
        stop_all(graceful=False)


def running(name: str) -> int:
    from ray import serve

    return serve.status().applications["ocr"].deployments[name].replica_states.get("RUNNING", 0)


def states(url: str) -> dict:
    got = requests.get(f"{url}/v1/models", timeout=30).json()
    assert got["default"] == "ppocrv6_small"
    return {m["name"]: m["state"] for m in got["models"]}


def test_further_sets_start_on_their_first_request_only(url):
    image = {"base64": base64.b64encode(line_png(GERMAN_LINE)).decode()}
    assert states(url) == {"ppocrv6_small": "loaded", "ppocrv4_mobile": "not loaded", "ppocrv6_tiny": "not loaded"}
    assert {running(f"{kind}_{s}") for kind in ("TextDetector", "TextRecognizer")
            for s in ("ppocrv4_mobile", "ppocrv6_tiny")} == {0}
    default = requests.post(f"{url}/v1/ocr", json={"image": image}, timeout=120, headers={"Cache-Control": "no-cache"})
    assert default.status_code == 200 and " ".join(r["text"] for r in default.json()["results"]) == GERMAN_LINE
    assert default.json()["model"] == "ppocrv6_small"  # the answer names the set that read it
    ready = requests.get(f"{url}/readyz", timeout=30)
    assert ready.status_code == 200 and set(ready.json()["stages"]) == {"det", "cls", "rec"}
    assert running("TextRecognizer_ppocrv4_mobile") == 0  # readiness and stats never start a set

    v4, _ = post_following_retry_after(url, {"image": image, "options": {"model": "ppocrv4_mobile"}})
    assert v4.status_code == 200, v4.text
    assert "ß" not in " ".join(r["text"] for r in v4.json()["results"])  # read by v4 (its dictionary has no ß)
    assert v4.json()["model"] == "ppocrv4_mobile"
    hocr = requests.post(f"{url}/v1/ocr?format=hocr", json={"image": image, "options": {"model": "ppocrv4_mobile"}},
                         timeout=60)
    assert hocr.status_code == 200 and '<meta name="ocr-langs" content="zh en"' in hocr.text
    assert running("TextDetector_ppocrv4_mobile") == running("TextRecognizer_ppocrv4_mobile") == 1
    assert running("TextRecognizer_ppocrv6_tiny") == 0
    assert states(url) == {"ppocrv6_small": "loaded", "ppocrv4_mobile": "loaded", "ppocrv6_tiny": "not loaded"}
    again = requests.post(f"{url}/v1/ocr", json={"image": image, "options": {"model": "ppocrv4_mobile"}},
                          timeout=60, headers={"Cache-Control": "no-cache"})
    assert again.status_code == 200 and again.json()["results"] == v4.json()["results"]
