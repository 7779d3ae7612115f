"""Jobs that report back, and fair dispatch (issue 48), over the real
service (deployments.yaml, its SQLite journal, a book of 100 jobs with the
default client share 0.1): signed callbacks to a real receiver on
127.0.0.1 in this process (harness/webhooks.py; allowed by
jobs.callbacks.allow), their retries, a delivery pending across a restart
of the JobStore, refused targets; an 8-page PDF's pages streamed as they
are read, with progress; one client's backlog and another client's job.
One service for the module; callback retry pauses of 0.5 s."""

from __future__ import annotations

import base64
import json
import statistics
import threading
import time

import pytest
import requests
from standardwebhooks import Webhook

from harness.jobs import wait_jobs
from harness.pdfs import text_pdf
from harness.peer import PEER
from harness.service import deploy_config, free_port, load_config, start_ray, stop_all
from harness.webhooks import SECRET, Receiver
from harness.stall import SourceAddressAdapter

WORD = "mmocr_word_1036169.jpg"
CALLBACKS = {"allow": ["127.0.0.0/8"], "retry_s": [0.5] * 600, "timeout_s": 5.0}


@pytest.fixture(scope="module")
def service():
    start_ray()
    cfg = load_config()
    app = cfg["applications"][0]
    app["runtime_env"] = {"env_vars": {"OCR_WEBHOOK_SECRET": SECRET}}
    app["args"]["jobs"] = {**app["args"]["jobs"], "callbacks": CALLBACKS, "capacity": 100}
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


def other_client() -> requests.Session:
    s = requests.Session()
    s.mount("http://", SourceAddressAdapter("127.0.0.2"))
    return s


def test_an_8_page_pdf_streams_its_pages_in_order_as_they_are_read_with_progress(service):
    url = service
    pages = [[f"Page {n} alpha", f"Line two of {n}", "The quick brown fox"] for n in range(1, 9)]
    pdf = text_pdf(pages, size_pt=(500, 300), font_pt=22)
    job = requests.post(f"{url}/v1/ocr/jobs", data=pdf, headers={"Content-Type": "application/pdf"},
                        timeout=60).json()["job_id"]
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(status(url, job))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    arrivals, lines = [], []
    with requests.get(f"{url}/v1/ocr/jobs/{job}/pages", stream=True, timeout=600) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        for line in r.iter_lines():
            arrivals.append(time.time())
            lines.append(json.loads(line))
    stop.set()
    watcher.join()
    done = status(url, job)
    texts = [" ".join(x["text"] for x in page["results"]) for page in lines]
    print(f"\n8-page PDF: job ran {done['finished_at'] - done['started_at']:.1f} s; lines arrived "
          f"{[round(t - done['started_at'], 1) for t in arrivals]} s after it started; "
          f"progress seen {sorted({json.dumps(v['progress']) for v in seen if 'progress' in v})}")
    assert [page["page"] for page in lines] == list(range(1, 9)) and done["status"] == "succeeded"
    assert all(f"Page {n} alpha" in t for n, t in zip(range(1, 9), texts)), texts
    assert lines == done["pages"]  # each line is the page as the result holds it
    ran = done["finished_at"] - done["started_at"]
    assert arrivals[0] < done["finished_at"] - 0.2 * ran  # the first page well before the job ended
    running = [v["progress"] for v in seen if v.get("status") == "running" and "progress" in v]
    assert running and all(p["pages"] == 8 for p in running) and any(0 < p["done"] < 8 for p in running)
    tail = requests.get(f"{url}/v1/ocr/jobs/{job}/pages", params={"from": 6}, timeout=60)
    assert [json.loads(x)["page"] for x in tail.text.splitlines()] == [6, 7, 8]


def test_a_lone_clients_backlog_fills_the_book_and_another_clients_job_starts_next(service):
    """Client A (127.0.0.1) alone queues 24 3-page PDF jobs, more than its
    share (0.1 of 100) since nobody else waits; client B (127.0.0.2) sends a
    word: no job of A's starts between B's submit and B's job's start, and
    B's job ends long before A's backlog."""
    url = service
    pdf = text_pdf([[f"Backlog page {n}", "Some more words here"] for n in range(1, 4)], size_pt=(500, 300))
    backlog = [requests.post(f"{url}/v1/ocr/jobs", data=pdf, headers={"Content-Type": "application/pdf"},
                             timeout=60) for _ in range(24)]
    assert [r.status_code for r in backlog] == [202] * 24, [r.text for r in backlog if r.status_code != 202][:1]
    ids = [r.json()["job_id"] for r in backlog]
    until(lambda: sum(status(url, i)["status"] == "running" for i in ids[:12]) >= 1)
    b = other_client()
    mine = b.post(f"{url}/v1/ocr/jobs", data=(PEER / WORD).read_bytes(), headers={"Content-Type": "image/jpeg"},
                  timeout=60)
    accepted_at = time.time()  # (same machine clock as the store's) the job is in the queue by its 202
    assert mine.status_code == 202, mine.text
    job = mine.json()["job_id"]
    over = requests.post(f"{url}/v1/ocr/jobs", data=pdf, headers={"Content-Type": "application/pdf"}, timeout=60)
    mine_done = wait_jobs(url, [job])[job]
    done = wait_jobs(url, ids)
    overtook = [i for i in ids if accepted_at < done[i]["started_at"] < mine_done["started_at"]]
    after = sum(done[i]["finished_at"] > mine_done["finished_at"] for i in ids)
    a_job_s = statistics.median(done[i]["finished_at"] - done[i]["started_at"] for i in ids)
    b_total_s = mine_done["finished_at"] - mine_done["created_at"]
    print(f"\nbacklog of 24: B's job waited {mine_done['started_at'] - mine_done['created_at']:.2f} s, "
          f"ran {mine_done['finished_at'] - mine_done['started_at']:.2f} s; A's jobs ran {a_job_s:.2f} s (median), "
          f"the backlog took {max(v['finished_at'] for v in done.values()) - min(v['created_at'] for v in done.values()):.1f} s; "
          f"{after} of A's jobs ended after B's; A's next submit while B waited: {over.status_code}")
    assert mine_done["status"] == "succeeded" and mine_done["results"][0]["text"]
    assert overtook == []  # B's job was the next one started
    assert after >= 8 and b_total_s <= 3 * a_job_s  # not behind the backlog: within the time of a few jobs
    assert all(done[i]["status"] == "succeeded" for i in ids)
