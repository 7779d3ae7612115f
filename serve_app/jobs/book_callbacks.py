"""The SQLite book's side of job callbacks (serve_app.jobs.callbacks): its
open deliveries in memory (book.deliveries), each state written to the
journal's `callbacks` table, and recovered from it at start. Functions and
a ledger over a JobBook (serve_app.jobs.book); RedisLedger, the Redis
book's (serve_app.jobs.redis_book). No Ray import."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Optional

from serve_app.jobs.callbacks import OPEN, PENDING, WAITING, host_of, job_ended, new_record
from serve_app.jobs.state import Job

RESULT_PATH = "/v1/ocr/jobs/{job_id}"


def result_url(base: str, job_id: str) -> str:
    """Where the event says the result is: the configured public URL
    (jobs.callbacks.public_url, never a request's Host) + the job's path."""
    return base.rstrip("/") + RESULT_PATH.format(job_id=job_id)


def public_url(book: Any) -> str:
    return book.args.callbacks.public_url or DEFAULT_PUBLIC_URL


DEFAULT_PUBLIC_URL = "http://127.0.0.1:8000"  # Serve's default http_options (the store passes the real one)


def attach(book: Any, job: Job, callback_url: Optional[str]) -> None:
    """A new job's delivery, counted in the book's open deliveries (its
    client's share included) from its submit's checks on."""
    if callback_url:
        job.callback = new_record(job.job_id, callback_url, result_url(public_url(book), job.job_id), job.client)
        book.deliveries[job.job_id] = job.callback


async def resolve(book: Any, job: Job) -> None:
    """The new job's target resolved and checked (TargetRefused: 400); its key kept for the per-target bound."""
    job.callback["host"] = await book.callbacks.resolve(job.callback["url"])


def admit(book: Any, callback_url: Optional[str], client: str) -> None:
    """At submit, with no await since the book's counts were read: Callbacks.admit (400 or 503)."""
    if callback_url:
        book.callbacks.admit(callback_url, client, len(book.deliveries), open_of(book, client))


async def redis_admit(book: Any, callback_url: Optional[str], client: str) -> None:
    """The Redis book's admit: the book's and the client's open deliveries read first (one round trip)."""
    if callback_url:
        pipe = book.r.pipeline(transaction=False)
        pipe.scard(book.P + "cbopen")
        pipe.hget(book.P + "cbclient", client)
        pending, mine = await pipe.execute()
        book.callbacks.admit(callback_url, client, int(pending), int(mine or 0))


async def redis_record(book: Any, job_id: str, callback_url: Optional[str], client: str) -> str:
    """The Redis book's new delivery record (JSON; "" without a callback_url), its target resolved and checked."""
    if not callback_url:
        return ""
    target = await book.callbacks.resolve(callback_url)
    return json.dumps(new_record(job_id, callback_url, result_url(public_url(book), job_id), client, target))


def open_of(book: Any, client: str) -> int:
    """`client`'s open deliveries in the book."""
    return sum(1 for rec in book.deliveries.values() if rec.get("client") == client)


def ended(book: Any, job: Job) -> None:
    """A job that has just ended: its waiting delivery becomes due now
    (written with the job's result by journal.finish)."""
    if job.callback is not None and job.callback.get("state") == WAITING:
        job.callback = job_ended(job.callback, job.job_id, job.status.value, job.finished or time.time())
        book.deliveries[job.job_id] = job.callback
        book.callbacks.wake.set()


def recover(book: Any) -> None:
    """On the journal's thread, after the jobs: each delivery back on its job
    and, while open, in book.deliveries; a done one whose job is gone leaves the file."""
    for job_id, rec in book.journal.callbacks():
        job = book.jobs.get(job_id)
        if job is not None and job.status.done and rec.get("state") == WAITING:
            rec = job_ended(rec, job_id, job.status.value, job.finished or time.time())
        if job is not None:
            job.callback = rec
        if rec.get("state") in OPEN and (job is not None or rec.get("state") == PENDING):
            book.deliveries[job_id] = rec
        elif job is None:  # done, or waiting for a job that is gone (it will never end): out of the file
            book.journal.forget_callback(job_id)


class JournalLedger:
    """Deliveries due now, claimed from memory; outcomes kept in memory and the journal."""

    def __init__(self, book: Any):
        self.book = book
        self.sending: set[str] = set()

    async def due(self, now: float, n: int, busy: dict[str, int], per_target: int) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        for job_id, rec in self.book.deliveries.items():
            if len(out) >= n:
                break
            if rec["state"] == PENDING and rec["next_attempt_at"] <= now and job_id not in self.sending:
                host = host_of(rec)
                if busy.get(host, 0) < per_target:
                    busy[host] = busy.get(host, 0) + 1
                    out.append((job_id, rec))
        self.sending.update(job_id for job_id, _ in out)
        return out

    async def record(self, job_id: str, rec: dict) -> None:
        book = self.book
        self.sending.discard(job_id)
        job = book.jobs.get(job_id)
        if job is not None:
            job.callback = rec
        if rec["state"] in OPEN:
            book.deliveries[job_id] = rec
        else:
            book.deliveries.pop(job_id, None)
        try:
            await book._write("callback", job_id, rec, job is not None)
        except Exception as e:  # noqa: BLE001  memory has it; a restart may send it once more
            book._journal_failed(e)


class RedisLedger:
    """Deliveries on the Redis book: due ones claimed by a script (each for
    its attempt's time and 30 s more), outcomes recorded by another."""

    def __init__(self, book: Any):  # a RedisJobBook (serve_app.jobs.redis_book)
        self.book = book

    async def due(self, now: float, n: int, busy: dict[str, int], per_target: int) -> list[tuple[str, dict]]:
        b = self.book
        flat = await b._cb_claim(args=[b.P, repr(now), repr(now + b.args.callbacks.timeout_s + 30), n, 256,
                                       per_target, json.dumps(busy), repr(now + 1.0), uuid.uuid4().hex])
        return [(flat[i].decode(), {**json.loads(flat[i + 1]), CLAIM: flat[i + 2].decode()})
                for i in range(0, len(flat), 3)]

    async def record(self, job_id: str, rec: dict) -> bool:  # False: another replica claimed it since (kept nothing)
        b = self.book
        rec = dict(rec)
        token = rec.pop(CLAIM, "")
        return bool(await b._cb_record(args=[b.P, job_id, json.dumps(rec), rec["state"],
                                             repr(rec.get("next_attempt_at") or 0), token]))


CLAIM = "_claim"  # a claimed delivery's token, carried with its record to its outcome (never stored in it)
