"""The job store's journal: a restarted store (a new JobStore on the same
file) finishes the jobs the old one accepted and still serves the finished
ones; nothing accepted is lost. The store's class is used directly, with a
stand-in pipeline handle (no Ray cluster needed)."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from serve_app.errors import BadImage
from serve_app.job_journal import JobJournal
from serve_app.jobs import JobArgs, JobStore

Store = JobStore.func_or_class  # the plain class under @serve.deployment


class _Call:
    def __init__(self, pipeline: "FakePipeline"):
        self.pipeline = pipeline

    async def remote(self, image, options):
        self.pipeline.calls.append(image)
        await self.pipeline.gate.wait()
        if image == b"bad":
            raise BadImage("not an image")
        return {"results": [{"text": bytes(image).decode()}], "options": options}


class FakePipeline:
    """`pipeline.ocr.remote(image, options)` like a DeploymentHandle; answers
    only once `gate` is set."""

    def __init__(self, open_gate: bool = True):
        self.calls: list = []
        self.gate = asyncio.Event()
        if open_gate:
            self.gate.set()
        self.ocr = _Call(self)


async def settle(store, ids, timeout_s=30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        views = {i: await store.get(i) for i in ids}
        if all(v and v["status"] in ("succeeded", "failed") for v in views.values()):
            return views
        await asyncio.sleep(0.01)
    raise TimeoutError(views)


def test_a_restarted_store_runs_the_unfinished_jobs_and_keeps_the_results(tmp_path):
    path = tmp_path / "jobs" / "journal.sqlite"  # the folder is created

    async def first_life():
        store = Store(FakePipeline(), JobArgs(journal=str(path), concurrency=2))
        done = (await store.submit(b"early", {"lang": "en"}, "key-1"))["job_id"]
        failed = (await store.submit(b"bad", None))["job_id"]
        await settle(store, [done, failed])
        stuck = FakePipeline(open_gate=False)  # the pipeline stops answering: these stay queued or running
        store.pipeline = stuck
        pending = [(await store.submit(f"late-{i}".encode(), None))["job_id"] for i in range(5)]
        deadline = time.monotonic() + 10
        while len(stuck.calls) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert len(stuck.calls) == 2  # two running (concurrency 2), three queued
        for w in store.workers:  # the replica dies
            w.cancel()
        return done, failed, pending

    done, failed, pending = asyncio.run(first_life())

    async def second_life():
        pipeline = FakePipeline()
        store = Store(pipeline, JobArgs(journal=str(path), concurrency=2))
        # Finished jobs answer at once, from the file; the idempotency key still maps.
        assert (await store.get(done))["results"] == [{"text": "early"}]
        assert (await store.get(failed))["error"]["code"] == "bad_image"
        assert (await store.submit(b"other", None, "key-1"))["job_id"] == done
        views = await settle(store, pending)
        assert [views[j]["results"] for j in pending] == [[{"text": f"late-{i}"}] for i in range(5)]
        assert sorted(pipeline.calls) == [f"late-{i}".encode() for i in range(5)]  # each run again, once

    asyncio.run(second_life())
    # Finished jobs keep their result but not their image.
    rows = {r["job_id"]: r for r in JobJournal(path).load()}
    assert set(rows) == {done, failed, *pending}
    assert all(r["image"] is None and r["finished"] for r in rows.values())


def test_expired_jobs_leave_the_journal(tmp_path):
    path = tmp_path / "journal.sqlite"

    async def go():
        store = Store(FakePipeline(), JobArgs(journal=str(path), ttl_s=0.05))
        job = (await store.submit(b"x", None))["job_id"]
        await settle(store, [job])
        await asyncio.sleep(0.1)
        assert await store.get(job) is None

    asyncio.run(go())
    assert JobJournal(path).load() == []


def test_array_images_round_trip_without_pickle(tmp_path):
    j = JobJournal(tmp_path / "j.sqlite")
    img = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    j.add("a", 1.0, None, None, img)
    j.add("b", 2.0, "k", {"return_chars": True}, b"\x89PNG")
    a, b = j.load()
    assert np.array_equal(a["image"], img) and a["options"] is None
    assert b["image"] == b"\x89PNG" and b["key"] == "k" and b["options"] == {"return_chars": True}


def test_without_a_journal_jobs_are_in_memory_only(tmp_path):
    async def go():
        store = Store(FakePipeline(), JobArgs())
        job = (await store.submit(b"x", None))["job_id"]
        assert (await settle(store, [job]))[job]["status"] == "succeeded"
        assert store.journal is None

    asyncio.run(go())
    assert list(tmp_path.iterdir()) == []
