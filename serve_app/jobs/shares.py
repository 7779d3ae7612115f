"""Each client's share of the job book (issue 38): its unfinished jobs and
their image bytes (jobs.client_share of capacity and of max_queued_bytes),
and room for its result that takes nobody else's (serve_app.jobs.results).
Work-conserving: a client alone in the book (nobody else has an unfinished
job) may fill it up to capacity less one share, kept for whoever comes
next; once another client holds a job, each is held to its share again
(a client over it is refused until it is back under). Functions over a
JobBook (serve_app.jobs.book). No Ray import."""

from __future__ import annotations

import math
import time
from typing import Any, Optional

from serve_app.core.errors import Overloaded


def check_room(book: Any, client: str, nbytes: int) -> None:
    """Overloaded (503, Retry-After) unless a new job of `client` of
    `nbytes` fits: the store's capacity and queued bytes, this client's
    share of each (jobs.client_share), and room for its result that takes
    nobody else's (serve_app.jobs.results.ResultShares.room_for)."""
    args = book.args
    mine, held = book.client_unfinished.get(client, 0), book.client_held.get(client, 0)
    if book.unfinished >= args.capacity:
        raise Overloaded(f"the job store is full ({args.capacity} jobs) of unfinished work; retry later",
                         retry_after_s=book._retry_after())
    if book.held_bytes + nbytes > args.max_queued_bytes:
        raise Overloaded(f"the job store holds {book.held_bytes} bytes of queued images; retry later",
                         retry_after_s=book._retry_after())
    alone = len(book.client_unfinished) - (client in book.client_unfinished) == 0
    jobs, nbytes_max = client_limits(args, alone)
    if mine >= jobs or held + nbytes > nbytes_max:
        raise Overloaded(over_share_message(args, mine, held, alone), retry_after_s=book._retry_after(mine))
    if not book.finished.room_for(client, book.unfinished):
        oldest = book.finished.oldest_finished()
        wait = book._retry_after() if oldest is None else math.ceil(oldest + args.ttl_s - time.time())
        raise Overloaded(f"the job store's results are full ({len(book.finished)} results, "
                         f"{book.finished.total_bytes} bytes) of other clients' results, kept until their "
                         f"time to live; retry later", retry_after_s=max(1, min(3600, wait)))


def client_limits(args: Any, alone: bool) -> tuple[int, int]:
    """(jobs, image bytes) one client may hold unfinished: its share
    (jobs.client_share of capacity and max_queued_bytes), or, while it is
    alone in the book, all of it but one share kept for the next client."""
    jobs = max(1, int(args.capacity * args.client_share))
    nbytes = max(1, int(args.max_queued_bytes * args.client_share))
    if alone:
        return max(jobs, args.capacity - jobs), max(nbytes, args.max_queued_bytes - nbytes)
    return jobs, nbytes


def over_share_message(args: Any, mine: int, held: int, alone: bool) -> str:
    if alone:
        return (f"this client has {mine} unfinished jobs ({held} bytes of images) here: all of the job store but "
                f"the share kept for other clients (jobs.client_share {args.client_share:g} of capacity and of "
                f"max_queued_bytes); retry once some have finished")
    return (f"this client has {mine} unfinished jobs ({held} bytes of images) here, over its share "
            f"(jobs.client_share {args.client_share:g} of capacity and of max_queued_bytes) while other clients "
            f"have jobs waiting; retry once some have finished")


def retry_after(book: Any, jobs: Optional[int] = None) -> int:
    """About when a slot frees up: the queue's length (or `jobs`) over
    the workers, times a job's average time; 5 s before any job has finished."""
    if book._job_seconds is None:
        return 5
    n = book.unfinished if jobs is None else jobs
    return max(1, min(60, math.ceil(n / book.args.concurrency * book._job_seconds)))


def release(book: Any, job: Any) -> None:
    """A job not accepted after all (its write failed, its submit was cancelled): what its checks counted, given back."""
    hold(book, job, -1)
    book.deliveries.pop(job.job_id, None)


def hold(book: Any, job: Any, sign: int) -> None:
    """Count an unfinished job in (+1) or out (-1), the store's and its client's."""
    book.unfinished += sign
    book.held_bytes += sign * job.nbytes
    c = job.client
    book.client_unfinished[c] = book.client_unfinished.get(c, 0) + sign
    book.client_held[c] = book.client_held.get(c, 0) + sign * job.nbytes
    if book.client_unfinished[c] <= 0:
        del book.client_unfinished[c]
        book.client_held.pop(c, None)
