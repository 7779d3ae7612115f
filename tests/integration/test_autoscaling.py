"""A test variant of deployments.yaml: autoscaling with short delays (the
recogniser grows under sustained load and shrinks back when idle), and
detector predictor batches of 2 (concurrent images of one input shape run
together)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from peer import PEER
from serve_fixtures import deploy_config, free_port, load_config, start_ray, stop_all


@pytest.fixture(scope="module")
def service():
    start_ray()
    cfg = load_config()
    cfg["applications"][0]["args"]["engine"]["det"] = {"batch_size": 2}
    for d in cfg["applications"][0]["deployments"]:
        if d["name"] == "TextRecognizer":
            d["autoscaling_config"] = {
                "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
                "upscale_delay_s": 1, "downscale_delay_s": 5, "look_back_period_s": 2, "metrics_interval_s": 0.5,
            }
    try:
        yield deploy_config(cfg, free_port())
    finally:
        stop_all()


def rec_replicas() -> dict:
    from ray import serve

    return serve.status().applications["ocr"].deployments["TextRecognizer"].replica_states


def test_recognizer_scales_up_under_load_and_back_down(service):
    url = service
    data = (PEER / "paddleocr_00006737.jpg").read_bytes()  # ~30 lines: recognition-heavy
    stop = threading.Event()
    codes: list[int] = []

    def client():
        while not stop.is_set():
            r = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/jpeg"}, timeout=120)
            codes.append(r.status_code)

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and rec_replicas().get("RUNNING", 0) < 2:
            time.sleep(1)
        grown = rec_replicas()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert grown.get("RUNNING", 0) == 2, grown
    assert codes and set(codes) == {200}

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(rec_replicas().values()) > 1:
        time.sleep(1)
    assert rec_replicas() == {"RUNNING": 1}


def test_concurrent_images_of_one_shape_share_detector_batches(service):
    """Eight clients sending 1280x720 photos (all one detector input shape):
    the detector runs predictor batches holding two requests' images."""
    from ray import serve

    from serve_fixtures import replica_stats

    url = service
    photos = [(PEER / f"mmocr_icdar15_img_{i}.jpg").read_bytes() for i in range(1, 9)]

    def send(data):
        return requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/jpeg"}, timeout=120)

    with ThreadPoolExecutor(8) as pool:
        codes = [r.status_code for r in pool.map(send, photos * 3)]
    assert set(codes) == {200}
    det = serve.get_deployment_handle("TextDetector", app_name="ocr")
    n = serve.status().applications["ocr"].deployments["TextDetector"].replica_states.get("RUNNING", 1)
    batches = [b for st in replica_stats(det, n).values() for b in st["recent_batches"]]
    assert max(b["requests"] for b in batches) == 2, batches[-10:]
