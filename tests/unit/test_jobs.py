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
                          "pages_done": 1, "pages_total": 2, "progress": {"pages": 2, "done": 1}}
    recovered = Job(job_id="j", created=0.0)  # as the journal gives it back: no progress fields
    recovered.succeed({"request_id": "j", "document": {"type": "pdf", "pages": 2}, "pages": []})
    view = recovered.view()
    assert (view["pages_done"], view["pages_total"], view["document"]["pages"]) == (2, 2, 2)


# -- stored results served without parsing (issue 38, item 5) -------------------------------


def test_a_stored_result_is_served_as_its_bytes_without_being_parsed(monkeypatch):
    """A 29 MB result parsed on the store's loop took ~4 s a GET: get_raw
    gives the stored bytes, and job_body splices them into the body, which
    reads as view() does."""
    from serve_app.jobs import state
    from serve_app.jobs.state import job_body

    pages = [{"page": i + 1, "width": 100, "height": 100,
              "results": [{"text": f"line {i}-{k} é", "score": 0.9, "box": [[0, 0], [1, 0], [1, 1], [0, 1]]}
                          for k in range(50)]} for i in range(200)]
    doc = {"request_id": "j", "document": {"type": "pdf", "pages": 200}, "pages": pages, "timings_ms": {"total": 1.0}}
    image = {"request_id": "i", "image": {"width": 3, "height": 4}, "results": [], "timings_ms": {}}

    async def go():
        pipeline = FakePipeline()
        book = await started(pipeline)
        ids = []
        for body in (doc, image):
            job = Job(job_id=uuid_hex(len(ids)), created=0.0)
            job.succeed(body)
            book.jobs[job.job_id] = job
            ids.append(job.job_id)
        bad = Job(job_id="bad", created=0.0)
        bad.fail("bad_image", "not an image")
        book.jobs["bad"] = bad
        parsed = []
        real = json.loads

        def counting(s, *a, **k):
            parsed.append(len(s))
            return real(s, *a, **k)

        monkeypatch.setattr(state.json, "loads", counting)
        raws = [await book.get_raw(i) for i in ids + ["bad", "nope"]]
        monkeypatch.setattr(state.json, "loads", real)
        views = [await book.get(i) for i in ids + ["bad"]]
        book.close()
        return raws, views, parsed

    raws, views, parsed = run(go())
    assert max(parsed, default=0) < 600  # at most a document's head, never the result
    assert raws[3] is None
    for (head, blob), view in zip(raws[:3], views):
        assert json.loads(job_body(head, blob)) == view
    assert (views[0]["pages_done"], views[0]["pages_total"], len(views[0]["pages"])) == (200, 200, 200)
    assert views[1]["image"] == {"width": 3, "height": 4} and "pages_done" not in views[1]
    assert raws[2] == ({"job_id": "bad", "status": "failed", "created_at": 0.0, "finished_at": raws[2][0]["finished_at"],
                        "error": {"code": "bad_image", "message": "not an image"}}, None)


def uuid_hex(n: int) -> str:
    return f"{n:032x}"


# -- a job that meets Overloaded waits, it does not fail (issue 38, item 4) -------------------


class _Busy:
    """Overloaded `busy` times (as Ray delivers it: a task error whose
    `cause` is the replica's exception), then reads the image."""

    def __init__(self, busy: int, retry_after_s: int = 1, error=Overloaded):
        self.busy, self.retry_after_s, self.calls, self.error = busy, retry_after_s, 0, error

    async def run(self, image, options, progress=None):
        self.calls += 1
        if self.busy > 0:
            self.busy -= 1
            err = RuntimeError("ray task error")
            err.cause = self.error("both PDF workers are busy; retry later", retry_after_s=self.retry_after_s)
            raise err
        return {"results": [{"text": bytes(image).decode()}]}


async def _busy_book(busy: _Busy, **args):
    book = JobBook(busy.run, JobArgs(**args))
    book.BACKOFF_S = (0.0, 0.0, 0.0)
    pauses = []

    async def pause(seconds):  # a fake clock: the pauses are recorded, not slept
        pauses.append(seconds)

    book._pause = pause
    await book.start()
    return book, pauses


def test_a_job_that_meets_overloaded_is_tried_again_after_growing_pauses_then_succeeds():
    async def go():
        busy = _Busy(9, retry_after_s=5)
        book, pauses = await _busy_book(busy)
        job = await book.submit(b"page", OcrOptions())
        done = (await settle(book, [job["job_id"]]))[job["job_id"]]
        book.close()
        return done, pauses, busy.calls

    done, pauses, calls = run(go())
    assert done["status"] == "succeeded" and done["results"] == [{"text": "page"}]
    assert calls == 10  # nine busy answers did not use up the four attempts
    assert pauses == [5.0, 5.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]  # Retry-After while longer


def test_a_job_whose_model_set_is_loading_waits_for_it():
    """A job naming a catalogued set that is not loaded yet meets 503 model_loading
    (serve_app/serving/set_cache.py): it waits for the load's Retry-After, it does not fail."""
    from serve_app.core.errors import ModelLoading

    async def go():
        busy = _Busy(2, retry_after_s=12, error=ModelLoading)
        book, pauses = await _busy_book(busy)
        job = await book.submit(b"page", OcrOptions(model="ppocrv6_tiny"))
        done = (await settle(book, [job["job_id"]]))[job["job_id"]]
        book.close()
        return done, pauses

    done, pauses = run(go())
    assert done["status"] == "succeeded" and done["results"] == [{"text": "page"}]
    assert pauses == [12.0, 12.0]


def test_a_job_still_overloaded_after_overloaded_wait_s_fails_overloaded():
    async def go():
        book, pauses = await _busy_book(_Busy(10**6), overloaded_wait_s=100)
        job = await book.submit(b"page", OcrOptions())
        done = (await settle(book, [job["job_id"]]))[job["job_id"]]
        book.close()
        return done, pauses

    done, pauses = run(go())
    assert done["status"] == "failed" and done["error"]["code"] == "overloaded"
    assert "jobs.overloaded_wait_s" in done["error"]["message"]
    assert sum(pauses) <= 100 and pauses == [2.0, 4.0, 8.0, 16.0, 32.0]


def test_a_client_with_nothing_running_starts_its_job_at_once_beside_another_clients_running_documents():
    """Client a's documents hold both workers and more are queued; client
    b's one job starts at once on a place of its own (it waited for one of
    a's documents to end: every page of it), its run told b's name (its
    pipeline work takes b's turns); a's queued jobs wait for a worker, and
    b's second job waits too (b is running one)."""
    from serve_app.jobs.dispatch import job_client

    async def go():
        pipe = FakePipeline(open_gate=False)
        clients: dict[bytes, str] = {}

        async def run_ocr(image, options, progress=None):
            clients[bytes(image)] = job_client()
            return await pipe.run(image, options, progress)

        book = JobBook(run_ocr, JobArgs(concurrency=2))
        await book.start()
        a = [(await book.submit(f"a{k}".encode(), OcrOptions(), client="a"))["job_id"] for k in range(6)]
        await until(lambda: len(pipe.calls) == 2)
        b = [(await book.submit(f"b{k}".encode(), OcrOptions(), client="b"))["job_id"] for k in range(2)]
        await until(lambda: len(pipe.calls) == 3)
        for _ in range(20):
            await asyncio.sleep(0)
        assert [bytes(c[0]) for c in pipe.calls] == [b"a0", b"a1", b"b0"]  # b1 and a2.. wait for a worker
        assert (await book.get(b[0]))["status"] == "running" and (await book.get(a[2]))["status"] == "queued"
        pipe.gate.set()
        views = await settle(book, a + b)
        assert all(v["status"] == "succeeded" for v in views.values())
        assert clients == {**{f"a{k}".encode(): "a" for k in range(6)}, b"b0": "b", b"b1": "b"}
        assert not book.newcomers and not book.running and book.queue.qsize() == 0
        book.close()
    run(go())
