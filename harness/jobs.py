"""The jobs API as a test or a benchmark drives it over HTTP: submit a peer
image, wait for jobs to finish (no pytest)."""

from __future__ import annotations

import time

import requests

from harness.peer import PEER


def submit_job(url: str, name: str, **headers) -> requests.Response:
    """POST the peer image `name` to /v1/ocr/jobs (extra headers as given)."""
    return requests.post(f"{url}/v1/ocr/jobs", data=(PEER / name).read_bytes(),
                         headers={"Content-Type": "application/octet-stream", **headers}, timeout=60)


def wait_jobs(url: str, ids: list[str], timeout_s: float = 600) -> dict[str, dict]:
    """Finished jobs' bodies; a poll answered 503 (the store restarting) is
    polled again, any other error fails."""
    done: dict[str, dict] = {}
    deadline = time.monotonic() + timeout_s
    while len(done) < len(ids) and time.monotonic() < deadline:
        for job_id in ids:
            if job_id not in done:
                r = requests.get(f"{url}/v1/ocr/jobs/{job_id}", timeout=30)
                if r.status_code == 503:
                    break
                assert r.status_code == 200, (r.status_code, r.text)
                if r.json()["status"] in ("succeeded", "failed"):
                    done[job_id] = r.json()
        time.sleep(0.5)
    return done
