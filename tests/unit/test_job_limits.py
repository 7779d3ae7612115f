"""What a careless or hostile client can cost the job book (issue 13): junk
that fails at once never locks the store, queued bytes are bounded, the
workers survive everything, a broken journal is a 503 and unhealthy,
recovery holds no image until its job runs, the journal file is private.
A stand-in plays the pipeline (no Ray)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import time

import pytest

from jobfakes import FakePipeline, settle, until
from serve_app.core.errors import Overloaded, Unavailable
from serve_app.jobs.book import JobBook
from serve_app.jobs.journal import JobJournal, journal_path
from serve_app.core.request_options import OcrOptions
from serve_app.core.app_args import JobArgs


def run(coro):
    return asyncio.run(coro)


async def started(run_ocr, **args) -> JobBook:
    book = JobBook(run_ocr, JobArgs(**args))
    book.BACKOFF_S = (0.0, 0.0, 0.0)
    await book.start()
    return book


def test_1100_junk_jobs_that_fail_at_once_leave_room_for_a_real_one():
    async def go():
        # one client holding the whole store (client_share 1): the store's own bound
        book = await started(FakePipeline().run, capacity=1000, max_finished=500, client_share=1.0)
        junk = []
        for _ in range(1100):  # junk that passes the header check and fails in the pipeline, as fast as it comes
            junk.append((await book.submit(b"bad", OcrOptions()))["job_id"])
            await asyncio.sleep(0)
        await settle(book, junk[-10:])
        real = (await book.submit(b"real", OcrOptions()))["job_id"]
        views = await settle(book, [real])
        counts = book.counts()
        book.close()
        return views[real], counts, book

    real, counts, book = run(go())
    assert real["status"] == "succeeded" and real["results"] == [{"text": "real"}]
    # finished results have their own bound: the oldest junk went first
    assert counts == {"failed": 499, "succeeded": 1} and book.unfinished == 0


def test_capacity_counts_unfinished_jobs_and_their_bytes():
    async def go():
        pipeline = FakePipeline(open_gate=False)
        book = await started(pipeline.run, capacity=3, max_queued_bytes=1000, concurrency=1, client_share=1.0)
        await book.submit(b"x" * 600, OcrOptions())
        with pytest.raises(Overloaded) as by_bytes:
            await book.submit(b"y" * 600, OcrOptions())
        await book.submit(b"z" * 300, OcrOptions())
        pipeline.gate.set()
        await until(lambda: book.unfinished == 0)
        after = book.held_bytes
        await book.submit(b"y" * 600, OcrOptions())  # room again once the first ones are done
        book.close()
        return by_bytes.value, after

    by_bytes, after = run(go())
    assert by_bytes.status == 503 and "bytes of queued images" in by_bytes.message and after == 0


def test_workers_survive_cancellation_from_below_and_bugs_and_dead_ones_are_replaced():
    calls = []

    async def hostile(image, options, progress=None):
        calls.append(image)
        if image == b"cancel" and calls.count(b"cancel") == 1:
            raise asyncio.CancelledError()  # the call below was cancelled (its replica went away)
        if image == b"bug":
            raise KeyError("a bug")
        return {"results": [{"text": bytes(image).decode()}]}

    async def go():
        book = await started(hostile, concurrency=2)
        ids = [(await book.submit(img, OcrOptions()))["job_id"] for img in (b"cancel", b"bug", b"ok")]
        views = await settle(book, ids)
        alive_after_jobs = book.alive()
        book.workers[0].cancel()  # a worker dies (as if by a bug outside any job)
        await asyncio.sleep(0)
        assert not book.alive()
        await book.health()  # what Serve's health check calls: replaces it
        replaced = book.alive()
        late = (await book.submit(b"late", OcrOptions()))["job_id"]
        views.update(await settle(book, [late]))
        book.close()
        return ids + [late], views, alive_after_jobs, replaced

    ids, views, alive_after_jobs, replaced = run(go())
    assert [views[i]["status"] for i in ids] == ["succeeded", "failed", "succeeded", "succeeded"]
    assert views[ids[1]]["error"]["code"] == "internal"
    assert alive_after_jobs and replaced


def test_a_job_longer_than_its_timeout_fails_with_deadline_exceeded():
    async def go():
        book = await started(FakePipeline(open_gate=False).run, job_timeout_s=0.05)
        job = (await book.submit(b"slow", OcrOptions()))["job_id"]
        views = await settle(book, [job])
        alive = book.alive()
        book.close()
        return views[job], alive

    view, alive = run(go())
    assert view["status"] == "failed" and view["error"]["code"] == "deadline_exceeded" and alive


def test_a_broken_journal_is_503_with_retry_after_and_unhealthy_and_a_racing_duplicate_is_not_a_404(tmp_path):
    async def go():
        book = await started(FakePipeline().run, journal=str(tmp_path / "j.sqlite"))
        ok = (await book.submit(b"ok", OcrOptions(), "k0"))["job_id"]
        await settle(book, [ok])
        await book.health()
        real_add = book.journal.add

        def failing_add(job):
            time.sleep(0.05)
            raise sqlite3.OperationalError("database or disk is full")

        book.journal.add = failing_add
        results = await asyncio.gather(*(book.submit(b"dup", OcrOptions(), "k1") for _ in range(2)),
                                       return_exceptions=True)
        with pytest.raises(RuntimeError, match="cannot be written"):
            await book.health()
        book.journal.add = real_add
        again = await book.submit(b"dup", OcrOptions(), "k1")  # the disk has room again
        await book.health()
        book.close()
        return results, again

    results, again = run(go())
    assert all(isinstance(r, Unavailable) and r.status == 503 and r.retry_after_s == 5 for r in results), results
    assert again["status"] == "queued"


def test_recovery_streams_the_journal_and_loads_an_image_only_when_its_job_runs(tmp_path):
    path = tmp_path / "j.sqlite"

    async def first():
        pipeline = FakePipeline(open_gate=False)
        book = await started(pipeline.run, journal=str(path), concurrency=1)
        ids = [(await book.submit(f"img-{i}".encode(), OcrOptions()))["job_id"] for i in range(6)]
        await until(lambda: len(pipeline.calls) == 1)  # the first is running when the store dies
        book.close()
        return ids

    ids = run(first())

    async def second():
        pipeline = FakePipeline(open_gate=False)
        book = await started(pipeline.run, journal=str(path), concurrency=1)
        await until(lambda: len(pipeline.calls) == 1)  # the one worker took the first recovered job
        in_memory = [book.jobs[i].image is not None for i in ids]
        pipeline.gate.set()
        views = await settle(book, ids)
        book.close()
        return in_memory, views

    in_memory, views = run(second())
    assert in_memory == [True, False, False, False, False, False]  # only the running one's image
    assert [views[i]["results"] for i in ids] == [[{"text": f"img-{i}"}] for i in range(6)]


def test_the_journal_is_per_application_and_private(tmp_path):
    template = str(tmp_path / "ocr-{uid}" / "{app}" / "jobs.sqlite")
    a, b = journal_path(template, "ocr"), journal_path(template, "ocr-2")
    assert a != b and str(os.getuid()) in a and a.endswith("/ocr/jobs.sqlite")
    assert journal_path(template, "../x").endswith("/.._x/jobs.sqlite")
    JobJournal(a).close()
    assert stat.S_IMODE(os.stat(os.path.dirname(a)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(a).st_mode) == 0o600


def test_finished_results_are_bounded_by_their_bytes_too():
    """Results with pictures or many pages are large: the oldest finished
    go first once their JSON passes max_finished_bytes."""
    async def go():
        # One worker: jobs finish in the order they were submitted, so "the
        # oldest went first" does not depend on which of several workers the
        # scheduler ran first (it failed so beside a busy core).
        book = await started(FakePipeline().run, max_finished_bytes=2000, client_share=1.0, concurrency=1)
        ids = []
        for k in range(40):  # each result is ~80 bytes of JSON
            ids.append((await book.submit(f"img{k:02d}".encode() * 4, OcrOptions()))["job_id"])
        await settle(book, ids[-5:])  # (earlier ones may be gone already: that is the bound)
        await book.submit(b"last", OcrOptions())  # a submit expires what is over the bounds
        views = {i: await book.get(i) for i in ids}
        kept = book.finished_bytes
        book.close()
        return views, kept, book

    views, kept, book = run(go())
    gone = [i for i, v in views.items() if v is None]
    assert gone and views[list(views)[-1]]["status"] == "succeeded"  # the newest results stay
    assert gone == list(views)[: len(gone)]  # the oldest went first
    stored = sum(len(book.jobs[i].result_json) for i in views if views[i] is not None)
    assert 0 < kept <= 2000 and kept == stored  # counted as stored: the results' JSON bytes
