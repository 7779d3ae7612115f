"""What only the Redis job book promises, against real redis-servers
(harness/redis_server.py): the AOF policy checked at start, a job answered
202 surviving the server's SIGKILL, several store replicas sharing one book,
and a dead replica's job running again on another once its lease runs out."""

from __future__ import annotations

import asyncio

import pytest
from jobfakes import FakePipeline, settle
from harness.redis_server import RedisServer

from serve_app.core.errors import ConfigError
from serve_app.jobs.redis_book import RedisJobBook
from serve_app.jobs.redis_scripts import check_fsync
from serve_app.core.request_options import OcrOptions
from serve_app.core.app_args import JobArgs


def run(coro):
    return asyncio.run(coro)


def book_on(url: str, run_ocr, prefix: str = "ocr:{t}:", **args) -> RedisJobBook:
    book = RedisJobBook(run_ocr, JobArgs(backend="redis", **args), url=url, prefix=prefix)
    book.BACKOFF_S = (0.0, 0.0, 0.0)
    return book


def server(tmp_path, **kw) -> RedisServer:
    try:
        return RedisServer(tmp_path, **kw)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


def test_the_aof_policy_is_checked_against_jobs_redis_fsync():
    assert check_fsync({"appendonly": "yes", "appendfsync": "always"}, "always") is None
    assert "within a second" in check_fsync({"appendonly": "yes", "appendfsync": "everysec"}, "everysec")
    with pytest.raises(ConfigError, match="appendfsync 'everysec'.*--appendfsync always"):
        check_fsync({"appendonly": "yes", "appendfsync": "everysec"}, "always")
    with pytest.raises(ConfigError, match="appendonly 'no'"):
        check_fsync({"appendonly": "no", "appendfsync": "always"}, "everysec")


def test_a_store_refuses_to_start_on_a_server_without_fsync_always(tmp_path):
    s = server(tmp_path, fsync="everysec")
    try:
        async def go():
            strict = book_on(s.url, FakePipeline().run)
            with pytest.raises(ConfigError, match="appendfsync 'everysec'"):
                await strict.start()
            await strict.r.aclose()
            relaxed = book_on(s.url, FakePipeline().run, redis_fsync="everysec")
            await relaxed.start()  # a warning, and it runs
            job = (await relaxed.submit(b"ok", OcrOptions()))["job_id"]
            view = (await settle(relaxed, [job]))[job]
            await relaxed.aclose()
            return view

        assert run(go())["status"] == "succeeded"
    finally:
        s.stop()


def test_a_job_answered_202_survives_the_servers_sigkill(tmp_path):
    """appendfsync always: the submit's reply comes after the AOF's fsync."""
    s = server(tmp_path)
    try:
        async def submit_then_die():
            book = book_on(s.url, FakePipeline(open_gate=False).run, concurrency=1, lease_s=0.5)
            await book.start()
            ids = [(await book.submit(f"img{k}".encode(), OcrOptions()))["job_id"] for k in range(5)]
            book.close()
            return ids

        ids = run(submit_then_die())
        s.stop(kill=True)  # SIGKILL: no shutdown save; only the AOF is read back
        s.start()

        async def after():
            book = book_on(s.url, FakePipeline().run, lease_s=0.5)
            await book.start()
            views = await settle(book, ids)
            await book.aclose()
            return views

        views = run(after())
        assert [views[i]["results"] for i in ids] == [[{"text": f"img{k}"}] for k in range(5)]
    finally:
        s.stop()


def test_several_store_replicas_share_one_book_and_a_dead_ones_job_runs_again(redis_url):
    async def go():
        stuck = FakePipeline(open_gate=False)
        a = book_on(redis_url, stuck.run, concurrency=1, lease_s=0.5)
        await a.start()
        job = (await a.submit(b"held", OcrOptions()))["job_id"]
        while not stuck.calls:  # replica a's worker has claimed it
            await asyncio.sleep(0.01)
        healthy = FakePipeline()
        b = book_on(redis_url, healthy.run, concurrency=2, lease_s=0.5)
        await b.start()
        seen_on_b = await b.get(job)  # one book: b sees a's job, running there
        more = [(await b.submit(f"m{k}".encode(), OcrOptions()))["job_id"] for k in range(4)]
        await settle(b, more)  # b's own jobs run on b (a's one worker is stuck)
        a.close()  # replica a dies: its lease is not renewed again
        views = await settle(b, [job])
        on_a = await a.r.hget(f"ocr:{{t}}:job:{job}", "claims")
        await a.aclose()
        await b.aclose()
        return seen_on_b, views[job], int(on_a), healthy.calls

    seen_on_b, view, claims, b_calls = run(go())
    assert seen_on_b["status"] == "running"
    assert view["status"] == "succeeded" and view["results"] == [{"text": "held"}]
    assert claims == 2 and b"held" in [bytes(c[0]) for c in b_calls]  # claimed by a, then run by b


def test_a_job_that_kills_every_worker_fails_after_max_claims(redis_url):
    async def go():
        ids = []
        for k in range(3):  # three replicas, each dies holding the job
            stuck = FakePipeline(open_gate=False)
            book = book_on(redis_url, stuck.run, concurrency=1, lease_s=0.3, max_claims=3)
            await book.start()
            if not ids:
                ids.append((await book.submit(b"poison", OcrOptions()))["job_id"])
            while not stuck.calls:
                await asyncio.sleep(0.01)
            await book.aclose()
        last = book_on(redis_url, FakePipeline().run, lease_s=0.3, max_claims=3)
        await last.start()
        views = await settle(last, ids)
        await last.aclose()
        return views[ids[0]]

    view = run(go())
    assert view["status"] == "failed" and view["error"]["code"] == "internal"
    assert "stopped 3 times" in view["error"]["message"]


def test_a_store_refuses_a_redis_cluster(tmp_path):
    """#39 item 7: the book's scripts build key names from a prefix (no
    KEYS) and the client is not a cluster client, so a server in cluster
    mode is refused at start, naming what to use; a standalone one starts."""
    from harness.redis_server import RedisServer, free_port

    # Started as every test's server is (answers PING before it is used;
    # one that exits at start says why, with its log). Cluster mode needs
    # its port + 10000 free for the cluster bus: a port of at most 55535 (an
    # ephemeral one above that made it exit at start, now and then).
    server = RedisServer(tmp_path, port=free_port(below=55535),
                         extra=("--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "nodes.conf")))
    try:
        async def go():
            book = book_on(server.url, FakePipeline().run)
            with pytest.raises(ConfigError, match="cluster mode.*standalone Redis"):
                await book.start()
            await book.r.aclose()

        run(go())
    finally:
        server.stop()
