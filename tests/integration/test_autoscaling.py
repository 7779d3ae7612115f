"""A test variant of deployments.yaml: stage-specific autoscaling with
short delays (the recogniser grows on its crop backlog under dense pages
while the detector, whose image backlog stays small, does not; both shrink
back when idle), detector predictor batches of 2 (concurrent images of one
input shape run together), the correctness canary of a recogniser made to
misread (the test hook), and the ingress's result cache.

Requests meant to make work send `Cache-Control: no-cache` (the result
cache is on here)."""

from __future__ import annotations

import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from harness.peer import PEER
from harness.service import deploy_config, free_port, load_config, start_ray, stop_all

FRESH = {"Cache-Control": "no-cache"}
FAULT_FILE = Path(tempfile.mkdtemp(prefix="ocr-canary-")) / "rec-fault"


def _autoscaling(metric: str, target: float) -> dict:
    return {"min_replicas": 1, "max_replicas": 2, "upscale_delay_s": 1, "downscale_delay_s": 5,
            "look_back_period_s": 2, "metrics_interval_s": 0.5,
            "policy": {"policy_function": "serve_app.serving.autoscaling:BacklogPolicy",
                       "policy_kwargs": {"metric": metric, "target_per_replica": target}}}


@pytest.fixture(scope="module")
def service():
    start_ray()
    cfg = load_config(cache=True)
    app = cfg["applications"][0]
    app["args"]["engine"]["det"] = {"batch_size": 2}
    app["args"]["recognizer"]["canary_interval_s"] = 1
    for d in app["deployments"]:
        if d["name"] == "TextRecognizer":
            d["autoscaling_config"] = _autoscaling("queued_crops", 24)
            d["health_check_period_s"] = 1
            d["health_check_timeout_s"] = 10
            d["ray_actor_options"] = {**d["ray_actor_options"],
                                      "runtime_env": {"env_vars": {"OCR_TEST_REC_FAULT_FILE": str(FAULT_FILE)}}}
        if d["name"] == "TextDetector":
            d["autoscaling_config"] = _autoscaling("queued_images", 8)
    try:
        yield deploy_config(cfg, free_port())
    finally:
        stop_all(graceful=False)  # the cluster goes with ray.shutdown(): no ~10-40 s Serve drain


def replicas(name: str) -> dict:
    from ray import serve

    return serve.status().applications["ocr"].deployments[name].replica_states


def rec_replicas() -> dict:
    from ray import serve

    return serve.status().applications["ocr"].deployments["TextRecognizer"].replica_states


def test_dense_pages_scale_the_recognizer_not_the_detector_and_back_down(service):
    """Six clients sending a ~30-line page: ~180 crops queued for the
    recogniser (target 24 per replica) but at most six images for the
    detector (target 8): the recogniser grows, the detector does not."""
    url = service
    data = (PEER / "paddleocr_00006737.jpg").read_bytes()  # ~30 lines: recognition-heavy
    stop = threading.Event()
    codes: list[int] = []
    det_seen: list[dict] = []

    def client():
        while not stop.is_set():
            r = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/jpeg", **FRESH},
                              timeout=120)
            codes.append(r.status_code)

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and rec_replicas().get("RUNNING", 0) < 2:
            det_seen.append(replicas("TextDetector"))
            time.sleep(1)
        grown = rec_replicas()
        for _ in range(3):  # the load goes on a little: the detector still does not grow
            det_seen.append(replicas("TextDetector"))
            time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert grown.get("RUNNING", 0) == 2, grown
    assert all(d == {"RUNNING": 1} for d in det_seen), det_seen
    assert codes and set(codes) == {200}

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(rec_replicas().values()) > 1:
        time.sleep(1)
    assert rec_replicas() == {"RUNNING": 1}


def test_concurrent_images_of_one_shape_share_detector_batches(service):
    """Eight clients sending 1280x720 photos (all one detector input shape):
    the detector runs predictor batches holding two requests' images."""
    from ray import serve

    from harness.service import replica_stats

    url = service
    photos = [(PEER / f"mmocr_icdar15_img_{i}.jpg").read_bytes() for i in range(1, 9)]

    def send(data):
        return requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/jpeg", **FRESH},
                             timeout=120)

    with ThreadPoolExecutor(8) as pool:
        codes = [r.status_code for r in pool.map(send, photos * 3)]
    assert set(codes) == {200}
    det = serve.get_deployment_handle("TextDetector", app_name="ocr")
    n = serve.status().applications["ocr"].deployments["TextDetector"].replica_states.get("RUNNING", 1)
    batches = [b for st in replica_stats(det, n).values() for b in st["recent_batches"]]
    assert max(b["requests"] for b in batches) == 2, batches[-10:]


def detector_images_since(seqs: dict) -> int:
    """Images the detector replicas ran since `seqs` (pid -> last batch seq
    seen; filled in for replicas not seen before)."""
    from ray import serve

    from harness.service import replica_stats

    det = serve.get_deployment_handle("TextDetector", app_name="ocr")
    n = replicas("TextDetector").get("RUNNING", 1)
    total = 0
    for pid, st in replica_stats(det, n).items():
        last = seqs.get(pid, 0)
        total += sum(b["items"] for b in st["recent_batches"] if b["seq"] > last)
        seqs[pid] = max([last] + [b["seq"] for b in st["recent_batches"]])
    return total


def test_identical_uploads_cost_one_pipeline_run_then_hit_the_cache(service):
    from ray import serve

    url = service
    data = (PEER / "paddleocr_00018069.jpg").read_bytes()  # sent nowhere else in this module
    seqs: dict = {}
    detector_images_since(seqs)
    gate = threading.Barrier(8)

    def send(_):
        gate.wait()
        return requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/jpeg"}, timeout=120)

    with ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(send, range(8)))
    assert [r.status_code for r in burst] == [200] * 8
    marks = sorted(r.headers["X-Cache"] for r in burst)
    assert marks.count("miss") == 1 and set(marks) <= {"miss", "shared", "hit"}, marks
    assert len({str(r.json()["results"]) for r in burst}) == 1 and len(burst[0].json()["results"]) > 5
    assert len({r.json()["request_id"] for r in burst}) == 8  # each its own request id
    again = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/jpeg", "X-Request-ID": "mine"},
                          timeout=120)
    assert again.headers["X-Cache"] == "hit" and again.json()["request_id"] == "mine"
    assert again.json()["results"] == burst[0].json()["results"]
    by_handle = serve.get_app_handle("ocr").ocr.remote(data).result()
    assert by_handle["cache"] == "hit" and by_handle["results"] == burst[0].json()["results"]
    assert detector_images_since(seqs) == 1  # ten answers, one pipeline run


def test_golden_image_reads_exactly(engine):
    """The canary's golden input through the real models, in process: one
    line, on the word, reading GOLDEN_TEXT (what every replica checks)."""
    import numpy as np

    from serve_app.serving.canary import GOLDEN_TEXT, check_boxes, golden_image

    lines = engine.read(golden_image()).lines
    assert [line.text for line in lines] == [GOLDEN_TEXT]
    assert check_boxes(np.array([lines[0].box])).ok


def test_a_recognizer_that_misreads_the_canary_is_replaced_while_the_service_answers(service):
    """The test hook makes one recogniser replica's predictor misread; its
    canary fails within a health-check period, Serve replaces it, and
    requests sent meanwhile are all answered."""
    from harness.service import replica_stats
    from harness.service import replica_pids
    from ray import serve

    url = service
    data = (PEER / "rapidocr_issue_170.png").read_bytes()
    stop = threading.Event()
    codes: list[int] = []

    def client():
        while not stop.is_set():
            r = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/png", **FRESH},
                              timeout=120)
            codes.append(r.status_code)

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        FAULT_FILE.write_text("")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and FAULT_FILE.exists():
            time.sleep(0.2)
        claimed = list(FAULT_FILE.parent.glob("rec-fault.claimed.*"))
        assert len(claimed) == 1, "no recogniser replica took the fault"
        faulty = int(claimed[0].name.rsplit(".", 1)[1])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pids = replica_pids(["TextRecognizer"]).get("TextRecognizer", [])
            if pids and faulty not in pids and rec_replicas().get("RUNNING", 0) >= 1:
                break
            time.sleep(0.5)
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert faulty not in replica_pids(["TextRecognizer"]).get("TextRecognizer", []), "not replaced"
    assert codes and set(codes) == {200}, codes
    rec = serve.get_deployment_handle("TextRecognizer", app_name="ocr")
    for st in replica_stats(rec, rec_replicas().get("RUNNING", 1)).values():
        assert st["canary"]["failures"] == 0 and st["canary"]["last"]["ok"], st["canary"]
    r = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/png", **FRESH}, timeout=120)
    assert [x["text"] for x in r.json()["results"]] == ["TEST"]
