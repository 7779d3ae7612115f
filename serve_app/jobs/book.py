"""The job book: accepted jobs, their queue and the workers that run them,
idempotency keys, expiry and capacity, written through to the journal when
there is one. The JobStore deployment (serve_app.jobs.store) is a thin shell over
it; this module has no Ray import, so the state machine is unit-tested on its
own with a stand-in for the pipeline.

What a careless or hostile client can cost is bounded here:
- capacity counts unfinished jobs (queued or running) and the image bytes
  they hold; finished jobs have their own bounds (max_finished results and
  max_finished_bytes of them, counted as stored, a share of each per client:
  serve_app.jobs.results) besides their time to live, so junk that fails at
  once never locks the store and one client cannot evict another's results;
- one client holds at most its share of capacity and queued bytes once
  another client has jobs here, all but one share while alone (503,
  serve_app.jobs.shares); the workers take jobs client by client in turn,
  a newcomer before the client served last (one with nothing running: at
  once, on a place of its own: serve_app.jobs.dispatch);
- one job's result is at most max_result_bytes (else the job fails with
  `result_too_large`);
- an Idempotency-Key stands for one payload (image and options): reused
  with another, it is a 422, never the other payload's job;
- each attempt of a job has a timeout; a worker survives any exception,
  cancellation included, and a dead one is replaced;
- a journal that cannot be written gives 503 with Retry-After, and health
  reports it; recovery streams the file and loads a job's image only when it
  runs."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Optional

from serve_app.core.errors import DeadlineExceeded, IdempotencyConflict, OcrError, Overloaded, Unavailable
from serve_app.jobs import book_callbacks
from serve_app.jobs.callbacks import Callbacks
from serve_app.jobs.journal import JobJournal
from serve_app.jobs.page_stream import FinishedPages, job_page
from serve_app.jobs.results import ALL, ResultShares
from serve_app.jobs.dispatch import JOB_CLIENT, newcomer_place, running, work
from serve_app.jobs.shares import check_room, hold, release, retry_after
from serve_app.jobs.state import Job, JobStatus, encode_result, fingerprint, image_nbytes, result_too_large  # noqa: F401
from serve_app.core.lanes import BULK, LaneQueue, lane_of
from serve_app.core.request_options import OcrOptions
from serve_app.core.app_args import JobArgs, LaneArgs

log = logging.getLogger("ray.serve")

# (image or PDF, options, progress) -> the pipeline's result dict; raises on failure. progress(pages_done,
# pages_total, pages) as a document's pages are read (pages: the dicts of those finished since the last call).
RunOcr = Callable[[Any, OcrOptions, Callable[[int, int], None]], Awaitable[dict]]

JOURNAL_RETRY_AFTER_S = 5


class JobBook:
    # A job whose replica died (or was busy) is tried again after each of
    # these pauses: four attempts in all.
    BACKOFF_S = (2.0, 4.0, 8.0)

    def __init__(self, run: RunOcr, args: JobArgs, lanes: LaneArgs = LaneArgs(), lane_metrics: Any = None):
        self.run = run
        self.args = args
        self.jobs: dict[str, Job] = {}
        # finished jobs, oldest first, by client (their result's JSON bytes)
        self.finished = ResultShares(args.max_finished, args.max_finished_bytes, args.client_share)
        # One result fits its client's share (else it would evict itself at once).
        self.result_limit = min(args.max_result_bytes, self.finished.share_bytes)
        self.by_key: dict[str, str] = {}
        self._keys_pending: dict[str, asyncio.Future] = {}  # keys whose first submit is being written
        self.unfinished = 0
        self.held_bytes = 0  # image bytes of unfinished jobs held in memory
        # each client's unfinished jobs and their image bytes (its share of capacity and max_queued_bytes)
        self.client_unfinished: dict[str, int] = {}
        self.client_held: dict[str, int] = {}
        # Job ids to run: interactive jobs first, bulk ones (the default) by
        # age (serve_app.core.lanes); the lane lives in each job's options.
        self.queue = LaneQueue(lanes.bulk_max_wait_s, lanes.enabled, lane_metrics)
        self.workers: list[asyncio.Task] = []
        self.running: dict[str, int] = {}  # client -> its jobs running (serve_app.jobs.dispatch)
        self.newcomers: set[asyncio.Task] = set()  # jobs of clients that had nothing running, on places of their own
        self.journal: Optional[JobJournal] = JobJournal(args.journal) if args.journal else None
        self.journal_error: Optional[str] = None  # the last journal failure, until a write succeeds
        self._job_seconds: Optional[float] = None  # moving average of a job's time (for Retry-After)
        self._closed = False
        # The journal's reads and writes run on one thread of their own, off the event loop.
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-journal")
        self.callbacks = Callbacks(args.callbacks)  # signed events when a job ends (serve_app.jobs.callbacks)
        self.deliveries: dict[str, dict] = {}  # open deliveries (waiting or pending) by job id
        self.finished_pages = FinishedPages(4 * args.max_result_bytes)  # ended documents' streams

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> None:
        """Recover the journal's jobs (unfinished ones are queued to run
        again), then start the workers. Call once, in the event loop that
        serves the store."""
        if self.journal is not None:
            await self._io_call(self._recover)
        await self.callbacks.start(book_callbacks.JournalLedger(self))
        self.workers = [self._new_worker(i) for i in range(self.args.concurrency)]

    def _new_worker(self, i: int) -> asyncio.Task:
        return asyncio.create_task(self._worker(), name=f"job-worker-{i}")

    def alive(self) -> bool:
        return bool(self.workers) and not any(w.done() for w in self.workers)

    def replace_dead_workers(self) -> int:
        """Start a new worker for each one that has stopped; how many."""
        if self._closed or not self.workers:
            return 0
        dead = [i for i, w in enumerate(self.workers) if w.done()]
        for i in dead:
            w = self.workers[i]
            err = None if w.cancelled() else w.exception()
            log.error("job worker %d stopped (%r); starting a new one", i, err)
            self.workers[i] = self._new_worker(i)
        return len(dead)

    async def health(self) -> None:
        """Raises if the journal cannot be read or its last write failed;
        replaces dead workers on the way."""
        self.replace_dead_workers()
        if self.journal is not None:
            try:
                await self._io_call(self.journal.probe)
            except Exception as e:
                raise RuntimeError(f"the job journal {self.args.journal} cannot be read: {e!r}") from None
            if self.journal_error is not None:
                raise RuntimeError(f"the job journal {self.args.journal} cannot be written: {self.journal_error}")

    def close(self) -> None:
        """Stop the workers. A job they were running stays accepted in the
        journal and runs again in the next store."""
        self._closed = True
        for w in [*self.workers, *self.newcomers]:
            w.cancel()
        self.callbacks.close()
        self._io.shutdown(wait=False)

    def _recover(self) -> None:
        """On the journal's thread: every job in the file, one row at a
        time, without images (a queued job loads its image when it runs)."""
        n = unfinished = 0
        for job in self.journal.stream():
            n += 1
            job.requeue()
            self.jobs[job.job_id] = job
            if job.key:
                self.by_key[job.key] = job.job_id
            if job.status.done:
                self._keep_finished(job)
            else:
                hold(self, job, +1)
                self.queue.put_nowait(job.job_id, self._lane(job), job.client)
                unfinished += 1
        book_callbacks.recover(self)
        gone = self.finished.to_evict(time.time(), self.args.ttl_s, ALL)  # expired, or the bounds changed since
        for job_id in gone:
            self._forget(job_id)
        if gone:
            self.journal.delete(gone)
        if n:
            log.info("job journal %s: %d jobs recovered, %d to run again", self.args.journal, n, unfinished)

    # -- the store's API --------------------------------------------------------
    @property
    def finished_bytes(self) -> int:
        return self.finished.total_bytes

    async def submit(self, image: Any, options: OcrOptions, key: Optional[str] = None, client: str = "",
                     callback_url: Optional[str] = None) -> dict:
        """A new job's view, or a known key's job's. With callback_url an
        event is sent there when it ends (serve_app.jobs.book_callbacks)."""
        self.replace_dead_workers()
        await self._expire()
        book_callbacks.admit(self, callback_url, client)  # a 400 (no secret, a malformed URL) or 503, at once
        payload = await asyncio.to_thread(fingerprint, image, options) if key else None
        if key:
            while key in self._keys_pending:  # its first submit is being written: wait for its outcome
                await asyncio.shield(self._keys_pending[key])
            if key in self.by_key:
                job = self.jobs[self.by_key[key]]
                if job.fingerprint is not None and job.fingerprint != payload:
                    raise IdempotencyConflict(
                        f"Idempotency-Key {key!r} was used for another image or other options; "
                        f"use a new key for a new request")
                return job.view()
        nbytes = image_nbytes(image)
        check_room(self, client, nbytes)  # serve_app.jobs.shares; the checks and the counts in one step (no await)
        book_callbacks.admit(self, callback_url, client)
        job = Job(job_id=uuid.uuid4().hex, created=time.time(), image=image, options=options, key=key,
                  fingerprint=payload, nbytes=nbytes, client=client)
        book_callbacks.attach(self, job, callback_url)  # counted now; its target resolved below
        hold(self, job, +1)
        pending = asyncio.get_running_loop().create_future() if key else None
        if key:
            self._keys_pending[key] = pending
        try:
            if callback_url:  # (after the room check: a slow name lookup holds no room it has not got)
                await book_callbacks.resolve(self, job)
            write = asyncio.ensure_future(self._write("add", job))
            try:
                # Accepted only once it is on disk (with a journal). Shielded: a submit
                # cancelled meanwhile (its caller went away) still learns how the write ended.
                await asyncio.shield(write)
            except asyncio.CancelledError:
                await self._after_cancelled_add(write, job)
                raise
            except Exception as e:
                self._journal_failed(e)
                raise Unavailable("the job journal cannot be written just now; the job was not accepted, retry",
                                  retry_after_s=JOURNAL_RETRY_AFTER_S) from None
        except BaseException:
            if job.job_id not in self.jobs:  # not accepted after all
                release(self, job)
            raise
        finally:
            if key:
                del self._keys_pending[key]
                pending.set_result(None)
        self.journal_error = None
        self._accept(job)
        return job.view()

    async def _after_cancelled_add(self, write: asyncio.Future, job: Job) -> None:
        """A submit cancelled while its job was being written: nobody was
        told its id. With an Idempotency-Key the client's retry gets this
        job, so it is accepted (it runs once); without one nobody could ever
        read it, so it is taken out of the journal again."""
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            await asyncio.wait([write])
        except Exception:
            pass
        if write.cancelled() or write.exception() is not None:
            return
        if job.key:
            self._accept(job)
            return
        try:
            await asyncio.shield(asyncio.ensure_future(self._write("delete", [job.job_id])))
        except Exception as e:  # noqa: BLE001  it stays in the file: it runs after a restart, unseen
            self._journal_failed(e)

    def _accept(self, job: Job) -> None:
        key = job.key
        self.jobs[job.job_id] = job
        if key:
            self.by_key[key] = job.job_id
        self.queue.put_nowait(job.job_id, self._lane(job), job.client)
        newcomer_place(self, job.client)

    async def get(self, job_id: str) -> Optional[dict]:
        self.replace_dead_workers()
        await self._expire()
        job = self.jobs.get(job_id)
        return job.view() if job else None

    async def get_raw(self, job_id: str) -> Optional[tuple[dict, Optional[bytes]]]:
        """(status fields, stored result bytes), not parsed (Job.view_raw): what HTTP serves."""
        self.replace_dead_workers()
        await self._expire()
        job = self.jobs.get(job_id)
        return job.view_raw() if job else None

    async def acounts(self) -> dict[str, int]:
        return self.counts()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for j in self.jobs.values():
            out[j.status.value] = out.get(j.status.value, 0) + 1
        return out

    # -- internals --------------------------------------------------------------
    @staticmethod
    def _lane(job: Job) -> str:
        """A job's lane: its options' (the store resolves it at submit; a
        job journaled before lanes has none: bulk)."""
        return lane_of(job.options.priority, BULK)

    _retry_after = retry_after  # serve_app.jobs.shares

    def _journal_failed(self, e: BaseException) -> None:
        self.journal_error = repr(e)
        log.error("job journal %s: %r", self.args.journal, e)

    async def _io_call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    async def _write(self, method: str, *args) -> None:
        """journal.<method>(*args) on the journal's thread; nothing without a journal."""
        if self.journal is not None:
            await self._io_call(getattr(self.journal, method), *args)

    def _keep_finished(self, job: Job) -> None:
        self.finished.add(job.job_id, job.client, job.finished or time.time(), job.result_size)

    def _forget(self, job_id: str) -> None:
        job = self.jobs.pop(job_id, None)
        self.finished.remove(job_id)
        if job is not None and job.key and self.by_key.get(job.key) == job_id:
            del self.by_key[job.key]

    async def _expire(self, client: Optional[str] = None) -> None:
        """Finished jobs past their time to live, then (serve_app.jobs.results)
        the oldest of a client over its share, then the biggest holder's
        oldest while the store is over max_finished or max_finished_bytes."""
        gone = self.finished.to_evict(time.time(), self.args.ttl_s, client)
        for job_id in gone:
            self._forget(job_id)
        if gone:
            try:
                await self._write("delete", gone)
            except Exception as e:  # they are gone from memory; the file keeps them until the next expiry
                self._journal_failed(e)

    async def _worker(self) -> None:
        """Runs jobs until the store closes; any exception of one job,
        cancellation from below included, fails or requeues that job only."""
        await work(self)

    async def _one(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.status.done:  # expired before it ran (cannot happen for an unfinished job)
            return
        if job.image is None and self.journal is not None:  # recovered: its image is still on disk
            job.image = await self._io_call(self.journal.image, job.job_id)
            if job.image is None:
                job.fail("internal", "the job's image was lost from the journal")
                await self._finished(job)
                return
        job.start()
        t0 = time.monotonic()
        running(self, job.client, +1)
        try:
            await self._run(job)
        finally:
            running(self, job.client, -1)
            # Still running only when cancelled (the store is stopping):
            # then the journal keeps the job as accepted, to run again.
            if job.status is not JobStatus.RUNNING:
                self._job_seconds = (time.monotonic() - t0 if self._job_seconds is None
                                     else 0.8 * self._job_seconds + 0.2 * (time.monotonic() - t0))
                await self._finished(job)

    async def _fail_safely(self, job_id: str, code: str, message: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None and not job.status.done:
            job.fail(code, message)
            await self._finished(job)

    # An attempt that meets Overloaded (the service is full) is tried again after these pauses (then the
    # last again) or its Retry-After if longer, within jobs.overloaded_wait_s; not one of the four attempts.
    OVERLOADED_BACKOFF_S = (2.0, 4.0, 8.0, 16.0, 32.0, 60.0)

    async def _run(self, job: Job) -> None:
        waited, busy = 0.0, 0
        attempts = enumerate((*self.BACKOFF_S, None), start=1)
        attempt, pause = next(attempts)
        while True:
            outcome = await self._run_once(job, attempt, pause)
            if outcome is None:
                return
            if isinstance(outcome, Overloaded):
                step = max(self.OVERLOADED_BACKOFF_S[min(busy, len(self.OVERLOADED_BACKOFF_S) - 1)],
                           min(60.0, float(getattr(outcome, "retry_after_s", 0) or 0)))
                if waited + step > self.args.overloaded_wait_s:
                    job.fail(Overloaded.code, f"the service stayed overloaded while the job waited {waited:g} s "
                             f"(jobs.overloaded_wait_s): {outcome.message}")
                    return
                busy, waited = busy + 1, waited + step
                log.info("job %s: overloaded; tried again in %g s", job.job_id, step)
                await self._pause(step)
                continue
            nxt = next(attempts, None)
            if nxt is None:
                job.fail("internal", "internal error; the job was not completed")
                return
            attempt, pause = nxt

    async def _pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _run_once(self, job: Job, attempt: int, pause: Optional[float]) -> Any:
        """One attempt: None once the job is decided, the Overloaded it met, or True to try again (paused)."""
        try:
            result = await asyncio.wait_for(self._attempt(job), self.args.job_timeout_s)
        except asyncio.TimeoutError:
            job.fail(DeadlineExceeded.code, f"the job was not done within {self.args.job_timeout_s:g} s")
            return None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed or (task is not None and task.cancelling()):
                raise
            # The call below was cancelled (its replica went away): like a dead replica, retry.
            log.warning("job %s attempt %d was cancelled below", job.job_id, attempt)
        except Exception as e:
            cause = getattr(e, "cause", None) or e  # a Ray task error wraps the replica's exception
            if isinstance(cause, Overloaded):  # full now, not the input's fault: later
                return cause
            if isinstance(cause, OcrError):  # the input's fault: final
                job.fail(cause.code, cause.message)
                return None
            # A replica died or was busy: the job is accepted, so retry.
            log.warning("job %s attempt %d failed: %r", job.job_id, attempt, e)
        else:
            # off the loop: a long document's result is tens of MB of JSON
            blob = await asyncio.to_thread(encode_result, {"request_id": job.job_id, **result})
            if len(blob) > self.result_limit:
                job.fail("result_too_large", result_too_large(len(blob), self.result_limit))
            else:
                job.succeed(blob)
            return None
        if pause is not None:
            await asyncio.sleep(pause)
        return True

    async def _attempt(self, job: Job) -> dict:
        JOB_CLIENT.set(job.client)  # this attempt's task only
        return await self.run(job.image, job.options, lambda d, t, pages=(): job.progress(d, t, pages, self.result_limit))

    async def page(self, job_id: str, number: int) -> Optional[tuple[dict, Optional[bytes]]]:
        """(status fields, page bytes: serve_app.jobs.page_stream.job_page), None for an unknown job."""
        job = self.jobs.get(job_id)
        return None if job is None else await job_page(self.finished_pages, job, number)

    async def _finished(self, job: Job) -> None:
        """Book-keeping of a job that has just finished (its image was dropped)."""
        if job.job_id in self.jobs and job.job_id not in self.finished:
            self._keep_finished(job)
            hold(self, job, -1)
            job.nbytes = 0
            book_callbacks.ended(self, job)
        try:
            await self._write("finish", job)
        except Exception as e:  # the result is still served from memory
            self._journal_failed(e)
            log.error("job %s: could not write its result to the journal: %r", job.job_id, e)
        await self._expire(job.client)  # this client's share, at once (not only at the next submit)
