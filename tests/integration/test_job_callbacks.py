"""Jobs that report back (issue 48) over the real service (deployments.yaml,
its SQLite journal): signed callbacks to a real receiver on 127.0.0.1 in
this process (harness/webhooks.py; allowed by jobs.callbacks.allow), their
retries, a delivery pending across a restart of the JobStore, refused
targets. One service for the module; retry pauses of 0.5 s."""

from __future__ import annotations

import base64
import json
import time

import pytest
import requests
from standardwebhooks import Webhook

from harness.jobs import wait_jobs
from harness.peer import PEER
from harness.service import deploy_config, free_port, load_config, start_ray, stop_all
from harness.webhooks import SECRET, Receiver

WORD = "mmocr_word_1036169.jpg"
CALLBACKS = {"allow": ["127.0.0.0/8"], "retry_s": [0.5] * 600, "timeout_s": 5.0}


@pytest.fixture(scope="module")
def service():
    start_ray()
    cfg = load_config()
    app = cfg["applications"][0]
    app["runtime_env"] = {"env_vars": {"OCR_WEBHOOK_SECRET": SECRET}}
    app["args"]["jobs"] = {**app["args"]["jobs"], "callbacks": CALLBACKS, "client_share": 1.0}
    assert app["args"]["jobs"]["journal"]  # a fresh file (harness.service.load_config): it survives the store
    try:
        yield deploy_config(cfg, free_port())
    finally:
        stop_all(graceful=False)


def status(url: str, job_id: str) -> dict:
    r = requests.get(f"{url}/v1/ocr/jobs/{job_id}", timeout=30)
    return r.json() if r.status_code == 200 else {"http": r.status_code}


def until(check, timeout_s: float = 300, step_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(step_s)
    raise TimeoutError(check())


def verified(event) -> dict:
    headers, body, _ = event
    return Webhook(SECRET).verify(body, headers)


def test_each_way_of_naming_a_callback_gets_a_signed_event_and_a_500_is_retried_with_the_same_id(service):
    url = service
    image = (PEER / WORD).read_bytes()
    with Receiver(answers=(500,)) as hook:
        raw = requests.post(f"{url}/v1/ocr/jobs", params={"callback_url": hook.url}, data=image,
                            headers={"Content-Type": "image/jpeg"}, timeout=60)
        as_json = requests.post(f"{url}/v1/ocr/jobs", timeout=60, json={
            "image": {"base64": base64.b64encode(image).decode()}, "callback_url": hook.url})
        form = requests.post(f"{url}/v1/ocr/jobs", files={"file": ("w.jpg", image, "image/jpeg")},
                             data={"callback_url": hook.url}, timeout=60)
        assert [r.status_code for r in (raw, as_json, form)] == [202] * 3, [r.text for r in (raw, as_json, form)]
        ids = [r.json()["job_id"] for r in (raw, as_json, form)]
        done = wait_jobs(url, ids)
        def all_delivered():
            vs = [status(url, i) for i in ids]
            return vs if all(v.get("callback", {}).get("state") == "delivered" for v in vs) else None

        views = until(all_delivered)
        events = list(hook.events)
    bodies = [verified(e) for e in events]  # raises unless signed with the secret
    assert len(events) == 4  # one 500, retried
    by_job = {}
    for (headers, _, _), body in zip(events, bodies):
        assert headers["webhook-id"] == f"msg_{body['data']['job_id']}"
        by_job.setdefault(body["data"]["job_id"], []).append(headers["webhook-id"])
    assert sorted(by_job) == sorted(ids) and sorted(len(v) for v in by_job.values()) == [1, 1, 2]
    for body in bodies:
        job = body["data"]["job_id"]
        assert body["type"] == "job.succeeded" and body["data"]["status"] == "succeeded"
        assert body["data"]["url"] == f"{url}/v1/ocr/jobs/{job}"
        fetched = requests.get(body["data"]["url"], timeout=30).json()  # the result is where the event says
        assert fetched["results"] == done[job]["results"] and fetched["results"][0]["text"]
    retried = [v for v in views if v["callback"]["attempts"] == 2]
    assert len(retried) == 1 and all(v["callback"]["last_status"] == 200 for v in views)


def test_refused_targets_are_400_before_the_job_is_accepted(service):
    url = service
    image = (PEER / WORD).read_bytes()
    for target, reason in [("http://169.254.169.254/latest/meta-data", "link-local"),
                           ("http://10.0.0.1/hook", "private"), ("http://[::ffff:192.168.1.1]/", "private"),
                           ("ftp://example.com/hook", "scheme"), ("http://user:pw@example.com/", "credentials")]:
        r = requests.post(f"{url}/v1/ocr/jobs", params={"callback_url": target}, data=image,
                          headers={"Content-Type": "image/jpeg"}, timeout=60)
        assert r.status_code == 400 and reason in r.json()["error"]["message"], (target, r.text)
    twice = requests.post(f"{url}/v1/ocr/jobs", params={"callback_url": "http://127.0.0.1:9/a"}, timeout=60,
                          files={"file": ("w.jpg", image, "image/jpeg")}, data={"callback_url": "http://127.0.0.1:9/b"})
    assert twice.status_code == 400 and "twice" in twice.json()["error"]["message"]
    sync = requests.post(f"{url}/v1/ocr", timeout=60, json={"image": {"base64": base64.b64encode(image).decode()},
                                                            "callback_url": "http://127.0.0.1:9/a"})
    assert sync.status_code == 400  # a callback is for jobs only


def test_a_delivery_pending_across_a_restart_of_the_store_is_delivered_after_it(service):
    """The receiver is down (its port refuses connections) when the job
    ends; the JobStore's replica is killed; the new one reads the journal
    and, once the receiver is up, delivers the event with the same id."""
    import ray

    url = service
    hook = Receiver()
    r = requests.post(f"{url}/v1/ocr/jobs", params={"callback_url": hook.url}, data=(PEER / WORD).read_bytes(),
                      headers={"Content-Type": "image/jpeg"}, timeout=60)
    job = r.json()["job_id"]
    before = until(lambda: (v := status(url, job)).get("callback", {}).get("attempts", 0) >= 2 and v)
    assert before["status"] == "succeeded" and before["callback"]["state"] == "pending"
    assert before["callback"]["last_error"]
    store = [a for a in ray.util.list_named_actors(all_namespaces=True) if "#JobStore#" in a["name"]]
    assert len(store) == 1, store
    ray.kill(ray.get_actor(store[0]["name"], namespace=store[0]["namespace"]), no_restart=True)
    after = until(lambda: (v := status(url, job)).get("callback") and v)  # the new store answers
    assert after["callback"]["state"] == "pending"
    with hook:
        delivered = until(lambda: (v := status(url, job))["callback"]["state"] == "delivered" and v)
        events = list(hook.events)
    assert len(events) == 1 and verified(events[0])["data"]["job_id"] == job
    assert events[0][0]["webhook-id"] == f"msg_{job}" == delivered["callback"]["webhook_id"]
    print(f"\ncallback across a restart: {before['callback']['attempts']} attempts before the kill, "
          f"{delivered['callback']['attempts']} in all; body {json.loads(events[0][1])}")
