"""Job results as sent (serve_app.http.policies.answers): made once however
many read them at once, kept within a bound of bytes, streamed at a pace;
and the render pool's read places (a few at once, a few more waiting,
then 503). Explicit steps, no timed assertion. No Ray."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.core.errors import Overloaded
from serve_app.flow.render_pool import RenderPool, render_here
from serve_app.http.policies.answers import CHUNK_BYTES, Answers, Pacer, streamed


def test_readers_at_once_share_one_making_and_later_ones_find_it_kept():
    async def go():
        answers = Answers(max_bytes=1000)
        gate = asyncio.Event()
        made = []

        async def make():
            made.append(1)
            await gate.wait()
            return b"x" * 100, "text/plain"

        readers = [asyncio.ensure_future(answers.get("j|1|hocr", make)) for _ in range(16)]
        await asyncio.sleep(0)
        readers[0].cancel()  # the first reader leaves: the making goes on for the others
        gate.set()
        got = await asyncio.gather(*readers[1:])
        later = await answers.get("j|1|hocr", make)
        return made, got, later, answers.stats()

    made, got, later, stats = asyncio.run(go())
    assert made == [1] and all(g == (b"x" * 100, "text/plain") for g in got) and later == got[0]
    assert stats["made"] == 1 and stats["joined"] == 15 and stats["hits"] == 1 and stats["bytes"] == 100


def test_kept_answers_stay_within_their_bytes_oldest_out_first_and_a_failed_making_is_not_kept():
    async def go():
        answers = Answers(max_bytes=250)
        for k in range(5):
            await answers.get(f"job{k}", lambda k=k: _made(b"%d" % k * 100))
        kept = sorted(answers.cache._entries)

        async def fails():
            raise Overloaded("busy", retry_after_s=1)

        with pytest.raises(Overloaded):
            await answers.get("bad", fails)
        return kept, answers.cache.bytes, "bad" in answers.cache._entries, answers.making

    kept, size, bad_kept, making = asyncio.run(go())
    assert kept == ["job3", "job4"] and size == 200 and not bad_kept and making == {}


async def _made(content: bytes):
    return content, "text/plain"


def test_the_pacer_lets_a_burst_through_then_holds_every_sender_to_its_rate_together():
    now = [0.0]
    pacer = Pacer(rate=1000, burst=1000, clock=lambda: now[0])
    assert pacer.wait_s(600) == 0 and pacer.wait_s(400) == 0  # the burst
    assert pacer.wait_s(500) == pytest.approx(0.5)  # another sender: the same bucket
    now[0] = 0.5
    assert pacer.wait_s(500) == 0
    assert pacer.wait_s(2000) == pytest.approx(1.0)  # over the burst: waits for a burst, takes it all
    now[0] = 1.5
    assert pacer.wait_s(2000) == 0 and pacer.tokens == -1000  # the next one waits for that


def test_a_streamed_answer_comes_whole_in_pieces_and_gives_its_place_back():
    async def go():
        pool = RenderPool(large_bytes=10, max_large_reads=1, renderer=render_here, read_wait_s=0)
        content = bytes(range(256)) * (3 * CHUNK_BYTES // 256 + 7)
        place = await pool.read_place(len(content))
        held = pool.large_reads
        response = streamed(content, "application/json", place, Pacer(1e12))
        pieces = [p async for p in response.body_iterator]
        left = pool.large_reads
        dropped = streamed(content, "application/json", await pool.read_place(len(content)), None)
        del dropped  # never sent (its client left before): the place comes back all the same
        pool.close()
        return content, pieces, held, left, pool.large_reads, response.headers["content-length"]

    content, pieces, held, left, after, length = asyncio.run(go())
    assert b"".join(pieces) == content and len(pieces) == 4 and all(len(p) <= CHUNK_BYTES for p in pieces)
    assert held == 1 and left == 0 and after == 0 and int(length) == len(content)


def test_large_reads_past_their_places_wait_for_one_then_get_a_503():
    async def go():
        pool = RenderPool(large_bytes=10, max_large_reads=1, renderer=render_here, read_wait_s=30)
        pool.READ_WAITERS = 1
        first = await pool.read_place(100)
        small = await pool.read_place(5)  # not large: passes
        waiting = asyncio.ensure_future(pool.read_place(100))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded) as full:  # one waits already: no room to wait
            await pool.read_place(100)
        first.release()  # the place passes to the one waiting
        second = await waiting
        held = pool.large_reads
        second.release()
        small.release()
        pool.read_wait_s = 0.01
        a = await pool.read_place(100)
        with pytest.raises(Overloaded):  # waited its time, no place came
            await pool.read_place(100)
        a.release()
        pool.close()
        return full.value, held, pool.large_reads, list(pool._read_waiters)

    full, held, after, waiters = asyncio.run(go())
    assert full.status == 503 and full.retry_after_s >= 1
    assert held == 1 and after == 0 and waiters == []


def test_an_ended_jobs_head_is_asked_of_the_job_store_once_per_keep_period_and_a_running_ones_every_read():
    """A client reading one result in a loop (a new token each time) made a
    job store call from the ingress's loop per read: an ended job's head is
    kept HEAD_KEEP_S (fake clock), a running job's is asked every time."""
    import types

    from serve_app.http.policies.answers import HEAD_KEEP_S, job_answer

    heads = []
    views = {"done": ({"job_id": "done", "status": "succeeded", "finished_at": 1.0}, 2),
             "busy": ({"job_id": "busy", "status": "running"}, None)}

    async def head(job_id):
        heads.append(job_id)
        return views.get(job_id)

    async def get_raw(job_id):
        return views[job_id][0], b"{}"

    class Call:
        def __init__(self, fn):
            self.fn = fn

        def remote(self, *a):
            return self.fn(*a)

    now = [0.0]
    front = types.SimpleNamespace(jobs=types.SimpleNamespace(head=Call(head), get_raw=Call(get_raw)),
                                  answers=Answers(max_bytes=1000),
                                  renders=RenderPool(1, 1, 1 << 20, 1, renderer=render_here, read_wait_s=0))
    front.answers.heads.clock = lambda: now[0]

    async def go():
        async def downstream(call):
            return await call

        codes = []
        for _ in range(5):
            codes.append((await job_answer(front, "done", "json", downstream)).status_code)
            codes.append((await job_answer(front, "busy", "json", downstream)).status_code)
        now[0] += HEAD_KEEP_S
        codes.append((await job_answer(front, "done", "json", downstream)).status_code)
        return codes

    codes = asyncio.run(go())
    front.renders.close()
    assert set(codes) == {200}
    assert heads.count("done") == 2 and heads.count("busy") == 5
