"""How the job book's workers (serve_app.jobs.book) take jobs: each worker
runs one job after another, any exception of a job failing or requeueing
that job only; and a client with nothing running whose job would wait for
a busy worker starts it at once on a place of its own (at most
jobs.concurrency such places): another client's running documents each
hold a worker for every page, so a newcomer's first job waited for one of
them to end. The client an attempt runs for goes with it (JOB_CLIENT) to
the run function: the job store gives it to the pipeline's context, where
its work takes that client's turns. No Ray import."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

log = logging.getLogger("ray.serve")

JOB_CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("ocr_job_client", default="")


def job_client() -> str:
    """The client whose job the calling attempt runs ("" outside one)."""
    return JOB_CLIENT.get()


async def work(book: Any) -> None:
    """A worker: jobs from the book's queue until the store closes."""
    while True:
        job_id = await book.queue.get()  # cancelled here only when the store closes
        await one_safely(book, job_id)


async def one_safely(book: Any, job_id: str) -> None:
    """One job; any exception of it, cancellation from below included,
    fails or requeues that job only."""
    try:
        await book._one(job_id)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if book._closed or (task is not None and task.cancelling()):
            raise  # the store is stopping: the journal keeps the job as accepted
        log.error("job %s: cancelled from below; failed", job_id)
        await book._fail_safely(job_id, "internal", "internal error; the job was not completed")
    except Exception as e:
        log.error("job %s: %r", job_id, e)
        await book._fail_safely(job_id, "internal", "internal error; the job was not completed")


def running(book: Any, client: str, sign: int) -> None:
    """Count a running job of `client` in (+1) or out (-1)."""
    n = book.running[client] = book.running.get(client, 0) + sign
    if n <= 0:
        del book.running[client]


def newcomer_place(book: Any, client: str) -> None:
    """Every worker busy (as many jobs running as workers, besides these
    places) and `client` running nothing: its oldest job starts now, not
    after one of the running jobs ends."""
    busy = sum(book.running.values()) - len(book.newcomers)
    if (book._closed or not book.workers or busy < len(book.workers) or book.running.get(client)
            or len(book.newcomers) >= book.args.concurrency):
        return
    job_id = book.queue.take(client)
    if job_id is None:
        return
    task = asyncio.create_task(one_safely(book, job_id), name="job-newcomer")
    book.newcomers.add(task)
    task.add_done_callback(book.newcomers.discard)
