"""One contract for both job backends (jobs.backend): the sqlite book with its
journal (serve_app.jobs.book) and the Redis book (serve_app.jobs.redis_book) against
a real redis-server (harness/redis_server.py, started by the `redis_server`
fixture; a missing redis-server fails these tests, it never skips them).

Time is a fake clock where the TTL matters; nothing waits on a sleep."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from jobfakes import FakePipeline, settle, until

from serve_app.core.errors import IdempotencyConflict, Overloaded
from serve_app.jobs.book import JobBook
from serve_app.core.request_options import OcrOptions
from serve_app.core.app_args import JobArgs, LaneArgs

BACKENDS = ["sqlite", "redis"]
_names = itertools.count()


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def books(backend, tmp_path, request):
    """make(run, **JobArgs) -> a started book; books made by one test share
    one journal file (sqlite, one after another) or one Redis book (redis,
    at once: several store replicas)."""
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    prefix = f"ocr:{{test{next(_names)}}}:"
    made = []

    async def make(run, lanes: LaneArgs = LaneArgs(), **args) -> JobBook:
        if backend == "redis":
            from serve_app.jobs.redis_book import RedisJobBook

            book = RedisJobBook(run, JobArgs(backend="redis", **args), lanes, url=url, prefix=prefix)
        else:
            book = JobBook(run, JobArgs(journal=str(tmp_path / "jobs.sqlite"), **args), lanes)
        book.BACKOFF_S = (0.0, 0.0, 0.0)
        await book.start()
        made.append(book)
        return book

    async def close_all():
        for book in made:
            if hasattr(book, "aclose"):
                await book.aclose()
            else:
                book.close()

    make.close_all = close_all
    return make


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def clock(monkeypatch):
    """time.time() moved on by hand (the books read it for finished times and the TTL)."""
    offset = [0.0]
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + offset[0])
    return offset


def test_a_job_runs_and_its_result_is_served(books):
    async def go():
        book = await books(FakePipeline().run)
        job = await book.submit(b"hello", OcrOptions())
        assert job == {"job_id": job["job_id"], "status": "queued", "created_at": job["created_at"]}
        views = await settle(book, [job["job_id"]])
        unknown = await book.get("no-such-job")
        await books.close_all()
        return views[job["job_id"]], unknown

    view, unknown = run(go())
    assert view["status"] == "succeeded" and view["results"] == [{"text": "hello"}]
    assert view["request_id"] == view["job_id"] and unknown is None
    assert view["created_at"] <= view["started_at"] <= view["finished_at"] <= time.time(), view


def test_an_idempotency_key_stands_for_one_payload(books):
    async def go():
        book = await books(FakePipeline(open_gate=False).run)
        a = await book.submit(b"img", OcrOptions(), key="k1")
        again = await book.submit(b"img", OcrOptions(), key="k1")
        with pytest.raises(IdempotencyConflict):
            await book.submit(b"other", OcrOptions(), key="k1")
        # Ten submits of one new key at once: one job.
        same = await asyncio.gather(*(book.submit(b"img2", OcrOptions(), key="k2") for _ in range(10)))
        counts = await book.acounts()
        await books.close_all()
        return a, again, same, counts

    a, again, same, counts = run(go())
    assert again["job_id"] == a["job_id"]
    assert len({v["job_id"] for v in same}) == 1
    assert sum(counts.values()) == 2


def test_capacity_counts_unfinished_jobs_and_their_image_bytes(books):
    async def go():
        book = await books(FakePipeline(open_gate=False).run, capacity=3, max_queued_bytes=1000, concurrency=1,
                           client_share=1.0)  # one client: the store's own bounds
        await book.submit(b"x" * 600, OcrOptions())
        with pytest.raises(Overloaded) as too_big:
            await book.submit(b"y" * 500, OcrOptions())  # 1100 bytes queued: over
        await book.submit(b"a", OcrOptions())
        await book.submit(b"b", OcrOptions())
        with pytest.raises(Overloaded) as full:
            await book.submit(b"c", OcrOptions())
        await books.close_all()
        return too_big.value, full.value

    too_big, full = run(go())
    assert too_big.status == 503 and too_big.retry_after_s >= 1 and "bytes" in too_big.message
    assert full.status == 503 and "full (3 jobs)" in full.message


def test_a_document_reports_pages_done_while_it_runs(books):
    async def go():
        pipe = FakePipeline(open_gate=False)
        book = await books(pipe.run)
        job = (await book.submit(b"pages", OcrOptions()))["job_id"]
        for _ in range(3000):  # until the worker has reported page 3 of 3 (it then waits on the gate)
            view = await book.get(job)
            if view.get("pages_done") == 3:
                break
            await asyncio.sleep(0.01)
        pipe.gate.set()
        await settle(book, [job])
        await books.close_all()
        return view

    view = run(go())
    assert view["status"] == "running" and (view["pages_done"], view["pages_total"]) == (3, 3)


def test_interactive_jobs_run_before_bulk_jobs_queued_earlier(books):
    async def go():
        pipe = FakePipeline(open_gate=False)
        book = await books(pipe.run, concurrency=1)
        first = (await book.submit(b"first", OcrOptions()))["job_id"]
        while not pipe.calls:  # the one worker holds `first`
            await asyncio.sleep(0.01)
        bulk = [(await book.submit(f"bulk{k}".encode(), OcrOptions(priority="bulk")))["job_id"] for k in range(3)]
        urgent = (await book.submit(b"urgent", OcrOptions(priority="interactive")))["job_id"]
        pipe.gate.set()
        views = await settle(book, [first, urgent, *bulk])
        await books.close_all()
        return [bytes(c[0]) for c in pipe.calls], [views[j]["started_at"] for j in (first, urgent, *bulk)]

    order, started = run(go())
    assert order == [b"first", b"urgent", b"bulk0", b"bulk1", b"bulk2"]
    assert started == sorted(started), started  # the views' start times tell the same order


def test_finished_results_expire_after_their_ttl(books, clock):
    async def go():
        book = await books(FakePipeline().run, ttl_s=60)
        job = (await book.submit(b"old", OcrOptions()))["job_id"]
        await settle(book, [job])
        keyed = (await book.submit(b"keyed", OcrOptions(), key="k"))["job_id"]
        await settle(book, [keyed])
        clock[0] += 59
        kept = await book.get(job)
        clock[0] += 2
        gone = await book.get(job)
        await book.submit(b"new", OcrOptions())  # a submit drops the expired ones from the store
        counts = await book.acounts()
        fresh = (await book.submit(b"other", OcrOptions(), key="k"))["job_id"]  # the key expired with its job
        await books.close_all()
        return kept, gone, counts, keyed, fresh

    kept, gone, counts, keyed, fresh = run(go())
    assert kept["status"] == "succeeded" and gone is None
    assert counts.get("succeeded", 0) <= 1  # only "new" (if it has finished)
    assert fresh != keyed


def test_a_result_over_the_per_job_bound_fails_the_job_clearly(books):
    async def go():
        book = await books(FakePipeline().run, max_result_bytes=200)
        small = (await book.submit(b"ok", OcrOptions()))["job_id"]
        big = (await book.submit(b"x" * 500, OcrOptions()))["job_id"]
        views = await settle(book, [small, big])
        await books.close_all()
        return views[small], views[big]

    small, big = run(go())
    assert small["status"] == "succeeded"
    assert big["status"] == "failed" and big["error"]["code"] == "result_too_large"
    assert "over the limit of 200" in big["error"]["message"] and "results" not in big


def test_a_flood_of_tiny_jobs_from_one_client_does_not_erase_another_clients_results(books):
    """The hostile case of the result store: one client floods it; it loses
    its own oldest results, never another client's within its share. (1,000
    jobs against a store of 100 results: the 10,000 of the issue against
    10,000, scaled down for the unit tier's time.)"""
    async def go():
        book = await books(FakePipeline().run, max_finished=100, client_share=0.1, capacity=10000,
                           concurrency=1)  # one worker: jobs finish in the order sent (oldest = first sent)
        mine = [(await book.submit(f"mine{k}".encode(), OcrOptions(), client="addr:10.0.0.1"))["job_id"]
                for k in range(5)]
        await settle(book, mine)
        flood = [(await book.submit(f"f{k}".encode(), OcrOptions(), client="addr:10.6.6.6"))["job_id"]
                 for k in range(1000)]
        views = {}
        for _ in range(60000):  # until every flood job has finished (a finished one may already be gone); the bound only stops a hang
            if not (await book.acounts()).get("queued") and not (await book.acounts()).get("running"):
                break
            await asyncio.sleep(0.01)
        for i in mine + flood[-10:]:
            views[i] = await book.get(i)
        kept_flood = 0
        for i in flood:
            kept_flood += await book.get(i) is not None
        await books.close_all()
        return [views[i] for i in mine], [views[i] for i in flood[-10:]], kept_flood

    mine, newest_flood, kept_flood = run(go())
    assert [v and v["status"] for v in mine] == ["succeeded"] * 5
    assert kept_flood == 10  # the flooder's share: 0.1 of 100 results, its newest
    assert all(v is not None for v in newest_flood)


def test_one_clients_oversized_result_does_not_erase_other_clients_results(books):
    async def go():
        # share 0.25 of 4000 bytes: 1000 bytes a client; one result may be 1000 bytes
        book = await books(FakePipeline().run, max_finished_bytes=4000, client_share=0.25, concurrency=1)
        others = [(await book.submit(f"o{k}".encode(), OcrOptions(), client=f"addr:10.0.0.{k}"))["job_id"]
                  for k in range(5)]
        await settle(book, others)
        big = [(await book.submit(b"B" * 700, OcrOptions(), client="token:abc"))["job_id"] for _ in range(2)]
        huge = (await book.submit(b"H" * 5000, OcrOptions(), client="token:abc"))["job_id"]
        await settle(book, [big[1], huge])
        views = {i: await book.get(i) for i in [*others, *big, huge]}
        await books.close_all()
        return [views[i] for i in others], [views[i] for i in big], views[huge]

    others, big, huge = run(go())
    assert [v and v["status"] for v in others] == ["succeeded"] * 5
    assert huge["status"] == "failed" and huge["error"]["code"] == "result_too_large"
    # two 700-byte results do not fit one client's 1000 bytes: its older one went
    assert big[0] is None and big[1]["status"] == "succeeded"


def test_an_accepted_job_outlives_its_store(books):
    """A store that stops with a job accepted but not run (its replica
    died): the next store on the same book runs it."""
    async def go():
        first = await books(FakePipeline(open_gate=False).run, concurrency=1, lease_s=0.5)
        held = (await first.submit(b"held", OcrOptions()))["job_id"]  # claimed, stuck in the pipeline
        queued = (await first.submit(b"queued", OcrOptions(), key="k"))["job_id"]
        while (await first.get(held))["status"] != "running":
            await asyncio.sleep(0.01)
        first.close()  # the replica goes away; no result was written
        second = await books(FakePipeline().run, lease_s=0.5)
        views = await settle(second, [held, queued])
        again = await second.submit(b"queued", OcrOptions(), key="k")
        await books.close_all()
        return views, again, queued

    views, again, queued = run(go())
    assert {v["status"] for v in views.values()} == {"succeeded"}
    assert again["job_id"] == queued


def test_journal_commits_are_fsynced(tmp_path):
    from serve_app.jobs.journal import JobJournal

    j = JobJournal(tmp_path / "j.sqlite")
    assert j.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    j.close()


def test_a_submit_cancelled_during_its_journal_write_leaves_no_unseen_job(tmp_path):
    """Its client never got an id: without an Idempotency-Key the job is
    taken out of the journal again; with one, it is kept (the retry gets it)."""
    import threading

    from serve_app.jobs.journal import JobJournal

    async def go():
        path = tmp_path / "j.sqlite"
        pipe = FakePipeline(open_gate=False)
        book = JobBook(pipe.run, JobArgs(journal=str(path), concurrency=1))
        await book.start()
        entered, release = threading.Event(), threading.Event()
        add = book.journal.add

        def slow_add(job):
            entered.set()
            release.wait(30)
            add(job)

        book.journal.add = slow_add
        out = {}
        for key in (None, "k"):
            entered.clear()
            release.clear()
            task = asyncio.create_task(book.submit(key.encode() if key else b"nokey", OcrOptions(), key=key))
            while not entered.is_set():  # the write has begun
                await asyncio.sleep(0.01)
            task.cancel()
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task  # returns once the write and any roll-back are done
        book.journal.add = add
        out["again"] = await book.submit(b"k", OcrOptions(), key="k")
        out["book"] = sorted(bytes(j.image) for j in book.jobs.values())
        book.close()
        out["file"] = sorted(bytes(j.image or j.key.encode()) for j in JobJournal(path).load())
        return out

    out = run(go())
    assert out["book"] == [b"k"] and out["file"] == [b"k"]


def test_a_full_store_refuses_a_new_clients_job_and_drops_nobody_elses_result(books):
    """Many clients at once (say, many addresses), each within its share,
    fill the store (max_finished 10): the next client without results of
    its own gets a 503 with Retry-After (until the oldest result's TTL), and
    every accepted client's results stay; a client with results of its own
    gives up its own oldest for its new one."""
    async def go():
        book = await books(FakePipeline().run, max_finished=10, client_share=0.5, concurrency=1)  # finish in order
        ids = {}
        for client, n in (("addr:a", 5), ("addr:b", 3), ("addr:c", 2)):
            ids[client] = [(await book.submit(f"{client}{k}".encode(), OcrOptions(), client=client))["job_id"]
                           for k in range(n)]
            await settle(book, ids[client])
        with pytest.raises(Overloaded) as refused:
            await book.submit(b"d0", OcrOptions(), client="addr:d")
        again = (await book.submit(b"a5", OcrOptions(), client="addr:a"))["job_id"]
        await settle(book, [again])
        kept = {c: [await book.get(i) is not None for i in js] for c, js in ids.items()}
        await books.close_all()
        return kept, refused.value

    kept, refused = run(go())
    assert refused.status == 503 and refused.retry_after_s >= 1 and "other clients' results" in refused.message
    assert kept == {"addr:a": [False, True, True, True, True], "addr:b": [True] * 3, "addr:c": [True] * 2}


def test_a_lone_client_fills_the_book_but_a_share_and_is_held_to_its_share_once_another_comes(books):
    """Work-conserving shares (issue 48, item 5): one client alone in a book
    of 1,000 (client_share 0.1) gets all of its 300 small jobs accepted, and
    up to 900 (capacity less one share kept for others); once another
    client holds a job, the first is held to its share (100: refused, 503
    with Retry-After, naming the other clients), and the newcomer gets in."""
    async def go():
        pipeline = FakePipeline(open_gate=False)
        book = await books(pipeline.run, capacity=1000, client_share=0.1, concurrency=2)
        accepted = [(await book.submit(f"a{k}".encode(), OcrOptions(), client="addr:6.6.6.6"))["job_id"]
                    for k in range(300)]
        for k in range(300, 900):
            await book.submit(f"a{k}".encode(), OcrOptions(), client="addr:6.6.6.6")
        with pytest.raises(Overloaded) as alone_full:
            await book.submit(b"a900", OcrOptions(), client="addr:6.6.6.6")
        other = await book.submit(b"b0", OcrOptions(), client="addr:10.0.0.1")
        with pytest.raises(Overloaded) as shared:
            await book.submit(b"a901", OcrOptions(), client="addr:6.6.6.6")
        more = [(await book.submit(f"b{k}".encode(), OcrOptions(), client="addr:10.0.0.1"))["job_id"]
                for k in range(1, 100)]
        await books.close_all()
        return len(accepted), alone_full.value, other, shared.value, len(more)

    accepted, alone_full, other, shared, more = run(go())
    assert accepted == 300
    assert alone_full.status == 503 and "kept for other clients" in alone_full.message
    assert other["status"] == "queued" and more == 99  # the reserve: the newcomer's whole share
    assert shared.status == 503 and shared.retry_after_s >= 1 and "other clients have jobs waiting" in shared.message


def test_another_clients_job_is_the_next_one_started_behind_a_backlog(books):
    """One client's 30 jobs are queued behind the one running (one worker);
    another client's job, sent after them, starts at once (a client with
    nothing running: a place of its own), not after one more of the
    backlog's; then their jobs alternate on the worker."""
    async def go():
        pipeline = FakePipeline(open_gate=False)
        book = await books(pipeline.run, capacity=40, client_share=0.25, concurrency=1)
        for k in range(30):
            await book.submit(f"bomb{k}".encode(), OcrOptions(), client="addr:6.6.6.6")
        await until(lambda: len(pipeline.calls) == 1)  # bomb0 runs
        honest = [(await book.submit(f"honest{k}".encode(), OcrOptions(), client="addr:10.0.0.1"))["job_id"]
                  for k in range(2)]
        pipeline.gate.set()
        await settle(book, honest)
        order = [bytes(image) for image, _ in pipeline.calls]
        await books.close_all()
        return order

    order = run(go())
    assert order[:4] == [b"bomb0", b"honest0", b"bomb1", b"honest1"], order
