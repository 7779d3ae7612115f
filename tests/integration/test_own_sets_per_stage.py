"""A user's own sets in the per-stage profile (deployments.yaml) on real
Ray, real models and real HTTP. Each own set's stages are deployments at
zero replicas until its first request, as the built-in further sets'
(the Serve config has no block for them: serve_app.app.ON_DEMAND). A set
whose files break after the start-up check (its recogniser's weights
deleted once the application is built) cannot start a replica: GET
/v1/models shows it `failed`, its requests get 503 `model_unavailable`
with Retry-After (not `model_loading` for ever), and the default set and
/readyz are served throughout; another own set still starts on its first
request and reads."""

from __future__ import annotations

import base64
import time

import pytest
import requests

from harness.latin import GERMAN_LINE, line_png
from harness.own_sets import own_v4
from harness.retry_after import post_following_retry_after
from harness.service import DEFAULT_CONFIG, deploy_config, free_port, load_config, start_ray, stop_all, wait_ready

IMAGE = {"base64": base64.b64encode(line_png(GERMAN_LINE)).decode()}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = load_config(DEFAULT_CONFIG)  # the default set alone, and the two own sets below
    app = config["applications"][0]
    mine = own_v4(tmp_path_factory.mktemp("mine"))
    broken = {**own_v4(tmp_path_factory.mktemp("broken")), "name": "broken_v4", "title": "breaks after its check"}
    app["args"]["own_models"] = [mine, broken]
    app["args"]["models"] = ["ppocrv6_small", "my_v4", "broken_v4"]
    start_ray()
    try:
        url = deploy_config(config, free_port())
        yield url, broken
    finally:
        stop_all(graceful=False)


def running(name: str) -> int:
    from ray import serve

    return serve.status().applications["ocr"].deployments[name].replica_states.get("RUNNING", 0)


def states(url: str) -> dict:
    return {m["name"]: m["state"] for m in requests.get(f"{url}/v1/models", timeout=30).json()["models"]}


def post(url: str, model: str = "") -> requests.Response:
    return requests.post(f"{url}/v1/ocr", json={"image": IMAGE, **({"options": {"model": model}} if model else {})},
                         timeout=120, headers={"Cache-Control": "no-cache"})


def test_own_sets_start_on_demand_and_one_that_cannot_start_is_failed_while_the_default_serves(served):
    from pathlib import Path

    url, broken = served
    assert states(url) == {"ppocrv6_small": "loaded", "my_v4": "not loaded", "broken_v4": "not loaded"}
    assert {running(f"{kind}_{s}") for kind in ("TextDetector", "TextRecognizer") for s in ("my_v4", "broken_v4")} == {0}

    (Path(broken["rec_model"]) / "inference.pdiparams").unlink()  # after the start-up check passed
    end, answer = time.monotonic() + 300, None
    while time.monotonic() < end:
        answer = post(url, "broken_v4")
        if answer.status_code != 503 or answer.json()["error"]["code"] != "model_loading":
            break
        time.sleep(min(int(answer.headers["Retry-After"]), 3))
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "model_unavailable" and int(answer.headers["Retry-After"]) >= 1
    assert "could not be started" in answer.json()["error"]["message"]
    assert states(url)["broken_v4"] == "failed"
    again = post(url, "broken_v4")  # at once, not another wait for a start
    assert again.status_code == 503 and again.json()["error"]["code"] == "model_unavailable"

    default = post(url)
    assert default.status_code == 200 and " ".join(r["text"] for r in default.json()["results"]) == GERMAN_LINE
    # /readyz answers from its last probe (a state up to READY_IDLE_S old when it was not asked
    # meanwhile, here from before the broken set's start): the next probes show the default's stages.
    wait_ready(url, timeout_s=30)
    assert set(requests.get(f"{url}/readyz", timeout=30).json()["stages"]) == {"det", "cls", "rec"}
    assert requests.get(f"{url}/healthz", timeout=30).status_code == 200

    mine, _ = post_following_retry_after(url, {"image": IMAGE, "options": {"model": "my_v4"}})
    assert mine.status_code == 200, mine.text
    assert "ß" not in " ".join(r["text"] for r in mine.json()["results"])  # v4's files: no ß in its dictionary
    assert running("TextDetector_my_v4") == running("TextRecognizer_my_v4") == 1
    assert states(url) == {"ppocrv6_small": "loaded", "my_v4": "loaded", "broken_v4": "failed"}
