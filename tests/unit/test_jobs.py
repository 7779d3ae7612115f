"""The job book's state machine (what the JobStore deployment wraps), with a
stand-in pipeline: statuses as the HTTP JSON shows them, idempotency,
capacity, retries, and the workers' lifecycle."""

from __future__ import annotations

import asyncio
import json

import pytest

from jobfakes import FakePipeline, settle, until
from serve_app.core.errors import IdempotencyConflict, Overloaded
from serve_app.jobs.book import JobBook
from serve_app.jobs.state import Job, JobStatus
from serve_app.core.request_options import OcrOptions
from serve_app.core.app_args import JobArgs


def run(coro):
    return asyncio.run(coro)


async def started(pipeline: FakePipeline, **args) -> JobBook:
    book = JobBook(pipeline.run, JobArgs(**args))
    book.BACKOFF_S = (0.0, 0.0, 0.0)
    await book.start()
    return book


def test_status_values_are_the_http_strings():
    assert [s.value for s in JobStatus] == ["queued", "running", "succeeded", "failed"]
    assert json.dumps(Job(job_id="j", created=0.0).view()) == '{"job_id": "j", "status": "queued", "created_at": 0.0}'
    assert [s.done for s in JobStatus] == [False, False, True, True]


def test_a_job_moves_queued_running_succeeded_and_drops_its_image():
    job = Job(job_id="j", created=10.0, image=b"img")
    job.start(12.5)
    assert job.view() == {"job_id": "j", "status": "running", "created_at": 10.0, "started_at": 12.5}
    job.succeed({"request_id": "j", "results": []})
    view = job.view()
    assert job.image is None and job.finished is not None
    assert view == {"job_id": "j", "status": "succeeded", "created_at": 10.0, "started_at": 12.5,
                    "finished_at": round(job.finished, 3), "request_id": "j", "results": []}
    job.requeue()  # a finished job stays finished after a restart
    assert job.status is JobStatus.SUCCEEDED and job.started == 12.5


def test_a_job_running_at_a_restart_is_queued_again_without_its_start_time():
    job = Job(job_id="j", created=10.0, image=b"img")
    job.start(12.0)
    job.requeue()
    assert job.view() == {"job_id": "j", "status": "queued", "created_at": 10.0}


def test_submitted_jobs_succeed_or_fail_with_the_inputs_error_code():
    async def go():
        pipeline = FakePipeline()
        book = await started(pipeline)
        ok = await book.submit(b"hello", OcrOptions(cls=False))
        assert ok["status"] == "queued" and set(ok) == {"job_id", "status", "created_at"}
        bad = await book.submit(b"bad", OcrOptions())
        views = await settle(book, [ok["job_id"], bad["job_id"]])
        book.close()
        return pipeline, ok["job_id"], bad["job_id"], views

    pipeline, ok, bad, views = run(go())
    for view in views.values():
        assert view["created_at"] <= view["started_at"] <= view["finished_at"], view
        del view["created_at"], view["started_at"], view["finished_at"]
    assert views[ok] == {"job_id": ok, "status": "succeeded", "request_id": ok, "results": [{"text": "hello"}]}
    assert views[bad] == {"job_id": bad, "status": "failed",
                          "error": {"code": "bad_image", "message": "not an image"}}
    assert pipeline.calls[0] == (b"hello", OcrOptions(cls=False))
    assert len(pipeline.calls) == 2  # an input's error is final: not retried


def test_a_job_whose_replica_died_is_retried_then_given_up():
    async def go():
        pipeline = FakePipeline(flaky=2)
        book = await started(pipeline)
        saved = (await book.submit(b"flaky", OcrOptions()))["job_id"]
        await settle(book, [saved])
        pipeline.flaky = 10
        lost = (await book.submit(b"flaky", OcrOptions()))["job_id"]
        views = await settle(book, [saved, lost])
        book.close()
        return pipeline, views[saved], views[lost]

    pipeline, saved, lost = run(go())
    assert saved["status"] == "succeeded" and saved["results"] == [{"text": "flaky"}]
    assert lost["status"] == "failed" and lost["error"]["code"] == "internal"
    assert len(pipeline.calls) == 3 + 4  # two failures and a success; then four attempts


def test_idempotency_key_returns_the_same_job_and_capacity_refuses_with_503():
    async def go():
        book = await started(FakePipeline(open_gate=False), capacity=2, client_share=1.0)
        a = await book.submit(b"a", OcrOptions(), "k")
        assert (await book.submit(b"a", OcrOptions(), "k"))["job_id"] == a["job_id"]
        with pytest.raises(IdempotencyConflict) as conflict:  # the same key, another payload
            await book.submit(b"other", OcrOptions(), "k")
        assert conflict.value.status == 422 and conflict.value.code == "idempotency_conflict"
        with pytest.raises(IdempotencyConflict):
            await book.submit(b"a", OcrOptions(det=False), "k")
        await book.submit(b"b", OcrOptions())
        with pytest.raises(Overloaded) as full:
            await book.submit(b"c", OcrOptions())
        await until(lambda: book.counts() == {"running": 2})  # the workers pick both up
        book.close()
        return full.value

    full = run(go())
    assert full.status == 503 and full.code == "overloaded" and full.retry_after_s == 5
    assert "full (2 jobs)" in full.message


def test_unknown_jobs_are_none_and_expired_ones_free_their_key():
    async def go():
        book = await started(FakePipeline(), ttl_s=0.05)
        assert await book.get("nope") is None
        first = (await book.submit(b"x", OcrOptions(), "k"))["job_id"]
        await settle(book, [first])
        await asyncio.sleep(0.1)
        second = (await book.submit(b"x", OcrOptions(), "k"))["job_id"]
        book.close()
        return first, second

    first, second = run(go())
    assert first != second


def test_workers_start_with_the_book_and_stop_with_it():
    async def go():
        book = JobBook(FakePipeline().run, JobArgs(concurrency=3))
        assert not book.alive()  # nothing runs before start()
        await book.start()
        assert book.alive() and len(book.workers) == 3
        book.close()
        await asyncio.sleep(0)
        return book.alive()

    assert run(go()) is False


def test_a_document_job_shows_its_pages_while_running_and_when_done():
    async def go():
        pipeline = FakePipeline(open_gate=False)
        book = await started(pipeline)
        job = await book.submit(b"pages", OcrOptions())
        for _ in range(200):
            running = await book.get(job["job_id"])
            if running.get("pages_done") == 3:
                break
            await asyncio.sleep(0.005)
        pipeline.gate.set()
        done = (await settle(book, [job["job_id"]]))[job["job_id"]]
        book.close()
        return running, done

    running, done = run(go())
    assert running["status"] == "running" and (running["pages_done"], running["pages_total"]) == (3, 3)
    assert done["status"] == "succeeded"


def test_a_finished_document_reports_its_pages_from_its_result_also_after_a_restart():
    job = Job(job_id="j", created=0.0, image=b"%PDF-")
    job.start(1.0)
    job.progress(1, 2)
    assert job.view() == {"job_id": "j", "status": "running", "created_at": 0.0, "started_at": 1.0,
                          "pages_done": 1, "pages_total": 2}
    recovered = Job(job_id="j", created=0.0)  # as the journal gives it back: no progress fields
    recovered.succeed({"request_id": "j", "document": {"type": "pdf", "pages": 2}, "pages": []})
    view = recovered.view()
    assert (view["pages_done"], view["pages_total"], view["document"]["pages"]) == (2, 2, 2)
