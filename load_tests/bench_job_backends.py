"""Benchmark: what the Redis job book (jobs.backend: redis) costs against the
SQLite one (the baseline, ratio 1.00), per submit and per poll, side by
side in one run: each the store's own class (JobBook with its journal,
RedisJobBook) in this process, with a pipeline that answers at once, so
the figures are the book's own cost:

- submit: one job (a 50 KB image) accepted, i.e. durable: SQLite committed
  with synchronous=FULL, the Redis script answered by a local redis-server
  with appendonly yes, appendfsync always (and everysec: the fsync's cost);
- submit x32: 32 submits at once; poll: GET of a finished job (200 bytes).

Redis runs on loopback on the same cores; a cluster adds a network round
trip per call.

    .venv/bin/python -m load_tests jobs [--n 300] [--polls 2000]"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path


from harness.redis_server import RedisServer  # noqa: E402  (harness/redis_server.py)

from serve_app.jobs.book import JobBook
from serve_app.jobs.redis_book import RedisJobBook
from serve_app.core.request_options import OcrOptions
from serve_app.core.app_args import JobArgs
from load_tests.stats import percentile

IMAGE = b"\x89PNG" + bytes(50_000)


async def answer(image, options, progress):
    return {"results": [{"text": "x" * 100, "score": 0.99, "box": [[0, 0], [1, 0], [1, 1], [0, 1]]}]}


async def measure(book, n: int, polls: int) -> dict:
    await book.start()
    one = []
    for _ in range(n):
        t = time.perf_counter()
        await book.submit(IMAGE, OcrOptions())
        one.append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(max(1, n // 32)):
        await asyncio.gather(*(book.submit(IMAGE, OcrOptions()) for _ in range(32)))
    burst_rate = (max(1, n // 32) * 32) / (time.perf_counter() - t)
    job = (await book.submit(IMAGE, OcrOptions()))["job_id"]
    while (await book.get(job))["status"] != "succeeded":
        await asyncio.sleep(0.005)
    got = []
    for _ in range(polls):
        t = time.perf_counter()
        await book.get(job)
        got.append(time.perf_counter() - t)
    if hasattr(book, "aclose"):
        await book.aclose()
    else:
        book.close()
    return {"submit_p50": statistics.median(one) * 1e3, "submit_p99": percentile(one, 99) * 1e3,
            "burst_per_s": burst_rate, "poll_p50": statistics.median(got) * 1e3, "poll_p99": percentile(got, 99) * 1e3}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--n", type=int, default=300, help="sequential submits per backend")
    ap.add_argument("--polls", type=int, default=2000)


def main(args: argparse.Namespace) -> int:
    a = args
    args = dict(capacity=100_000, max_queued_bytes=1 << 34, concurrency=8)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        rows["sqlite (journal, synchronous=FULL)"] = asyncio.run(measure(
            JobBook(answer, JobArgs(journal=f"{tmp}/jobs.sqlite", **args)), a.n, a.polls))
        normal = JobBook(answer, JobArgs(journal=f"{tmp}/jobs-normal.sqlite", **args))
        normal.journal.db.execute("PRAGMA synchronous=NORMAL")  # the journal's setting before FULL
        rows["sqlite (synchronous=NORMAL, before)"] = asyncio.run(measure(normal, a.n, a.polls))
        for fsync in ("always", "everysec"):
            server = RedisServer(Path(tmp) / f"redis-{fsync}", fsync=fsync)
            try:
                book = RedisJobBook(answer, JobArgs(backend="redis", redis_fsync=fsync, **args), url=server.url)
                rows[f"redis (appendfsync {fsync})"] = asyncio.run(measure(book, a.n, a.polls))
            finally:
                server.stop()
    base = next(iter(rows.values()))
    print(f"job book per submit and per poll: {a.n} sequential submits of a {len(IMAGE) // 1000} KB image, "
          f"{max(1, a.n // 32)} bursts of 32, {a.polls} polls of a finished job")
    print(f"{'backend':38} {'submit p50 ms':>13} {'p99':>7} {'x':>5} {'burst submits/s':>16} {'x':>5} "
          f"{'poll p50 ms':>11} {'p99':>7} {'x':>5}")
    for name, r in rows.items():
        print(f"{name:38} {r['submit_p50']:13.2f} {r['submit_p99']:7.2f} {r['submit_p50'] / base['submit_p50']:5.2f} "
              f"{r['burst_per_s']:16.0f} {r['burst_per_s'] / base['burst_per_s']:5.2f} "
              f"{r['poll_p50']:11.3f} {r['poll_p99']:7.3f} {r['poll_p50'] / base['poll_p50']:5.2f}")


def smoke(args: argparse.Namespace) -> int:
    """A tiny real run: 32 submits and 50 polls per book (Redis where a
    redis-server is installed, as the full run needs)."""
    args.n, args.polls = 32, 50
    return main(args)
