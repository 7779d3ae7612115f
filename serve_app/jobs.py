"""Asynchronous OCR jobs. The store is its own deployment (one replica), not
the ingress: an ingress restart loses no job, and the store runs the jobs
itself, through the pipeline handle. With a journal (`jobs.journal`, a
SQLite file) a restart of the store itself loses none either: the new
replica reads the file, runs the unfinished jobs again and keeps serving the
finished ones' results."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

from ray import serve
from ray.serve.handle import DeploymentHandle

from .errors import OcrError, Overloaded
from .job_journal import JobJournal
from .settings import JobArgs

log = logging.getLogger("ray.serve")


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


# One replica, always: the store holds the jobs (a second replica would not
# see the first one's). Its resources are in the Serve config file.
@serve.deployment(name="JobStore", num_replicas=1)
class JobStore:
    ATTEMPTS = 4

    def __init__(self, pipeline: DeploymentHandle, args: JobArgs):
        self.pipeline = pipeline
        self.args = args
        self.jobs: "OrderedDict[str, Job]" = OrderedDict()
        self.by_key: dict[str, str] = {}
        self.queue: asyncio.Queue = asyncio.Queue()
        self.workers: list[asyncio.Task] = []
        self.journal: Optional[JobJournal] = None
        # The journal's writes run on one thread of their own, off the event loop.
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-journal")
        if args.journal:
            self.journal = JobJournal(args.journal)
            self._recover(self.journal.load())

    def _recover(self, rows: list[dict]) -> None:
        unfinished = 0
        for r in rows:
            finished = r["status"] in ("succeeded", "failed")
            job = Job(r["job_id"], r["status"] if finished else "queued", r["created"],
                      None if finished else r["image"], r["options"], r["result"], r["error"], r["finished"], r["key"])
            self.jobs[job.job_id] = job
            if job.key:
                self.by_key[job.key] = job.job_id
            if not finished:
                self.queue.put_nowait(job.job_id)
                unfinished += 1
        if rows:
            log.info("job journal %s: %d jobs recovered, %d to run again", self.args.journal, len(rows), unfinished)

    async def _write(self, method: str, *args) -> None:
        """journal.<method>(*args) on the journal's thread; nothing without a journal."""
        if self.journal is not None:
            await asyncio.get_running_loop().run_in_executor(self._io, getattr(self.journal, method), *args)

    async def check_health(self) -> None:
        # Serve calls this every few seconds: after a restart, jobs recovered
        # from the journal start running even if nobody submits or polls.
        self._start_workers()

    def _start_workers(self) -> None:
        # Started on first use, inside the replica's event loop (no work in __init__'s loop-less context).
        if not self.workers:
            self.workers = [asyncio.create_task(self._worker()) for _ in range(self.args.concurrency)]

    async def _expire(self) -> None:
        now = time.time()
        gone = [j.job_id for j in self.jobs.values() if j.finished and now - j.finished > self.args.ttl_s]
        for job_id in gone:
            job = self.jobs.pop(job_id)
            if job.key:
                self.by_key.pop(job.key, None)
        if gone:
            await self._write("delete", gone)

    async def submit(self, image: Any, options: Optional[dict], idempotency_key: Optional[str] = None) -> dict:
        self._start_workers()
        await self._expire()
        if idempotency_key and idempotency_key in self.by_key:
            return self.jobs[self.by_key[idempotency_key]].view()
        if len(self.jobs) >= self.args.capacity:
            raise Overloaded(f"the job store is full ({self.args.capacity} jobs); retry later", retry_after_s=5)
        job = Job(uuid.uuid4().hex, "queued", time.time(), image, options, key=idempotency_key)
        self.jobs[job.job_id] = job
        if idempotency_key:
            self.by_key[idempotency_key] = job.job_id
        try:
            # Accepted only once it is on disk (with a journal).
            await self._write("add", job.job_id, job.created, idempotency_key, options, image)
        except Exception:
            self.jobs.pop(job.job_id, None)
            if idempotency_key:
                self.by_key.pop(idempotency_key, None)
            raise
        self.queue.put_nowait(job.job_id)
        return job.view()

    async def get(self, job_id: str) -> Optional[dict]:
        self._start_workers()
        await self._expire()
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
                # Still "running" only when cancelled (the replica is stopping):
                # then the journal keeps the job as accepted, to run again.
                if job.status != "running":
                    await self._finished(job)

    async def _finished(self, job: Job) -> None:
        job.image = None  # the result is kept, the image is not
        job.finished = time.time()
        try:
            await self._write("finish", job.job_id, job.status, job.result, job.error, job.finished)
        except Exception as e:  # the result is still served from memory
            log.error("job %s: could not write its result to the journal: %r", job.job_id, e)
