"""The service on deployments.redis.yaml (the cluster profile: jobs.backend:
redis, two JobStore replicas), here on one machine, against a real redis-server (the `redis_server` fixture,
appendonly yes, appendfsync always): jobs through real HTTP, one store
replica killed with jobs queued and running on it, every accepted job
succeeds with the engine's text; each client's results within its share;
a document job's signed callback (retried with its id) and its pages
streamed, from the shared book."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from standardwebhooks import Webhook

from harness.jobs import submit_job, wait_jobs
from harness.pdfs import text_pdf
from harness.peer import PEER
from harness.webhooks import SECRET, Receiver
from harness.service import REPO, deploy_config, free_port, load_config, start_ray, stop_all

IMAGES = ["rapidocr_issue_170.png", "rapidocr_ch_en_num.jpg", "mmocr_word_1036169.jpg",
          "rapidocr_two_dim_image_LA.png", "mmocr_icdar15_img_2.jpg"]
LEASE_S = 5


@pytest.fixture(scope="module")
def service(redis_server):
    redis_server.flush()
    start_ray()
    cfg = load_config(REPO / "deployments.redis.yaml")
    app = cfg["applications"][0]
    app["args"]["jobs"] = {**app["args"]["jobs"], "lease_s": LEASE_S, "concurrency": 2,
                           "callbacks": {"allow": ["127.0.0.0/8"], "retry_s": [0.5] * 100}}
    app["args"]["lanes"] = {"bulk_max_wait_s": 120}
    # The cluster profile on one machine: Serve listens on 127.0.0.1 here (the
    # harness's http_options), so the book is tested without the profile's token.
    app["args"]["ingress"] = {k: v for k, v in app["args"]["ingress"].items() if k != "auth_token_env"}
    for d in app["deployments"]:
        if d["name"] == "JobStore":  # the URL where the store replicas run (as docs/jobs.md says)
            d["ray_actor_options"] = {**d.get("ray_actor_options", {}),
                                      "runtime_env": {"env_vars": {"OCR_REDIS_URL": redis_server.url,
                                                                   "OCR_WEBHOOK_SECRET": SECRET}}}
    try:
        yield deploy_config(cfg, free_port())
    finally:
        stop_all(graceful=False)


@pytest.fixture(scope="module")
def engine_texts(engine):
    return {n: [l.to_dict() for l in engine.read(PEER / n).lines] for n in IMAGES}


def test_two_store_replicas_share_the_book_and_a_killed_one_loses_no_job(service, engine_texts, redis_server):
    import ray
    import redis

    url = service
    stores = [a for a in ray.util.list_named_actors(all_namespaces=True) if "#JobStore#" in a["name"]]
    assert len(stores) == 2, stores
    names = [IMAGES[i % len(IMAGES)] for i in range(20)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: submit_job(url, n), names))
    assert [a.status_code for a in answers] == [202] * 20
    ids = [a.json()["job_id"] for a in answers]
    # Jobs run on both replicas (each claims from the one book): wait until
    # both hold a lease, then kill one of them with its jobs in flight.
    r = redis.Redis.from_url(redis_server.url)
    owners: set = set()
    deadline = time.monotonic() + 300
    while len(owners) < 2 and time.monotonic() < deadline:
        owners = {r.hget(f"ocr:{{ocr}}:job:{j}", "owner") for j in ids} - {None}
        time.sleep(0.1)
    assert len(owners) == 2, owners
    ray.kill(ray.get_actor(stores[0]["name"], namespace=stores[0]["namespace"]), no_restart=True)
    done = wait_jobs(url, ids)
    assert len(done) == 20
    for name, job_id in zip(names, ids):
        assert done[job_id]["status"] == "succeeded", done[job_id]
        assert done[job_id]["results"] == engine_texts[name]
    claims = [int(r.hget(f"ocr:{{ocr}}:job:{j}", "claims")) for j in ids]
    assert max(claims) >= 2  # some job the killed replica held ran again on the other
    r.close()


def test_an_idempotency_key_gives_one_job_across_replicas(service):
    url = service
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: submit_job(url, "rapidocr_issue_170.png", **{"Idempotency-Key": "same"}),
                                range(8)))
    assert {a.status_code for a in answers} == {202}
    assert len({a.json()["job_id"] for a in answers}) == 1


def test_a_document_jobs_callback_and_pages_come_from_the_shared_book(service):
    url = service
    pdf = text_pdf([[f"Redis page {n}"] for n in range(1, 4)], size_pt=(400, 200))
    with Receiver(answers=(500,)) as hook:
        r = requests.post(f"{url}/v1/ocr/jobs", params={"callback_url": hook.url}, data=pdf,
                          headers={"Content-Type": "application/pdf"}, timeout=60)
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        with requests.get(f"{url}/v1/ocr/jobs/{job}/pages", stream=True, timeout=600) as stream:
            pages = [json.loads(line) for line in stream.iter_lines()]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            view = requests.get(f"{url}/v1/ocr/jobs/{job}", timeout=30).json()
            if view.get("callback", {}).get("state") == "delivered":
                break
            time.sleep(0.2)
        events = list(hook.events)
    assert [p["page"] for p in pages] == [1, 2, 3] and pages == view["pages"]
    assert "Redis page 2" in " ".join(x["text"] for x in pages[1]["results"])
    assert len(events) == 2 and {h["webhook-id"] for h, _, _ in events} == {f"msg_{job}"}
    assert Webhook(SECRET).verify(events[1][1], events[1][0])["data"]["job_id"] == job
    assert view["callback"]["state"] == "delivered" and view["callback"]["attempts"] == 2
