"""The job book on Redis (`jobs.backend: redis`): one book shared by several
JobStore replicas on any nodes, no shared file system.

The promises are the sqlite book's (serve_app.jobs.book), kept across
replicas:
- durable before the 202: a submit is one Lua script (atomic) whose reply
  comes after the server has written it to its append-only file; with
  `appendfsync always` (checked at start, jobs.redis_fsync) that write is
  fsynced first;
- each job is claimed under a lease (jobs.lease_s) that its worker renews
  while it runs; a job whose worker died (its replica or node gone) goes
  back to its queue when the lease runs out and runs on another replica; a
  job that has lost max_claims workers fails instead of running again;
- idempotency keys (SET under the script: two replicas never make two jobs
  for one key), lanes (interactive first, bulk by age, bulk never waits
  longer than lanes.bulk_max_wait_s), progress (pages_done), TTL, capacity
  in jobs and image bytes, the per-job result bound and each client's share
  of the result store (the rules of serve_app.jobs.results, here in Lua).

One standalone Redis (or a primary with replicas behind one address): the
scripts name their keys from a prefix rather than passing them as KEYS, and
the client is not a cluster client, so a Redis Cluster is refused at start.
No Ray import: unit-tested against a real redis-server."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from typing import Any, Optional

from serve_app.core.errors import ConfigError, IdempotencyConflict, Overloaded, Unavailable
from serve_app.jobs.book import JOURNAL_RETRY_AFTER_S, JobBook, RunOcr, fingerprint, image_nbytes
from serve_app.jobs.dispatch import JOB_CLIENT
from serve_app.jobs.journal import decode_image, encode_image
from serve_app.jobs.page_stream import finished_page, redis_page_head
from serve_app.jobs.shares import client_limits, over_share_message
from serve_app.jobs.state import Job, JobStatus, is_document_input
from serve_app.core.lanes import BULK
from serve_app.core.request_options import OcrOptions, parse_options
from serve_app.core.app_args import JobArgs, LaneArgs
from serve_app.jobs.book_callbacks import RedisLedger, redis_admit, redis_record
from serve_app.jobs.callbacks import job_ended
from serve_app.jobs.redis_scripts import (_CB_CLAIM, _CB_RECORD, _CLAIM, _EXPIRE, _FINISH, _FORGET_ONE, _PAGE,
                                          _PROGRESS, _RENEW, _SUBMIT, check_fsync)

log = logging.getLogger("ray.serve")


class RedisJobBook(JobBook):
    """JobBook's API (start, submit, get, counts, health, close) over Redis;
    its attempt loop (retries, timeout, result bound) is JobBook's."""

    def __init__(self, run: RunOcr, args: JobArgs, lanes: LaneArgs = LaneArgs(), lane_metrics: Any = None,
                 *, url: str, prefix: str = "ocr:{default}:"):
        super().__init__(run, args.model_copy(update={"journal": None}), lanes, lane_metrics)
        import redis.asyncio as aioredis

        # A burst of calls waits for a free connection (up to 10 s) rather than failing.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=args.concurrency + 64, timeout=10,
            socket_connect_timeout=5, socket_timeout=30, health_check_interval=30)
        self.r = aioredis.Redis(connection_pool=pool)
        self.url_shown = url.split("@")[-1]  # no password in messages
        self.P = prefix
        self.lanes_on = lanes.enabled
        self.bulk_max_wait_s = lanes.bulk_max_wait_s
        self.owner = uuid.uuid4().hex  # this book's workers' name on their leases
        self.share_count = max(1, int(args.max_finished * args.client_share))
        self.share_bytes = max(1, int(args.max_finished_bytes * args.client_share))
        self._submit = self.r.register_script(_SUBMIT)
        self._claim = self.r.register_script(_CLAIM)
        self._renew = self.r.register_script(_RENEW)
        self._progress = self.r.register_script(_PROGRESS)
        self._finish = self.r.register_script(_FINISH)
        self._expire_script = self.r.register_script(_EXPIRE)
        self._forget_one = self.r.register_script(_FORGET_ONE)
        self._cb_claim = self.r.register_script(_CB_CLAIM)
        self._cb_record = self.r.register_script(_CB_RECORD)
        self._page = self.r.register_script(_PAGE)
        self._tasks: set[asyncio.Task] = set()
        self._wake: Optional[asyncio.Event] = None  # set by this replica's submits
        self.redis_error: Optional[str] = None

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> None:
        """Checks the server's AOF policy (jobs.redis_fsync), then starts
        the workers. Jobs another replica left behind are taken up as their
        leases run out."""
        await self.r.ping()
        try:
            cluster = int((await self.r.info("cluster")).get("cluster_enabled", 0))
        except Exception:  # noqa: BLE001  a managed Redis may refuse INFO: it is then taken as standalone
            cluster = 0
        if cluster:
            raise ConfigError(f"the job book's Redis at {self.url_shown} runs in cluster mode, which the book does "
                              "not support (its scripts reach keys the cluster cannot route): point jobs.redis_url_env "
                              "at a standalone Redis, or a primary with replicas behind one address")
        if self.args.redis_fsync != "any":
            try:
                config = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                          for k, v in (await self.r.config_get("append*")).items()}
            except Exception as e:  # noqa: BLE001  a managed Redis may refuse CONFIG
                raise ConfigError(f"the job book's Redis at {self.url_shown} does not answer CONFIG GET ({e}); "
                                  f"check that it runs with appendonly yes and appendfsync always, then set "
                                  f"jobs.redis_fsync: any") from None
            warning = check_fsync(config, self.args.redis_fsync)
            if warning:
                log.warning("%s", warning)
        self._wake = asyncio.Event()
        await self.callbacks.start(RedisLedger(self))
        self.workers = [self._new_worker(i) for i in range(self.args.concurrency)]

    async def health(self) -> None:
        self.replace_dead_workers()
        try:
            await self.r.ping()
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(f"the job book's Redis at {self.url_shown} does not answer: {e!r}") from None

    def close(self) -> None:
        super().close()
        for t in list(self._tasks):
            t.cancel()

    async def aclose(self) -> None:
        self.close()
        await self.callbacks.aclose()
        # Cancelled again each second until every task has ended: Python
        # 3.11's wait_for (and redis-py's timeouts) can swallow a cancellation
        # that lands as their timeout fires, and a worker that then waits on
        # its job would keep a single gather waiting for good (seen: the
        # unit tier hung beside a busy core).
        pending = {*self.workers, *self._tasks}
        while pending:
            _, pending = await asyncio.wait(pending, timeout=1.0)
            for t in pending:
                t.cancel()
        await self.r.aclose()

    # -- the store's API --------------------------------------------------------
    async def submit(self, image: Any, options: OcrOptions, key: Optional[str] = None, client: str = "",
                     callback_url: Optional[str] = None) -> dict:
        self.replace_dead_workers()
        await redis_admit(self, callback_url, client)  # (read first; checked again in the script)
        payload = await asyncio.to_thread(fingerprint, image, options) if key else None
        nbytes = image_nbytes(image)
        lane = self._lane_of(options)
        blob, kind = await asyncio.to_thread(encode_image, image)
        job_id = uuid.uuid4().hex
        created = time.time()
        callback = await redis_record(self, job_id, callback_url, client)  # (its name looked up after the room read)
        document = is_document_input(image)
        try:
            await self._expire_now()
            # Shielded: a submit cancelled meanwhile still learns how it ended
            # (the script is atomic; a job without a key nobody was told of is
            # taken out again).
            call = asyncio.ensure_future(self._submit(args=[
                self.P, job_id, key or "", self.args.capacity, self.args.max_queued_bytes, nbytes, lane,
                repr(created), json.dumps(options.to_dict()), kind, payload or "", client, blob,
                *client_limits(self.args, alone=False), self.args.max_finished, self.args.max_finished_bytes,
                *client_limits(self.args, alone=True), callback, self.args.callbacks.max_pending,
                self.callbacks.per_client(), "" if document is None else str(int(document))]))
            try:
                answer, other = await asyncio.shield(call)
            except asyncio.CancelledError:
                await self._after_cancelled_submit(call, job_id, key)
                raise
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.redis_error = repr(e)
            log.error("job book Redis %s: %r", self.url_shown, e)
            raise Unavailable("the job book cannot be written just now; the job was not accepted, retry",
                              retry_after_s=JOURNAL_RETRY_AFTER_S) from None
        answer = answer.decode()
        if answer == "full":
            self.unfinished = int(other)  # the whole book's, for Retry-After
            raise Overloaded(f"the job store is full ({self.args.capacity} jobs) of unfinished work; retry later",
                             retry_after_s=self._retry_after())
        if answer == "bytes":
            raise Overloaded(f"the job store holds {int(other)} bytes of queued images; retry later",
                             retry_after_s=self._retry_after())
        if answer == "mine":
            mine, held, alone = (int(x) for x in other.decode().split())
            raise Overloaded(over_share_message(self.args, mine, held, bool(alone)),
                             retry_after_s=self._retry_after(mine))
        if answer in ("callbacks", "mycallbacks"):  # (the same messages as the read before)
            mine = int(other) if answer == "mycallbacks" else 0
            self.callbacks.admit(callback_url or "", client, int(other) if answer == "callbacks" else 0, mine)
        if answer == "results":
            oldest = float(other)
            wait = math.ceil(oldest + self.args.ttl_s - time.time()) if oldest else self._retry_after()
            raise Overloaded("the job store's results are full of other clients' results, kept until their "
                             "time to live; retry later", retry_after_s=max(1, min(3600, wait)))
        self.redis_error = None
        if answer == "ok" and self._wake is not None:
            self._wake.set()
        if answer == "dup":
            view = await self.get(other.decode())
            theirs = await self.r.hget(self._job(other.decode()), "fingerprint")
            if theirs is not None and theirs.decode() != (payload or ""):
                raise IdempotencyConflict(
                    f"Idempotency-Key {key!r} was used for another image or other options; "
                    f"use a new key for a new request")
            if view is not None:
                return view
            # The key's job has expired (not yet dropped): the key is free again.
            await self._forget_one(args=[self.P, other.decode()])
            return await self.submit(image, options, key, client, callback_url)
        return Job(job_id=job_id, created=created).view()  # {"job_id", "status": "queued", "created_at"}

    async def _after_cancelled_submit(self, call: asyncio.Future, job_id: str, key: Optional[str]) -> None:
        try:
            answer, _ = await asyncio.shield(call)
        except BaseException:  # noqa: BLE001  not written, or unknown: nothing to undo here
            return
        if answer == b"ok" and not key:
            # Nobody was told its id: as if never accepted. (With a key the
            # client's retry gets it.) It is finished and forgotten at once.
            undo = asyncio.ensure_future(self._undo(job_id))
            try:
                await asyncio.shield(undo)
            except BaseException:  # noqa: BLE001
                pass

    async def _undo(self, job_id: str) -> None:
        await self._finish_job(job_id, JobStatus.FAILED, None,
                               {"code": "cancelled", "message": "the submit was cancelled"}, notify=False)
        await self._forget_one(args=[self.P, job_id])

    async def get(self, job_id: str) -> Optional[dict]:
        job = await self._get_job(job_id)
        return job.view() if job is not None else None

    async def get_raw(self, job_id: str) -> Optional[tuple[dict, Optional[bytes]]]:
        """get's (status fields, stored result bytes), the result not parsed."""
        job = await self._get_job(job_id)
        return job.view_raw() if job is not None else None

    async def _get_job(self, job_id: str) -> Optional[Job]:
        self.replace_dead_workers()
        h, cb = await asyncio.gather(self.r.hgetall(self._job(job_id)), self.r.hget(f"{self.P}cb:{job_id}", "rec"))
        if not h:
            return None
        job = self._from_hash(job_id, h)
        job.callback = json.loads(cb) if cb else None
        if job.status.done and time.time() - (job.finished or 0) > self.args.ttl_s:
            return None  # expired (dropped from the book by the next submit or finish)
        return job

    async def acounts(self) -> dict[str, int]:
        pipe = self.r.pipeline(transaction=False)
        pipe.zcard(self.P + "q:interactive")
        pipe.zcard(self.P + "q:bulk")
        pipe.zcard(self.P + "lease")
        pipe.hmget(self.P + "stats", "succeeded", "failed")
        inter, bulk, running, (ok, failed) = await pipe.execute()
        out = {"queued": inter + bulk, "running": running, "succeeded": int(ok or 0), "failed": int(failed or 0)}
        return {k: v for k, v in out.items() if v}

    # -- internals --------------------------------------------------------------
    def _job(self, job_id: str) -> str:
        return f"{self.P}job:{job_id}"

    def _lane_of(self, options: OcrOptions) -> str:
        return self._lane(Job(job_id="", created=0.0, options=options)) if self.lanes_on else BULK

    def _from_hash(self, job_id: str, h: dict) -> Job:
        g = {k.decode(): v.decode() for k, v in h.items() if k != b"result"}
        job = Job(job_id=job_id, created=float(g.get("created", 0)), status=JobStatus(g["status"]),
                  options=parse_options(json.loads(g["options"])) if g.get("options") else OcrOptions(),
                  key=g.get("key") or None, fingerprint=g.get("fingerprint") or None, client=g.get("client", ""),
                  nbytes=int(g.get("nbytes", 0)),
                  result_json=h[b"result"] if b"result" in h else None,
                  error=json.loads(g["error"]) if g.get("error") else None,
                  started=float(g["started"]) if g.get("started") else None,
                  finished=float(g["finished"]) if g.get("finished") else None)
        if "pages_total" in g:
            job.pages_done, job.pages_total = int(g["pages_done"]), int(g["pages_total"])
        return job

    async def _expire_now(self) -> None:
        await self._expire_script(args=[self.P, repr(time.time()), self.args.ttl_s, self.args.max_finished,
                                        self.args.max_finished_bytes, self.share_count, self.share_bytes])

    async def _expire(self, client: Optional[str] = None) -> None:
        await self._expire_now()

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def _worker(self) -> None:
        """Claims jobs until the store closes. Between claims it waits for a
        submit to this replica, or one second: jobs submitted to other
        replicas, and jobs whose lease ran out, are found within a second.
        The loop also ends on its own once the store has closed: Python
        3.11's wait_for (and redis-py's timeouts) can swallow a cancellation
        that lands as their timeout fires, and the worker would go on."""
        while not self._closed:
            try:
                now = time.time()
                claimed = await self._claim(args=[self.P, repr(now), repr(now + self.args.lease_s),
                                                  self.bulk_max_wait_s if self.lanes_on else 0, self.owner])
                if not claimed:
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=1.0)
                    except asyncio.TimeoutError:
                        pass
                    self._wake.clear()
                    continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001  Redis away: health says so; try again
                self.redis_error = repr(e)
                log.error("job book Redis %s: %r", self.url_shown, e)
                await asyncio.sleep(1.0)
                continue
            job_id, claims = claimed[0].decode(), int(claimed[1])
            try:
                await self._one_claimed(job_id, claims)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closed or (task is not None and task.cancelling()):
                    raise  # the store is stopping: the lease runs out and another replica runs the job
                log.error("job %s: cancelled from below; failed", job_id)
                await self._fail_quietly(job_id, "internal", "internal error; the job was not completed")
            except Exception as e:  # noqa: BLE001
                log.error("job %s: %r", job_id, e)
                await self._fail_quietly(job_id, "internal", "internal error; the job was not completed")

    async def _one_claimed(self, job_id: str, claims: int) -> None:
        h, blob = await asyncio.gather(self.r.hgetall(self._job(job_id)), self.r.get(f"{self.P}img:{job_id}"))
        if not h:
            return
        job = self._from_hash(job_id, h)
        if claims > self.args.max_claims:
            await self._finish_job(job_id, JobStatus.FAILED, None, {
                "code": "internal", "message": f"the job's worker stopped {claims - 1} times before it finished; "
                "it is not run again"})
            return
        if blob is None:
            await self._finish_job(job_id, JobStatus.FAILED, None,
                                   {"code": "internal", "message": "the job's image was lost from the job book"})
            return
        job.image = await asyncio.to_thread(decode_image, blob, h.get(b"kind", b"bytes").decode())
        del blob
        job.start(job.started)  # the claim's time, as the book shows it
        renewer = self._spawn(self._keep_lease(job_id))
        t0 = time.monotonic()
        try:
            await self._run(job)
        finally:
            renewer.cancel()
        if job.status is JobStatus.RUNNING:
            return
        self._job_seconds = (time.monotonic() - t0 if self._job_seconds is None
                             else 0.8 * self._job_seconds + 0.2 * (time.monotonic() - t0))
        await self._finish_job(job_id, job.status, job.result_json, job.error)

    async def _keep_lease(self, job_id: str) -> None:
        while True:
            await asyncio.sleep(self.args.lease_s / 3)
            try:
                if not await self._renew(args=[self.P, job_id, self.owner, repr(time.time() + self.args.lease_s)]):
                    log.warning("job %s: its lease was taken over (this worker was presumed dead)", job_id)
                    return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001  the next renewal may get through
                log.warning("job %s: lease not renewed: %r", job_id, e)

    async def _attempt(self, job: Job) -> dict:
        JOB_CLIENT.set(job.client)  # this attempt's task only (serve_app.jobs.book.job_client)

        def progress(done: int, total: int, pages=()) -> None:
            job.progress(done, total, pages, self.result_limit)  # (encodes the pages; kept here within the bound)
            self._spawn(self._progress(args=[self.P, job.job_id, self.owner, done, total]))
            if pages:  # for GET .../pages on any replica, until the job ends (_FINISH drops them)
                kept = {n: job.page_results[n] for n in (int(p["page"]) for p in pages) if n in job.page_results}
                if kept:
                    self._spawn(self._keep_pages(job.job_id, kept))

        return await self.run(job.image, job.options, progress)

    async def _keep_pages(self, job_id: str, pages: dict[int, bytes]) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(f"{self.P}pg:{job_id}", mapping=pages)
        pipe.expire(f"{self.P}pg:{job_id}", int(self.args.job_timeout_s) + 60)  # (one written as the job ended)
        await pipe.execute()

    async def page(self, job_id: str, number: int) -> Optional[tuple[dict, Optional[bytes]]]:
        status, done, total, blob, document, error = await self._page(args=[self.P, job_id, number])
        if not status:
            return None
        head = redis_page_head(status, done, total, document, error)
        if head["status"] != "succeeded":
            return head, blob or None
        return await finished_page(self.finished_pages, job_id, number, head,
                                   lambda: self.r.hget(self._job(job_id), "result"))

    async def _fail_quietly(self, job_id: str, code: str, message: str) -> None:
        try:
            await self._finish_job(job_id, JobStatus.FAILED, None, {"code": code, "message": message})
        except Exception as e:  # noqa: BLE001  the lease runs out; the job runs again elsewhere
            log.error("job %s: could not be marked failed: %r", job_id, e)

    async def _finish_job(self, job_id: str, status: JobStatus, result_json: Optional[bytes],
                          error: Optional[dict], notify: bool = True) -> None:
        error_json = json.dumps(error) if error else ""
        size = len(result_json or b"") + len(error_json.encode())
        ttl = self.args.ttl_s
        now = time.time()
        rec = await self.r.hget(f"{self.P}cb:{job_id}", "rec") if notify else None
        due = json.dumps(job_ended(json.loads(rec), job_id, status.value, now)) if rec else ""
        await self._finish(args=[self.P, job_id, status.value, result_json or b"", error_json, repr(now), size,
                                 repr(now), ttl, self.args.max_finished, self.args.max_finished_bytes,
                                 self.share_count, self.share_bytes, due])
        if due:
            self.callbacks.wake.set()
