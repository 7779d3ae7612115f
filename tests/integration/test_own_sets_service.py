"""A user's own model set served by make serve's profile over real HTTP:
a set assembled from the shipped PP-OCRv4 files under another name
(`my_v4`, laid out as a user's export of v4's architecture is) is
catalogued beside PP-OCRv4 itself. GET /v1/models lists it, not loaded; its
first request loads it (following 503 + Retry-After) and reads what v4
reads; with both in the one models process (one program twice: the second
gets an OpenVINO engine of its own, serve_app/inference/ov_slots.py), v4,
the copy and the default each still read as before, in turns. The models
process runs with glibc's MALLOC_PERTURB_, so that a predictor left on a
freed engine would fail here every time. (The copy's weights are v4's: a
predictor run on the other's engine would read the same; that case is
test_predictor_keys', with changed weights.)"""

from __future__ import annotations

import base64

import pytest
import requests

from harness.latin import GERMAN_LINE, line_png
from harness.own_sets import own_v4
from harness.retry_after import post_following_retry_after
from harness.service import REPO, deploy_config, free_port, load_config, start_ray, stop_all


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    config = load_config(REPO / "deployments.light.yaml", model_sets=True)
    app = config["applications"][0]
    app["args"]["own_models"] = [own_v4(tmp_path_factory.mktemp("own"))]
    app["args"]["models"] = ["ppocrv6_small", "ppocrv4_mobile", "my_v4"]
    app["args"]["set_loading"] = {"max_loaded": 3, "min_resident_s": 0}  # the copy beside its base, both held
    (models,) = [d for d in app["deployments"] if d["name"] == "OcrPipeline"]
    env = models["ray_actor_options"].setdefault("runtime_env", {}).setdefault("env_vars", {})
    env["MALLOC_PERTURB_"] = "165"
    start_ray()
    try:
        yield deploy_config(config, free_port())
    finally:
        stop_all(graceful=False)


def states(url: str) -> dict:
    got = requests.get(f"{url}/v1/models", timeout=30).json()
    assert got["default"] == "ppocrv6_small"
    return {m["name"]: m["state"] for m in got["models"]}


def read(url: str, model: str = "") -> str:
    body = {"image": {"base64": base64.b64encode(line_png(GERMAN_LINE)).decode()},
            **({"options": {"model": model}} if model else {})}
    r, _ = post_following_retry_after(url, body)
    assert r.status_code == 200, r.text
    return " ".join(line["text"] for line in r.json()["results"])


def test_an_own_set_of_v4s_architecture_is_served_beside_v4_and_each_reads_as_v4_does(url):
    assert states(url) == {"ppocrv6_small": "loaded", "ppocrv4_mobile": "not loaded", "my_v4": "not loaded"}
    assert read(url) == GERMAN_LINE
    v4 = read(url, "ppocrv4_mobile")
    assert v4 and "ß" not in v4  # read by v4 (its dictionary has no ß)
    assert read(url, "my_v4") == v4
    assert states(url) == {"ppocrv6_small": "loaded", "ppocrv4_mobile": "loaded", "my_v4": "loaded"}
    for _ in range(3):  # each predictor still on its own engine, in turns
        assert read(url, "ppocrv4_mobile") == v4
        assert read(url, "my_v4") == v4
        assert read(url) == GERMAN_LINE
