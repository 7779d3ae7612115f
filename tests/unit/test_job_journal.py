"""The job store's journal: a restarted store (a new JobBook on the same
file) finishes the jobs the old one accepted and still serves the finished
ones; nothing accepted is lost. The book is what the JobStore deployment
wraps; a stand-in plays the pipeline (no Ray)."""

from __future__ import annotations

import asyncio
import time

import numpy as np

import pytest

from jobfakes import FakePipeline, settle, until
from serve_app.core.errors import IdempotencyConflict
from serve_app.jobs.book import JobBook
from serve_app.jobs.journal import JobJournal
from serve_app.jobs.state import Job, JobStatus
from serve_app.core.request_options import OcrOptions
from serve_app.core.app_args import JobArgs


async def started(pipeline: FakePipeline, args: JobArgs) -> JobBook:
    book = JobBook(pipeline.run, args)
    await book.start()
    return book


def test_a_restarted_store_runs_the_unfinished_jobs_and_keeps_the_results(tmp_path):
    path = tmp_path / "jobs" / "journal.sqlite"  # the folder is created
    chars = OcrOptions(return_chars=True)

    async def first_life():
        book = await started(FakePipeline(), JobArgs(journal=str(path), concurrency=2))
        done = (await book.submit(b"early", chars, "key-1"))["job_id"]
        failed = (await book.submit(b"bad", OcrOptions()))["job_id"]
        await settle(book, [done, failed])
        # Their "finished" rows are written on the journal's thread after the status
        # changes in memory: wait for the file (else the next store may recover them
        # as unfinished and run them again, which the last assertion below counts).
        await until(lambda: {j.job_id for j in JobJournal(path).load() if j.finished} >= {done, failed})
        stuck = FakePipeline(open_gate=False)  # the pipeline stops answering: these stay queued or running
        book.run = stuck.run
        pending = [(await book.submit(f"late-{i}".encode(), OcrOptions(det=i % 2 == 0)))["job_id"]
                   for i in range(5)]
        deadline = time.monotonic() + 10
        while len(stuck.calls) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert len(stuck.calls) == 2  # two running (concurrency 2), three queued
        book.close()  # the replica dies
        return done, failed, pending

    done, failed, pending = asyncio.run(first_life())

    async def second_life():
        pipeline = FakePipeline()
        book = await started(pipeline, JobArgs(journal=str(path), concurrency=2))
        # Finished jobs answer at once, from the file; the idempotency key still maps.
        assert (await book.get(done))["results"] == [{"text": "early"}]
        assert (await book.get(failed))["error"]["code"] == "bad_image"
        assert (await book.submit(b"early", chars, "key-1"))["job_id"] == done
        with pytest.raises(IdempotencyConflict):  # the key stands for its payload, across restarts too
            await book.submit(b"other", chars, "key-1")
        views = await settle(book, pending)
        assert [views[j]["results"] for j in pending] == [[{"text": f"late-{i}"}] for i in range(5)]
        # Each run again, once, with the options it was submitted with.
        assert sorted(pipeline.calls, key=lambda c: c[0]) == [
            (f"late-{i}".encode(), OcrOptions(det=i % 2 == 0)) for i in range(5)]
        # As above: the last "finished" rows reach the file on the journal's thread.
        await until(lambda: {j.job_id for j in JobJournal(path).load() if j.finished} >= {done, failed, *pending})
        book.close()

    asyncio.run(second_life())
    # Finished jobs keep their result but not their image.
    jobs = {j.job_id: j for j in JobJournal(path).load()}
    assert set(jobs) == {done, failed, *pending}
    assert all(j.image is None and j.finished and j.status.done for j in jobs.values())
    assert jobs[done].status is JobStatus.SUCCEEDED and jobs[done].options == chars and jobs[done].key == "key-1"
    assert jobs[failed].status is JobStatus.FAILED


def test_expired_jobs_leave_the_journal(tmp_path):
    path = tmp_path / "journal.sqlite"

    async def go():
        book = await started(FakePipeline(), JobArgs(journal=str(path), ttl_s=0.05))
        job = (await book.submit(b"x", OcrOptions()))["job_id"]
        await settle(book, [job])
        deadline = time.monotonic() + 30  # expired 0.05 s after it finished: polled, not a sleep that must outrun it
        while await book.get(job) is not None:
            assert time.monotonic() < deadline, "the job never expired"
            await asyncio.sleep(0.01)
        await until(lambda: JobJournal(path).load() == [])  # the delete reaches the file on the journal's thread
        book.close()

    asyncio.run(go())
    assert JobJournal(path).load() == []


def test_array_images_round_trip_without_pickle(tmp_path):
    j = JobJournal(tmp_path / "j.sqlite")
    img = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    j.add(Job(job_id="a", created=1.0, image=img))
    j.add(Job(job_id="b", created=2.0, key="k", options=OcrOptions(return_chars=True), image=b"\x89PNG"))
    a, b = j.load()
    assert np.array_equal(a.image, img) and a.options == OcrOptions() and a.status is JobStatus.QUEUED
    assert b.image == b"\x89PNG" and b.key == "k" and b.options == OcrOptions(return_chars=True)


def test_a_finished_job_is_written_with_its_result_and_without_its_image(tmp_path):
    j = JobJournal(tmp_path / "j.sqlite")
    job = Job(job_id="a", created=1.0, image=b"img")
    j.add(job)
    job.start()
    job.succeed({"results": [{"text": "hi"}]})
    j.finish(job)
    (back,) = j.load()
    assert back.started is None  # not journaled: a job's start time is lost with a restart
    back.started = job.started
    assert back == job and back.image is None and back.status is JobStatus.SUCCEEDED
    j.delete(["a"])
    assert j.load() == []


def test_without_a_journal_jobs_are_in_memory_only(tmp_path, monkeypatch):
    """No file anywhere (a relative default would land in the working
    directory, here tmp_path), and a restarted store knows none of the old
    store's jobs."""
    monkeypatch.chdir(tmp_path)

    async def go():
        book = await started(FakePipeline(), JobArgs())
        job = (await book.submit(b"x", OcrOptions()))["job_id"]
        assert (await settle(book, [job]))[job]["status"] == "succeeded"
        book.close()
        again = await started(FakePipeline(), JobArgs())
        assert await again.get(job) is None
        again.close()

    asyncio.run(go())
    assert list(tmp_path.iterdir()) == []
