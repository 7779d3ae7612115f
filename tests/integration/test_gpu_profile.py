"""The GPU profile on logical GPUs (no GPU needed): fractional placement,
and the CPU build's refusal unless the CPU fallback is allowed."""

from __future__ import annotations

import copy
import time

import pytest
import requests

from peer import PEER
from serve_fixtures import REPO, apply_config, deploy_config, free_port, load_config, start_ray, stop_all, wait_ready


@pytest.fixture(scope="module")
def cluster():
    start_ray(num_cpus=8, num_gpus=1)  # logical: Ray only counts them
    yield
    stop_all()


def gpu_config(fallback: bool, rec_replicas: int) -> dict:
    cfg = load_config(REPO / "deployments.gpu.yaml")
    app = cfg["applications"][0]
    for block in [app["args"]["engine"]] + [app["args"][s] for s in ("detector", "classifier", "recognizer") if s in app["args"]]:
        if "predictor" in block:
            block["predictor"]["allow_cpu_fallback"] = fallback
    for d in app["deployments"]:
        d["ray_actor_options"]["num_cpus"] = 0.1
        if d["name"] in ("TextDetector", "DirectionClassifier"):
            d["ray_actor_options"]["num_gpus"] = 0  # leave the one GPU to the recogniser
        if d["name"] == "TextRecognizer":
            d.pop("autoscaling_config")
            d["num_replicas"] = rec_replicas
        if d["name"] == "OcrPipeline":
            d.pop("autoscaling_config")
    return cfg


def test_cpu_build_refuses_gpu_profile_without_fallback(cluster):
    from ray import serve

    cfg = gpu_config(fallback=False, rec_replicas=1)
    cfg.pop("http_options")
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    apply_config(cfg)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        app = serve.status().applications.get("ocr")
        if app is not None and app.status == "DEPLOY_FAILED":
            break
        time.sleep(1)
    assert app.status == "DEPLOY_FAILED"
    assert "allow_cpu_fallback" in app.message and "paddlepaddle-gpu" in app.message
    serve.delete("ocr")


def test_four_quarter_gpu_replicas_share_one_gpu_and_a_fifth_waits(cluster):
    from ray import serve

    cfg = gpu_config(fallback=True, rec_replicas=5)
    port = free_port()
    serve.shutdown()
    url = deploy_config(cfg, port, all_replicas=False)  # ready once each stage has a warmed replica
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        states = serve.status().applications["ocr"].deployments["TextRecognizer"].replica_states
        if states.get("RUNNING", 0) == 4:
            break
        time.sleep(2)
    time.sleep(5)  # the fifth must still be waiting for a GPU share
    states = serve.status().applications["ocr"].deployments["TextRecognizer"].replica_states
    assert states.get("RUNNING", 0) == 4, states
    assert sum(states.values()) == 5, states

    rec = serve.get_deployment_handle("TextRecognizer", app_name="ocr")
    seen = {}
    for _ in range(60):
        s = rec.stats.remote().result()
        seen[s["pid"]] = s
        if len(seen) == 4:
            break
    assert len(seen) == 4
    for s in seen.values():
        assert s["gpu_ids"] == ["0"], s  # each replica got GPU 0 from Ray
        assert s["device"] == "cpu"  # CPU build: fell back, as the test config allows

    with open(PEER / "rapidocr_issue_170.png", "rb") as f:
        r = requests.post(f"{url}/v1/ocr", files={"file": f}, timeout=120)
    assert r.status_code == 200 and [x["text"] for x in r.json()["results"]] == ["TEST"]
