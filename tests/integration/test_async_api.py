"""Non-blocking submits from another Ray job, HTTP jobs, back-pressure and
deadlines."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from harness.jobs import submit_job, wait_jobs
from harness.peer import PEER
from harness.service import deploy_config, free_port, load_config, start_ray, stop_all, wait_ready

IMAGES = ["rapidocr_issue_170.png", "rapidocr_ch_en_num.jpg", "rapidocr_test_without_det.jpg",
          "mmocr_word_1036169.jpg", "rapidocr_two_dim_image_LA.png", "rapidocr_black_font_color_transparent.png",
          "mmocr_icdar15_img_2.jpg", "paddleocr_00018069.jpg"]
JOB_TTL_S = 20


@pytest.fixture(scope="module")
def service():
    start_ray()
    cfg = load_config()
    args = cfg["applications"][0]["args"]
    args["ingress"] = {"max_in_flight": 3, "retry_after_s": 2}
    # One client sends every job here (this module tests durability and lanes,
    # not shares: tests/integration/test_fair_shares.py does): its share is the
    # whole book, as an operator with one batch client would set it.
    args["jobs"] = {**args["jobs"], "ttl_s": JOB_TTL_S, "capacity": 150, "concurrency": 4, "client_share": 1.0}
    # Lanes: no aging within a test (a slow shared machine must not promote
    # bulk jobs mid-test); bulk sync requests get 2 of the 3 ingress slots.
    args["lanes"] = {"bulk_max_wait_s": 120, "bulk_max_in_flight": 2}
    assert args["jobs"]["journal"]  # a fresh file per run (harness.service.load_config)
    try:
        yield deploy_config(cfg, free_port())
    finally:
        stop_all(graceful=False)  # the cluster goes with ray.shutdown(): no ~10-40 s Serve drain


@pytest.fixture(scope="module")
def engine_texts(engine):  # the session's engine: each engine made in this process keeps ~1 GB
    return {n: [l.to_dict() for l in engine.read(PEER / n).lines] for n in IMAGES}


def test_another_ray_job_submits_64_without_blocking(service, engine_texts):
    import ray

    names = [IMAGES[i % len(IMAGES)] for i in range(64)]
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("handle_driver.py")), ray.get_runtime_context().gcs_address,
         *[str(PEER / n) for n in names]],
        capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["submitted_s"] < report["first_result_s"], report
    assert report["results"] == [engine_texts[n] for n in names]
    assert {int(k): v for k, v in report["mapped"].items()} == {i: engine_texts[names[i]] for i in range(8)}


def test_100_concurrent_jobs_all_succeed_then_expire(service, engine_texts):
    url = service
    names = [IMAGES[i % len(IMAGES)] for i in range(100)]
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda n: submit_job(url, n), names))
    assert [a.status_code for a in answers] == [202] * 100
    ids = [a.json()["job_id"] for a in answers]
    assert all(a.headers["location"] == f"/v1/ocr/jobs/{i}" for a, i in zip(answers, ids))
    done = wait_jobs(url, ids)
    assert len(done) == 100
    for name, job_id in zip(names, ids):
        assert done[job_id]["status"] == "succeeded", done[job_id]
        assert done[job_id]["results"] == engine_texts[name]
    # Expiry: the first job, finished earliest, is gone JOB_TTL_S after it finished (polled in explicit
    # steps, at most JOB_TTL_S + 30 s: not a fixed sleep of the whole TTL after the last job).
    deadline = time.monotonic() + JOB_TTL_S + 30
    while (code := requests.get(f"{url}/v1/ocr/jobs/{ids[0]}", timeout=30).status_code) == 200:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert code == 404
    assert requests.get(f"{url}/v1/ocr/jobs/no-such-job", timeout=30).json()["error"]["code"] == "not_found"


def test_idempotency_key_returns_the_same_job(service):
    url = service
    a = submit_job(url, "rapidocr_issue_170.png", **{"Idempotency-Key": "abc-1"}).json()
    b = submit_job(url, "rapidocr_issue_170.png", **{"Idempotency-Key": "abc-1"}).json()
    c = submit_job(url, "rapidocr_issue_170.png", **{"Idempotency-Key": "abc-2"}).json()
    assert a["job_id"] == b["job_id"] != c["job_id"]


def test_killing_the_ingress_loses_no_accepted_job(service, engine_texts):
    import ray

    url = service
    names = [IMAGES[i % len(IMAGES)] for i in range(30)]
    ids = [submit_job(url, n).json()["job_id"] for n in names]
    ingress = [a for a in ray.util.list_named_actors(all_namespaces=True) if "OcrIngress" in a["name"]]
    assert len(ingress) == 1, ingress
    ray.kill(ray.get_actor(ingress[0]["name"], namespace=ingress[0]["namespace"]), no_restart=True)
    wait_ready(url, 180)  # Serve starts a new ingress replica
    done = wait_jobs(url, ids)
    assert len(done) == 30
    for name, job_id in zip(names, ids):
        assert done[job_id]["status"] == "succeeded" and done[job_id]["results"] == engine_texts[name]


def test_killing_the_job_store_loses_no_accepted_job(service, engine_texts):
    """The store's own replica dies with jobs queued and running: the new one
    reads the journal, runs the unfinished jobs again, keeps the finished
    ones' results; every job accepted before the kill succeeds."""
    import ray

    url = service
    first = [IMAGES[i % len(IMAGES)] for i in range(4)]
    first_ids = [submit_job(url, n).json()["job_id"] for n in first]
    assert len(wait_jobs(url, first_ids)) == 4
    names = [IMAGES[i % len(IMAGES)] for i in range(24)]
    ids = [submit_job(url, n).json()["job_id"] for n in names]
    assert requests.get(f"{url}/v1/ocr/jobs/{ids[-1]}", timeout=30).json()["status"] in ("queued", "running")
    store = [a for a in ray.util.list_named_actors(all_namespaces=True) if "#JobStore#" in a["name"]]
    assert len(store) == 1, store
    ray.kill(ray.get_actor(store[0]["name"], namespace=store[0]["namespace"]), no_restart=True)
    done = wait_jobs(url, first_ids + ids)
    assert len(done) == 28
    for name, job_id in zip(first + names, first_ids + ids):
        assert done[job_id]["status"] == "succeeded" and done[job_id]["results"] == engine_texts[name]


def test_excess_sync_requests_get_503_with_retry_after_and_none_hangs(service, engine_texts):
    url = service
    name = "paddleocr_00018069.jpg"  # dense: each request takes a while

    def post(_):
        t = time.monotonic()
        r = requests.post(f"{url}/v1/ocr", data=(PEER / name).read_bytes(),
                          headers={"Content-Type": "image/jpeg"}, timeout=300)
        return r, time.monotonic() - t

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(post, range(12)))
    codes = [r.status_code for r, _ in answers]
    assert set(codes) == {200, 503}, codes
    for r, _ in answers:
        if r.status_code == 503:
            assert r.headers["retry-after"] == "2"
            assert r.json()["error"]["code"] == "overloaded"
        else:
            assert r.json()["results"] == engine_texts[name]


def test_deadline_passed_gives_504(service):
    url = service
    r = requests.post(f"{url}/v1/ocr", data=(PEER / "paddleocr_00018069.jpg").read_bytes(),
                      headers={"Content-Type": "image/jpeg", "X-Request-Timeout": "0.05"}, timeout=60)
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "deadline_exceeded"
    bad = requests.post(f"{url}/v1/ocr", data=b"x", headers={"Content-Type": "image/jpeg", "X-Request-Timeout": "soon"},
                        timeout=60)
    assert bad.status_code == 400


def test_interactive_work_goes_ahead_of_bulk_jobs_queued_before_it(service, engine_texts):
    """Priority lanes: jobs are bulk by default; an interactive job
    (X-Priority: interactive) submitted behind 16 of them is run by the next
    free worker (4 run at once here): every bulk job still queued after its
    202 starts after it (FIFO: each of them would start before it). Sync
    requests (interactive by default, or bulk by header) read the same text;
    a bad X-Priority is a 400; every bulk job still succeeds.

    The order is read from the jobs' `started_at` (when a worker took each),
    not from which finished first: with 4 workers, a bulk job taken just after
    the urgent one may finish before it (seen in CI: the word took longer than
    a page started after it), and a poll pass decides what a poll sees first."""
    url = service
    heavy = ["rapidocr_black_font_color_transparent.png", "mmocr_icdar15_img_2.jpg", "paddleocr_00018069.jpg"]
    names = [heavy[i % len(heavy)] for i in range(16)]
    bulk = [submit_job(url, n).json()["job_id"] for n in names]
    urgent_name = "mmocr_word_1036169.jpg"
    urgent = submit_job(url, urgent_name, **{"X-Priority": "interactive"}).json()["job_id"]

    def status(job_id: str) -> dict:
        return requests.get(f"{url}/v1/ocr/jobs/{job_id}", timeout=30).json()

    # Queued now, so queued when the urgent job was accepted (statuses only move forward).
    queued = [b for b in bulk if status(b)["status"] == "queued"]
    deadline = time.monotonic() + 300
    while (body := status(urgent))["status"] not in ("succeeded", "failed") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert body["status"] == "succeeded" and body["results"] == engine_texts[urgent_name], body
    for header in ({}, {"X-Priority": "bulk"}):
        r = requests.post(f"{url}/v1/ocr", data=(PEER / urgent_name).read_bytes(),
                          headers={"Content-Type": "image/jpeg", **header}, timeout=120)
        assert r.status_code == 200 and r.json()["results"] == engine_texts[urgent_name], (header, r.text)
    bad = requests.post(f"{url}/v1/ocr", data=(PEER / urgent_name).read_bytes(),
                        headers={"Content-Type": "image/jpeg", "X-Priority": "asap"}, timeout=60)
    assert bad.status_code == 400 and "X-Priority" in bad.json()["error"]["message"]
    done = wait_jobs(url, bulk)
    assert len(done) == 16
    for name, job_id in zip(names, bulk):
        assert done[job_id]["status"] == "succeeded" and done[job_id]["results"] == engine_texts[name]
    started_before = [b for b in queued if done[b]["started_at"] < body["started_at"]]
    assert len(queued) >= 4 and not started_before, (len(queued), started_before)
    for view in [body, *done.values()]:  # each job's times are in order
        assert view["created_at"] <= view["started_at"] <= view["finished_at"], view
