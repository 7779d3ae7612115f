"""Document structure in the per-stage profile (deployments.yaml, shared
with test_serve_app): the LayoutDetector and TableRecognizer deployments
stay at zero replicas until a request asks for structure; the first one
starts both (503 model_loading with Retry-After while they start, followed
as a client would), after which /readyz lists them and a report page comes
back typed."""

from __future__ import annotations

import base64

import pytest
import requests

from harness import structure_pages
from harness.retry_after import post_following_retry_after
from harness.service import load_config

SHARED_SERVICE = "deployments.yaml"


@pytest.fixture(scope="module")
def service(shared_services):
    return shared_services.get(SHARED_SERVICE, load_config())


def replicas(name: str) -> int:
    from ray import serve

    app = serve.status().applications["ocr"].deployments
    return sum(app[name].replica_states.values()) if name in app else -1


def test_structure_deployments_start_on_the_first_request_that_asks(service):
    url, _ = service
    if replicas("LayoutDetector") == 0:
        assert replicas("TableRecognizer") == 0
        assert "layout" not in requests.get(f"{url}/readyz", timeout=30).json()["stages"]
    page = base64.b64encode(structure_pages.report_page()).decode()
    r, _ = post_following_retry_after(url, {"image": {"base64": page}, "options": {"structure": True}}, limit_s=400)
    assert r.status_code == 200, r.text
    types = [g["type"] for g in r.json()["regions"]]
    assert "title" in types and "table" in types, types
    assert replicas("LayoutDetector") >= 1 and replicas("TableRecognizer") >= 1
