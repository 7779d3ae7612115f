"""Interactive load tests of the OCR service with Locust (web UI or headless).

Locust is not a dependency of the project; install it into the venv first::

    .venv/bin/pip install locust

then, with the service running (``make serve``: http://127.0.0.1:8000)::

    .venv/bin/locust -f load_tests/locustfile.py --host http://127.0.0.1:8000
    # open http://127.0.0.1:8089, choose users and spawn rate; or headless:
    .venv/bin/locust -f load_tests/locustfile.py --host http://127.0.0.1:8000 \\
        --headless -u 8 -r 2 -t 60s --csv load_tests/out/locust

Each user is one closed-loop client (``wait_time = constant(0)``): it sends
its next image as soon as it has the previous answer, so ``-u N`` is the
``N clients`` of ``load_tests/bench.py``. For roughly open-loop load give
each user a fixed pace instead: ``OCR_PACE_S=2`` (one request per user
every 2 s at most, Locust's ``constant_pacing``).

User classes:

* ``SyncOcrUser``: ``POST /v1/ocr`` with the image (raw body, or multipart
  ``file`` with ``OCR_BODY=multipart``); a 200 without a ``results`` list is
  a failure.
* ``JobOcrUser`` (only with ``OCR_JOBS=1``): ``POST /v1/ocr/jobs`` (202
  ``{job_id}``), then ``GET /v1/ocr/jobs/{id}`` every ``OCR_JOB_POLL_S``
  (default 0.1 s) until ``succeeded``/``failed``; the submit-to-done time is
  reported as a request of type ``JOB`` named ``/v1/ocr/jobs (end to end)``.

Images: every jpg/jpeg/png in ``OCR_IMAGES`` (default ``tests/data/peer``
beside the repository), each user starting at a random one.

For the documented measurements (baselines in the same run, saturation,
batch sizes per stage, cold start) use ``load_tests/bench.py``; this file is
for watching the service live.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from locust import HttpUser, constant, constant_pacing, task

REPO = Path(__file__).resolve().parents[1]
IMAGES_DIR = Path(os.environ.get("OCR_IMAGES", REPO / "tests/data/peer"))
BODY = os.environ.get("OCR_BODY", "raw")
JOB_POLL_S = float(os.environ.get("OCR_JOB_POLL_S", "0.1"))
JOB_TIMEOUT_S = float(os.environ.get("OCR_JOB_TIMEOUT_S", "300"))
REQUEST_TIMEOUT_S = float(os.environ.get("OCR_TIMEOUT_S", "120"))
PACE_S = float(os.environ.get("OCR_PACE_S", "0"))
CTYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}


def load_images(folder: Path) -> list[tuple[str, bytes, str]]:
    if not folder.is_dir():
        raise SystemExit(f"image folder {folder} not found; set OCR_IMAGES")
    out = [(p.name, p.read_bytes(), CTYPES[p.suffix.lower()])
           for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() in CTYPES]
    if not out:
        raise SystemExit(f"no jpg/jpeg/png images in {folder}")
    return out


IMAGES = load_images(IMAGES_DIR)


class _OcrUser(HttpUser):
    abstract = True
    wait_time = constant_pacing(PACE_S) if PACE_S > 0 else constant(0)

    def on_start(self) -> None:
        self.k = random.randrange(len(IMAGES))

    def next_image(self) -> tuple[str, bytes, str]:
        img = IMAGES[self.k % len(IMAGES)]
        self.k += 1
        return img

    def body_kwargs(self, name: str, data: bytes, ctype: str) -> dict:
        if BODY == "multipart":
            return {"files": {"file": (name, data, ctype)}}
        return {"data": data, "headers": {"Content-Type": ctype}}


class SyncOcrUser(_OcrUser):
    @task
    def ocr(self) -> None:
        name, data, ctype = self.next_image()
        with self.client.post("/v1/ocr", name="/v1/ocr", catch_response=True, timeout=REQUEST_TIMEOUT_S,
                              **self.body_kwargs(name, data, ctype)) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            try:
                ok = isinstance(r.json().get("results"), list)
            except ValueError:
                ok = False
            if not ok:
                r.failure("200 without a results list")


class JobOcrUser(_OcrUser):
    # Opt-in: the jobs endpoint is newer than /v1/ocr.
    abstract = os.environ.get("OCR_JOBS") != "1"

    @task
    def ocr_job(self) -> None:
        name, data, ctype = self.next_image()
        t0 = time.perf_counter()
        with self.client.post("/v1/ocr/jobs", name="/v1/ocr/jobs", catch_response=True,
                              timeout=REQUEST_TIMEOUT_S, **self.body_kwargs(name, data, ctype)) as r:
            if r.status_code != 202:
                r.failure(f"HTTP {r.status_code}: {r.text[:200]}")
                return
            job_id = r.json().get("job_id")
            if not job_id:
                r.failure("202 without a job_id")
                return
        error = None
        while True:
            if time.perf_counter() - t0 > JOB_TIMEOUT_S:
                error = TimeoutError(f"job {job_id} not finished in {JOB_TIMEOUT_S:g}s")
                break
            time.sleep(JOB_POLL_S)  # gevent-patched: yields to the other users
            with self.client.get(f"/v1/ocr/jobs/{job_id}", name="/v1/ocr/jobs/{id}", catch_response=True,
                                 timeout=REQUEST_TIMEOUT_S) as g:
                if g.status_code != 200:
                    g.failure(f"HTTP {g.status_code}: {g.text[:200]}")
                    error = RuntimeError(f"poll answered {g.status_code}")
                    break
                status = g.json().get("status")
            if status == "succeeded":
                break
            if status == "failed":
                error = RuntimeError(f"job failed: {g.text[:200]}")
                break
        self.environment.events.request.fire(
            request_type="JOB", name="/v1/ocr/jobs (end to end)",
            response_time=(time.perf_counter() - t0) * 1000.0, response_length=0,
            response=None, context={}, exception=error)
