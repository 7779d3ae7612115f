"""The result cache and in-flight table (serve_app.http.policies.result_cache): keys,
sizes, LRU/TTL bounds, and identical concurrent requests sharing one
computation (errors shared, a waiter's own deadline, cancellation only when
no one waits)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serve_app.core.engine_config import EngineConfig, PipelineOptions
from serve_app.core.errors import BadImage, DeadlineExceeded
from serve_app.core.request_options import OcrOptions
from serve_app.http.policies.result_cache import Dedupe, Deferred, ResultCache, content_key, model_identity, result_size


def test_key_depends_on_bytes_options_and_model():
    k = content_key(b"img", OcrOptions(), "m1")
    assert k == content_key(bytearray(b"img"), OcrOptions(), "m1") == content_key(memoryview(b"img"), OcrOptions().to_dict(), "m1")
    assert k != content_key(b"img2", OcrOptions(), "m1")
    assert k != content_key(b"img", OcrOptions(return_chars=True), "m1")
    assert k != content_key(b"img", OcrOptions(), "m2")


def test_the_priority_lane_is_not_part_of_the_key():
    k = content_key(b"img", OcrOptions(), "m1")
    assert k == content_key(b"img", OcrOptions(priority="bulk"), "m1") \
        == content_key(b"img", OcrOptions(priority="interactive").to_dict(), "m1")


def test_arrays_key_on_shape_dtype_and_pixels_and_paths_are_not_cached():
    a = np.zeros((4, 6, 3), np.uint8)
    assert content_key(a, OcrOptions(), "m") == content_key(a.copy(), OcrOptions(), "m")
    assert content_key(a, OcrOptions(), "m") != content_key(a.reshape(6, 4, 3), OcrOptions(), "m")
    assert content_key(a, OcrOptions(), "m") != content_key(a.astype(np.float32), OcrOptions(), "m")
    assert content_key("/tmp/x.png", OcrOptions(), "m") is None


def test_model_identity_follows_engine_settings():
    base = model_identity(EngineConfig())
    assert base == model_identity(EngineConfig())
    assert base != model_identity(EngineConfig(pipeline=PipelineOptions(drop_score=0.9)))


def test_result_size_counts_large_extras():
    small = {"results": [{"text": "TEST", "score": 0.9}]}
    big = {**small, "visualization": "x" * 100_000}
    assert result_size(big) - result_size(small) >= 100_000
    assert result_size({"png": b"\0" * 5000}) >= 5000


def test_cache_evicts_least_recently_used_to_stay_under_max_bytes():
    c = ResultCache(max_bytes=100, ttl_s=60)
    c.put("a", "A", size=40)
    c.put("b", "B", size=40)
    assert c.get("a") == "A"  # a is now the most recent
    c.put("c", "C", size=40)
    assert c.get("b") is None and c.get("a") == "A" and c.get("c") == "C"
    assert c.bytes == 80 and len(c) == 2 and c.evictions == 1
    assert not c.put("huge", "H", size=101) and c.bytes == 80  # never kept, evicts nothing


def test_cache_entries_expire_after_ttl():
    now = [0.0]
    c = ResultCache(max_bytes=1000, ttl_s=10, clock=lambda: now[0])
    c.put("a", "A", size=10)
    now[0] = 9.9
    assert c.get("a") == "A"
    now[0] = 10.0
    assert c.get("a") is None and c.bytes == 0


class FakeCall:
    """A handle call: awaitable once, cancellable; counts what it ran."""

    def __init__(self, runs: list, delay: float = 0.05, fail: Exception | None = None):
        self.cancelled = False
        runs.append(self)
        self.task = asyncio.ensure_future(self._run(delay, fail))

    async def _run(self, delay, fail):
        await asyncio.sleep(delay)
        if fail is not None:
            raise fail
        return {"results": [{"text": "TEST"}], "run": id(self)}

    def cancel(self):
        self.cancelled = True
        self.task.cancel()

    def __await__(self):
        return self.task.__await__()


def run(coro):
    return asyncio.run(coro)


def test_identical_concurrent_requests_share_one_computation_then_hit_the_cache():
    async def go():
        runs: list = []
        d = Dedupe("m", ResultCache(1 << 20, 60), share=True)
        start = lambda deadline: FakeCall(runs)  # noqa: E731
        got = await asyncio.gather(*(d.read(b"img", OcrOptions(), 5, start) for _ in range(32)))
        again = await d.read(b"img", OcrOptions(), 5, start)
        other = await d.read(b"other", OcrOptions(), 5, start)
        return runs, got, again, other, d

    runs, got, again, other, d = run(go())
    assert len(runs) == 2  # one for the 33 identical requests, one for the other image
    assert sorted(how for _, how in got) == ["miss"] + ["shared"] * 31
    assert len({r["run"] for r, _ in got}) == 1
    assert again[1] == "hit" and again[0] == got[0][0]
    assert other[1] == "miss"
    assert d.counts == {"hit": 1, "shared": 31, "miss": 2, "bypass": 0} and not d.flights


def test_a_shared_computation_is_started_detached_and_a_request_alone_is_not():
    """A computation identical requests share is started through `detach`
    (in the service: outside the Serve request that started it, which Serve
    would cancel with its client); a request computed alone is its own."""
    async def go():
        runs, detached = [], []
        detach = lambda start, *args: detached.append(args) or start(*args)  # noqa: E731
        d = Dedupe("m", ResultCache(1 << 20, 60), share=True, detach=detach)
        start = lambda deadline: FakeCall(runs)  # noqa: E731
        await asyncio.gather(*(d.read(b"img", OcrOptions(), 5, start) for _ in range(3)))
        alone = Dedupe("m", None, share=False, detach=detach)
        await alone.read(b"img", OcrOptions(), 5, start)
        return runs, detached

    runs, detached = run(go())
    assert len(runs) == 2 and len(detached) == 1  # the shared one detached, the lone one not


def test_a_twin_that_finishes_while_a_request_is_priced_answers_it_from_the_cache():
    """Pricing runs off the loop: if an identical request's computation both
    starts and ends meanwhile, the request takes the stored answer instead of
    computing it again (seen as two computations of one batch's twin items
    on a busy core). Explicit steps: the second admission waits for the
    first computation to be stored."""
    async def go():
        runs: list = []
        d = Dedupe("m", ResultCache(1 << 20, 60), share=True)
        start = lambda deadline: FakeCall(runs)  # noqa: E731
        stored = asyncio.Event()

        async def admit_first():
            await asyncio.sleep(0)  # the second request reaches its own pricing before this one's flight starts
            return None

        async def admit_second():
            await stored.wait()  # priced slowly: the twin is computed and stored meanwhile
            return None

        first = asyncio.ensure_future(d.read(b"img", OcrOptions(), 5, start, admit=admit_first))
        second = asyncio.ensure_future(d.read(b"img", OcrOptions(), 5, start, admit=admit_second))
        got_first = await first
        stored.set()
        return runs, got_first, await second

    runs, (r1, how1), (r2, how2) = run(go())
    assert len(runs) == 1 and (how1, how2) == ("miss", "hit") and r1 == r2


def test_a_failure_reaches_every_waiter_and_is_not_cached():
    async def go():
        runs: list = []
        d = Dedupe("m", ResultCache(1 << 20, 60), share=True)
        failing = lambda deadline: FakeCall(runs, fail=BadImage("not an image"))  # noqa: E731
        got = await asyncio.gather(*(d.read(b"img", OcrOptions(), 5, failing) for _ in range(3)),
                                   return_exceptions=True)
        after = await d.read(b"img", OcrOptions(), 5, lambda deadline: FakeCall(runs))
        return runs, got, after

    runs, got, after = run(go())
    assert all(isinstance(e, BadImage) and e.message == "not an image" for e in got)
    assert len({id(e) for e in got}) == 1  # the same error
    assert after[1] == "miss" and len(runs) == 2


def test_a_waiter_past_its_deadline_leaves_without_cancelling_the_others():
    async def go():
        runs: list = []
        d = Dedupe("m", None, share=True)
        start = lambda deadline: FakeCall(runs, delay=0.3)  # noqa: E731
        short = asyncio.ensure_future(d.read(b"img", OcrOptions(), 0.05, start, "too late"))
        long = asyncio.ensure_future(d.read(b"img", OcrOptions(), 5, start))
        got = await asyncio.gather(short, long, return_exceptions=True)
        return runs, got

    runs, (short, long) = run(go())
    assert isinstance(short, DeadlineExceeded) and short.message == "too late"
    assert long[1] == "shared" and long[0]["results"][0]["text"] == "TEST"
    assert len(runs) == 1 and not runs[0].cancelled


def test_the_computation_is_cancelled_when_its_last_waiter_leaves():
    async def go():
        runs: list = []
        d = Dedupe("m", ResultCache(1 << 20, 60), share=True)
        start = lambda deadline: FakeCall(runs, delay=5)  # noqa: E731
        a = asyncio.ensure_future(d.read(b"img", OcrOptions(), 0.05, start))
        b = asyncio.ensure_future(d.read(b"img", OcrOptions(), None, start))
        await asyncio.sleep(0.01)
        b.cancel()  # a client that went away
        got = await asyncio.gather(a, b, return_exceptions=True)
        await asyncio.sleep(0)
        return runs, got, d

    runs, (a, b), d = run(go())
    assert isinstance(a, DeadlineExceeded) and isinstance(b, asyncio.CancelledError)
    assert runs[0].cancelled and not d.flights and len(d.cache) == 0


def test_a_deferred_start_makes_its_argument_then_the_call_and_its_cancellation_reaches_either():
    """Deferred (a large body put off the loop, then the handle call): a
    flight abandoned while the argument is made never makes the call; one
    abandoned after cancels the call; one not abandoned answers."""
    async def go():
        runs: list = []
        made = asyncio.Event()

        async def make(wait: bool):
            if wait:
                await made.wait()  # the put, still running (an explicit step releases it)
            return "ref"

        d = Dedupe("m", ResultCache(1 << 20, 60), share=True)
        early = asyncio.ensure_future(d.read(b"a", OcrOptions(), None, lambda _: Deferred(make(True), lambda a: FakeCall(runs, 5))))
        await asyncio.sleep(0.01)
        early.cancel()  # its client left while the body was being put
        late_start = lambda _: Deferred(make(False), lambda a: FakeCall(runs, 5))  # noqa: E731
        late = asyncio.ensure_future(d.read(b"b", OcrOptions(), None, late_start))
        for _ in range(100):
            if runs:
                break
            await asyncio.sleep(0.01)
        late.cancel()  # its client left during the call
        made.set()
        answered = await d.read(b"c", OcrOptions(), None, lambda _: Deferred(make(False), lambda a: FakeCall(runs, 0)))
        await asyncio.gather(early, late, return_exceptions=True)
        await asyncio.sleep(0)
        return runs, answered

    runs, (result, how) = run(go())
    assert len(runs) == 2 and runs[0].cancelled and not runs[1].cancelled  # the early one never called
    assert result["results"][0]["text"] == "TEST" and how == "miss"


def test_without_sharing_each_request_gets_its_own_deadline():
    async def go():
        runs: list = []
        deadlines: list = []
        d = Dedupe("m", None, share=False)

        def start(deadline):
            deadlines.append(deadline)
            return FakeCall(runs, delay=0.2)

        got = await asyncio.gather(d.read(b"img", OcrOptions(), 5, start),
                                   d.read(b"img", OcrOptions(), 0.05, start), return_exceptions=True)
        return runs, deadlines, got

    runs, deadlines, (ok, late) = run(go())
    assert len(runs) == 2 and all(dl is not None for dl in deadlines)
    assert ok[1] == "bypass"  # neither cache nor table: nothing is keyed
    assert isinstance(late, DeadlineExceeded) and runs[1].cancelled


def test_paths_bypass_the_table():
    async def go():
        runs: list = []
        d = Dedupe("m", ResultCache(1 << 20, 60), share=True)
        return [await d.read("/some/file.png", OcrOptions(), 5, lambda dl: FakeCall(runs)) for _ in range(2)], runs

    got, runs = run(go())
    assert [how for _, how in got] == ["bypass", "bypass"] and len(runs) == 2


@pytest.mark.parametrize("size", [10, 400_000])
def test_big_and_small_images_key_alike_sync_or_threaded(size):
    from serve_app.http.policies.result_cache import content_key_async

    data = bytes(range(256)) * (size // 256 + 1)
    assert run(content_key_async(data, OcrOptions(), "m")) == content_key(data, OcrOptions(), "m")


def test_no_cache_requests_are_computed_alone_and_refresh_the_cache():
    async def go():
        runs: list = []
        d = Dedupe("m", ResultCache(1 << 20, 60), share=True)
        start = lambda dl: FakeCall(runs)  # noqa: E731
        first = await d.read(b"img", OcrOptions(), 5, start)
        fresh = await d.read(b"img", OcrOptions(), 5, start, fresh=True)
        hit = await d.read(b"img", OcrOptions(), 5, start)
        return first, fresh, hit, runs

    first, fresh, hit, runs = run(go())
    assert [first[1], fresh[1], hit[1]] == ["miss", "bypass", "hit"] and len(runs) == 2
    assert hit[0]["run"] == fresh[0]["run"]


@pytest.mark.parametrize("header, want", [(None, False), ("max-age=0", False), ("no-cache", True),
                                          ("No-Store", True), ("private, no-cache=x", True)])
def test_wants_fresh(header, want):
    from serve_app.http.policies.result_cache import wants_fresh

    assert wants_fresh(header) is want


def test_a_document_answer_with_a_page_error_is_not_cached():
    """A page over its budget (or its worker busy) is an error on that page
    in a 200; kept, every request for that document got the error back
    for the cache's TTL instead of a new try at the page."""

    class PagesCall(FakeCall):
        async def _run(self, delay, fail):
            await asyncio.sleep(0)
            pages = [{"page": 1, "results": []}, {"page": 2, "results": []}]
            if fail is not None:  # here: the second page was not read
                pages[1] = {"page": 2, "error": {"code": "page_over_budget", "message": "page 2 took over 10 s"}}
            return {"document": {"type": "pdf", "pages": 2}, "pages": pages}

    async def go():
        runs: list = []
        d = Dedupe("m", ResultCache(1 << 20, 60), share=True)
        first = await d.read(b"%PDF", OcrOptions(), 5, lambda deadline: PagesCall(runs, fail=True))
        second = await d.read(b"%PDF", OcrOptions(), 5, lambda deadline: PagesCall(runs))
        third = await d.read(b"%PDF", OcrOptions(), 5, lambda deadline: PagesCall(runs))
        return runs, first, second, third

    runs, first, second, third = run(go())
    assert "error" in first[0]["pages"][1] and first[1] == "miss"
    assert second[1] == "miss" and "error" not in second[0]["pages"][1]  # read again, not the error
    assert third[1] == "hit" and len(runs) == 2  # a whole answer is kept
