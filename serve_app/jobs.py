"""Asynchronous OCR jobs. The store is its own deployment (one replica), not
the ingress: an ingress restart loses no job, and the store runs the jobs
itself, through the pipeline handle."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve.handle import DeploymentHandle

from .errors import OcrError, Overloaded

log = logging.getLogger("ray.serve")


class JobArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ttl_s: float = Field(3600, gt=0, description="how long a finished job's result is kept")
    capacity: int = Field(1000, ge=1, description="jobs held at once (queued, running or finished)")
    concurrency: int = Field(8, ge=1, description="jobs sent to the pipeline at once")


@dataclass
class Job:
    job_id: str
    status: str  # queued | running | succeeded | failed
    created: float
    image: Any = None
    options: Optional[dict] = None
    result: Optional[dict] = None
    error: Optional[dict] = None
    finished: Optional[float] = None
    key: Optional[str] = None

    def view(self) -> dict:
        out: dict[str, Any] = {"job_id": self.job_id, "status": self.status}
        if self.result is not None:
            out.update(self.result)
        if self.error is not None:
            out["error"] = self.error
        return out


@serve.deployment(name="JobStore", num_replicas=1, ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=1000)
class JobStore:
    ATTEMPTS = 4

    def __init__(self, pipeline: DeploymentHandle, args: JobArgs):
        self.pipeline = pipeline
        self.args = args
        self.jobs: "OrderedDict[str, Job]" = OrderedDict()
        self.by_key: dict[str, str] = {}
        self.queue: asyncio.Queue = asyncio.Queue()
        self.workers: list[asyncio.Task] = []

    def _start_workers(self) -> None:
        # Started on first use, inside the replica's event loop (no work in __init__'s loop-less context).
        if not self.workers:
            self.workers = [asyncio.create_task(self._worker()) for _ in range(self.args.concurrency)]

    def _expire(self) -> None:
        now = time.time()
        for job_id in [j.job_id for j in self.jobs.values() if j.finished and now - j.finished > self.args.ttl_s]:
            job = self.jobs.pop(job_id)
            if job.key:
                self.by_key.pop(job.key, None)

    async def submit(self, image: Any, options: Optional[dict], idempotency_key: Optional[str] = None) -> dict:
        self._start_workers()
        self._expire()
        if idempotency_key and idempotency_key in self.by_key:
            return self.jobs[self.by_key[idempotency_key]].view()
        if len(self.jobs) >= self.args.capacity:
            raise Overloaded(f"the job store is full ({self.args.capacity} jobs); retry later", retry_after_s=5)
        job = Job(uuid.uuid4().hex, "queued", time.time(), image, options, key=idempotency_key)
        self.jobs[job.job_id] = job
        if idempotency_key:
            self.by_key[idempotency_key] = job.job_id
        self.queue.put_nowait(job.job_id)
        return job.view()

    async def get(self, job_id: str) -> Optional[dict]:
        self._start_workers()
        self._expire()
        job = self.jobs.get(job_id)
        return job.view() if job else None

    async def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for j in self.jobs.values():
            out[j.status] = out.get(j.status, 0) + 1
        return out

    async def _worker(self) -> None:
        while True:
            job_id = await self.queue.get()
            job = self.jobs.get(job_id)
            if job is None:
                continue
            job.status = "running"
            try:
                for attempt in range(1, self.ATTEMPTS + 1):
                    try:
                        result = await self.pipeline.ocr.remote(job.image, job.options)
                        job.result = {"request_id": job.job_id, **result}
                        job.status = "succeeded"
                        break
                    except Exception as e:
                        cause = getattr(e, "cause", None) or e
                        if isinstance(cause, OcrError):  # the input's fault: final
                            job.error = {"code": cause.code, "message": cause.message}
                            job.status = "failed"
                            break
                        # A replica died or was busy: the job is accepted, so retry.
                        log.warning("job %s attempt %d failed: %r", job_id, attempt, e)
                        if attempt == self.ATTEMPTS:
                            job.error = {"code": "internal", "message": "internal error; the job was not completed"}
                            job.status = "failed"
                        else:
                            await asyncio.sleep(min(2.0 ** attempt, 10.0))
            finally:
                job.image = None  # the result is kept, the image is not
                job.finished = time.time()
