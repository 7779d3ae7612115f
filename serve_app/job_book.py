"""The job book: accepted jobs, their queue and the workers that run them,
idempotency keys, expiry and capacity, written through to the journal when
there is one. The JobStore deployment (serve_app.jobs) is a thin shell over
it; this module has no Ray import, so the state machine is unit-tested on its
own with a stand-in for the pipeline."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Optional

from .errors import OcrError, Overloaded
from .job_journal import JobJournal
from .job_state import Job, JobStatus
from .options import OcrOptions
from .settings import JobArgs

log = logging.getLogger("ray.serve")

# (image, options) -> the pipeline's result dict; raises on failure.
RunOcr = Callable[[Any, OcrOptions], Awaitable[dict]]


class JobBook:
    # A job whose replica died (or was busy) is tried again after each of
    # these pauses: four attempts in all.
    BACKOFF_S = (2.0, 4.0, 8.0)

    def __init__(self, run: RunOcr, args: JobArgs):
        self.run = run
        self.args = args
        self.jobs: "OrderedDict[str, Job]" = OrderedDict()
        self.by_key: dict[str, str] = {}
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.workers: list[asyncio.Task] = []
        self.journal: Optional[JobJournal] = JobJournal(args.journal) if args.journal else None
        # The journal's reads and writes run on one thread of their own, off the event loop.
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-journal")

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> None:
        """Recover the journal's jobs (unfinished ones are queued to run
        again), then start the workers. Call once, in the event loop that
        serves the store."""
        if self.journal is not None:
            self._recover(await self._io_call(self.journal.load))
        self.workers = [asyncio.create_task(self._worker(), name=f"job-worker-{i}")
                        for i in range(self.args.concurrency)]

    def alive(self) -> bool:
        return bool(self.workers) and not any(w.done() for w in self.workers)

    def close(self) -> None:
        """Stop the workers. A job they were running stays accepted in the
        journal and runs again in the next store."""
        for w in self.workers:
            w.cancel()
        self._io.shutdown(wait=False)

    def _recover(self, jobs: list[Job]) -> None:
        unfinished = 0
        for job in jobs:
            job.requeue()
            self.jobs[job.job_id] = job
            if job.key:
                self.by_key[job.key] = job.job_id
            if not job.status.done:
                self.queue.put_nowait(job.job_id)
                unfinished += 1
        if jobs:
            log.info("job journal %s: %d jobs recovered, %d to run again", self.args.journal, len(jobs), unfinished)

    # -- the store's API --------------------------------------------------------
    async def submit(self, image: Any, options: OcrOptions, key: Optional[str] = None) -> dict:
        await self._expire()
        if key and key in self.by_key:
            return self.jobs[self.by_key[key]].view()
        if len(self.jobs) >= self.args.capacity:
            raise Overloaded(f"the job store is full ({self.args.capacity} jobs); retry later", retry_after_s=5)
        job = Job(job_id=uuid.uuid4().hex, created=time.time(), image=image, options=options, key=key)
        self.jobs[job.job_id] = job
        if key:
            self.by_key[key] = job.job_id
        try:
            # Accepted only once it is on disk (with a journal).
            await self._write("add", job)
        except Exception:
            self.jobs.pop(job.job_id, None)
            if key:
                self.by_key.pop(key, None)
            raise
        self.queue.put_nowait(job.job_id)
        return job.view()

    async def get(self, job_id: str) -> Optional[dict]:
        await self._expire()
        job = self.jobs.get(job_id)
        return job.view() if job else None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for j in self.jobs.values():
            out[j.status.value] = out.get(j.status.value, 0) + 1
        return out

    # -- internals --------------------------------------------------------------
    async def _io_call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    async def _write(self, method: str, *args) -> None:
        """journal.<method>(*args) on the journal's thread; nothing without a journal."""
        if self.journal is not None:
            await self._io_call(getattr(self.journal, method), *args)

    async def _expire(self) -> None:
        now = time.time()
        gone = [j.job_id for j in self.jobs.values() if j.finished and now - j.finished > self.args.ttl_s]
        for job_id in gone:
            job = self.jobs.pop(job_id)
            if job.key:
                self.by_key.pop(job.key, None)
        if gone:
            await self._write("delete", gone)

    async def _worker(self) -> None:
        while True:
            job = self.jobs.get(await self.queue.get())
            if job is None:  # expired before it ran (cannot happen for an unfinished job; kept safe)
                continue
            job.start()
            try:
                await self._run(job)
            finally:
                # Still running only when cancelled (the store is stopping):
                # then the journal keeps the job as accepted, to run again.
                if job.status is not JobStatus.RUNNING:
                    await self._finished(job)

    async def _run(self, job: Job) -> None:
        for attempt, pause in enumerate((*self.BACKOFF_S, None), start=1):
            try:
                result = await self.run(job.image, job.options)
            except Exception as e:
                cause = getattr(e, "cause", None) or e  # a Ray task error wraps the replica's exception
                if isinstance(cause, OcrError):  # the input's fault: final
                    job.fail(cause.code, cause.message)
                    return
                # A replica died or was busy: the job is accepted, so retry.
                log.warning("job %s attempt %d failed: %r", job.job_id, attempt, e)
                if pause is not None:
                    await asyncio.sleep(pause)
            else:
                job.succeed({"request_id": job.job_id, **result})
                return
        job.fail("internal", "internal error; the job was not completed")

    async def _finished(self, job: Job) -> None:
        try:
            await self._write("finish", job)
        except Exception as e:  # the result is still served from memory
            log.error("job %s: could not write its result to the journal: %r", job.job_id, e)
