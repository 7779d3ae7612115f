"""A document job's pages as they are read (issue 48, item 4): each book
(SQLite, and a real redis-server) keeps a running job's pages for
JobStore.page until it ends; GET /v1/ocr/jobs/{id}/pages sends them as
NDJSON in page order over the real HTTP app (serve_app.http.app over a
Front whose job store is a real JobBook); progress in the status. The
stand-in pipeline reads a 3-page "document" whose pages finish out of
order, each when the test says (explicit steps, no sleeps)."""

from __future__ import annotations

import asyncio
import itertools
import json
import types

import httpx
import pytest

from harness.front import Method, stand_in_front
from serve_app.core.app_args import JobArgs
from serve_app.core.errors import Overloaded
from serve_app.core.request_options import OcrOptions
from serve_app.http.app import build_app
from serve_app.http.routes.jobs import STREAM_SLOTS, page_lines
from serve_app.jobs.book import JobBook
from serve_app.jobs.page_stream import StreamSlots

_names = itertools.count()


DOC = b"%PDF-1.4 doc"  # a document by its magic bytes (serve_app.flow.upload), read by Document.run


class Document:
    """run(image, options, progress): DOC is a 3-page document whose pages
    are read when `release(n)` says, in any order; anything else an image."""

    def __init__(self):
        self.released: dict[int, asyncio.Event] = {}
        self.finish = asyncio.Event()

    def gate(self, n: int) -> asyncio.Event:
        return self.released.setdefault(n, asyncio.Event())

    def release(self, n: int) -> None:
        self.gate(n).set()

    @staticmethod
    def page(n: int) -> dict:
        return {"page": n, "width": 10, "height": 10, "source": "ocr", "results": [{"text": f"page {n}"}]}

    async def run(self, image, options, progress=None):
        if bytes(image) != DOC:
            return {"image": {"width": 1, "height": 1}, "results": [{"text": "img"}]}
        progress(0, 3, [])
        done = 0

        async def one(n):
            nonlocal done
            await self.gate(n).wait()
            done += 1
            progress(done, 3, [self.page(n)])

        await asyncio.gather(*(one(n) for n in (1, 2, 3)))
        await self.finish.wait()
        return {"document": {"type": "pdf", "pages": 3}, "pages": [self.page(n) for n in (1, 2, 3)],
                "timings_ms": {"total": 1.0}}


@pytest.fixture(params=["sqlite", "redis"])
def make_book(request, tmp_path):
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None

    async def make(run) -> JobBook:
        if url:
            from serve_app.jobs.redis_book import RedisJobBook

            book = RedisJobBook(run, JobArgs(backend="redis"), url=url, prefix=f"ocr:{{pg{next(_names)}}}:")
        else:
            book = JobBook(run, JobArgs(journal=str(tmp_path / "jobs.sqlite")))
        await book.start()
        return book

    return make


async def close(book) -> None:
    if hasattr(book, "aclose"):
        await book.aclose()
    else:
        book.close()
        await book.callbacks.aclose()


async def until(check, timeout_s: float = 30.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (got := await check()):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.01)
    return got


def front_over(book):
    """A Front whose job store is `book` (its calls in this loop)."""
    front = stand_in_front()
    front.jobs = types.SimpleNamespace(submit=Method(book.submit), get=Method(book.get),
                                       get_raw=Method(book.get_raw), page=Method(book.page))
    return front


def http_over(book):
    """The real HTTP app over front_over(book) (httpx's ASGI transport hands
    the body over once it is complete: test_each_page_is_sent_while_the_job_runs
    reads the route's line generator itself)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(front_over(book))), base_url="http://test")


def lines(r: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in r.text.splitlines()]


def test_a_running_documents_pages_are_kept_in_the_book_until_it_ends(make_book):
    async def go():
        doc = Document()
        book = await make_book(doc.run)
        job = (await book.submit(DOC, OcrOptions(), client="c"))["job_id"]
        await until(lambda: book.page(job, 1))
        doc.release(2)  # page 2 is read first
        two = await until(lambda: _page(book, job, 2))
        one_before = await book.page(job, 1)
        view = await book.get(job)
        doc.release(1)
        doc.release(3)
        await until(lambda: _page(book, job, 3))
        doc.finish.set()
        await until(lambda: _done(book, job))
        after = await book.page(job, 1)
        unknown = await book.page("nope", 1)
        await close(book)
        return two, one_before, view, after, unknown

    (head, two), one_before, view, after, unknown = asyncio.run(go())
    assert json.loads(two)["results"] == [{"text": "page 2"}] and head["pages_total"] == 3
    assert one_before[1] is None and one_before[0]["status"] == "running"
    assert view["progress"] == {"pages": 3, "done": 1}
    assert after[0]["status"] == "succeeded" and json.loads(after[1]) == Document.page(1)  # now from its result
    assert unknown is None


async def _page(book, job, n):
    got = await book.page(job, n)
    return got if got and got[1] is not None else None


async def _done(book, job):
    return (await book.get(job))["status"] == "succeeded"


def test_the_pages_stream_sends_pages_in_order_as_read_then_from_the_result(make_book):
    async def go():
        doc = Document()
        book = await make_book(doc.run)
        async with http_over(book) as client:
            job = (await book.submit(DOC, OcrOptions(), client="c"))["job_id"]
            image = (await book.submit(b"img", OcrOptions(), client="c"))["job_id"]
            stream = asyncio.ensure_future(client.get(f"/v1/ocr/jobs/{job}/pages"))
            resumed = asyncio.ensure_future(client.get(f"/v1/ocr/jobs/{job}/pages?from=3"))
            for n in (3, 1, 2):  # read out of order
                doc.release(n)
            await until(lambda: _page(book, job, 2))
            doc.finish.set()
            live, tail = await stream, await resumed
            again = await client.get(f"/v1/ocr/jobs/{job}/pages?from=2")  # ended: from its result
            await until(lambda: _done(book, image))
            not_doc = await client.get(f"/v1/ocr/jobs/{image}/pages")
            missing = await client.get("/v1/ocr/jobs/nope/pages")
            bad_from = await client.get(f"/v1/ocr/jobs/{job}/pages?from=0")
        await close(book)
        return live, tail, again, not_doc, missing, bad_from

    live, tail, again, not_doc, missing, bad_from = asyncio.run(go())
    assert live.status_code == 200 and live.headers["content-type"] == "application/x-ndjson"
    assert [p["page"] for p in lines(live)] == [1, 2, 3]
    assert lines(live)[1] == Document.page(2)  # the page as the result holds it
    assert [p["page"] for p in lines(tail)] == [3] and [p["page"] for p in lines(again)] == [2, 3]
    assert not_doc.status_code == 400 and "not a document" in not_doc.json()["error"]["message"]
    assert missing.status_code == 404 and bad_from.status_code == 400


def test_each_page_is_sent_while_the_job_runs_once_the_pages_before_it_are(make_book):
    async def go():
        doc = Document()
        book = await make_book(doc.run)
        job = (await book.submit(DOC, OcrOptions(), client="c"))["job_id"]
        stream = page_lines(front_over(book), job, 1, STREAM_SLOTS.take("t"))
        doc.release(2)
        first = asyncio.ensure_future(stream.__anext__())
        await until(lambda: _page(book, job, 2))
        waited = not first.done()  # page 2 is read, page 1 is not: nothing sent yet
        doc.release(1)
        got = [await first, await stream.__anext__()]
        doc.release(3)
        got.append(await stream.__anext__())
        running = (await book.get(job))["status"]
        doc.finish.set()
        rest = [line async for line in stream]
        await close(book)
        return waited, got, running, rest

    waited, got, running, rest = asyncio.run(go())
    assert waited and [json.loads(line)["page"] for line in got] == [1, 2, 3] and all(g.endswith(b"\n") for g in got)
    assert running == "running" and rest == []  # every page sent before the job ended; the stream then closes


def test_a_client_holds_a_few_streams_at_once():
    """The most a stranger opens for the fewest bytes: many streams of a
    long job, each polling the store; a client holds 4, the replica 64."""
    slots = StreamSlots(per_client=4, total=6)
    mine = [slots.take("a") for _ in range(4)]
    with pytest.raises(Overloaded) as over:
        slots.take("a")
    others = [slots.take("b"), slots.take("c")]
    with pytest.raises(Overloaded) as full:
        slots.take("d")
    slots.give(mine[0])
    slots.give(mine[0])  # given back once only
    assert over.value.status == 503 and "its share" in over.value.message and "streams are open" in full.value.message
    assert slots.take("d") is not None and slots.open == {"a": 3, "b": 1, "c": 1, "d": 1} and others


# -- issue 59 ---------------------------------------------------------------------

class Counted:
    """book.page counted: how many store calls a stream made."""

    def __init__(self, book):
        self.book, self.calls = book, 0

    async def page(self, job_id, n):
        self.calls += 1
        return await self.book.page(job_id, n)


def test_a_running_jobs_stream_that_is_not_a_document_is_a_400_at_once(make_book):
    async def go():
        gate = asyncio.Event()

        async def hold(image, options, progress=None):
            await gate.wait()
            return {"image": {"width": 1, "height": 1}, "results": []}

        book = await make_book(hold)
        async with http_over(book) as client:
            job = (await book.submit(b"img", OcrOptions(), client="c"))["job_id"]
            await until(lambda: _status(book, job, "running"))
            r = await asyncio.wait_for(client.get(f"/v1/ocr/jobs/{job}/pages"), 30)
            held = dict(STREAM_SLOTS.open)
        gate.set()
        await close(book)
        return r, held

    r, held = asyncio.run(go())
    assert r.status_code == 400 and "not a document" in r.json()["error"]["message"] and held == {}


async def _status(book, job, status):
    return (await book.get(job))["status"] == status


def test_a_failed_documents_stream_ends_with_an_error_line(make_book):
    async def go():
        async def fails_after_one(image, options, progress=None):
            progress(1, 3, [Document.page(1)])
            await asyncio.sleep(0)
            from serve_app.core.errors import BadImage
            raise BadImage("page 2 cannot be read")

        book = await make_book(fails_after_one)
        job = (await book.submit(DOC, OcrOptions(), client="c"))["job_id"]
        stream = page_lines(front_over(book), job, 1, STREAM_SLOTS.take("t"))
        got = [line async for line in stream]
        await close(book)
        return got

    got = [json.loads(line) for line in asyncio.run(go())]
    assert got[-1] == {"status": "failed", "error": {"code": "bad_image", "message": "page 2 cannot be read"}}
    assert [g.get("page") for g in got[:-1]] in ([], [1])  # page 1 if read before the end, never an empty end


def test_an_ended_documents_stream_holds_a_slot_and_one_page_at_a_time(make_book):
    """A finished 40-page result: the stream asks the store for one page at
    a time (each line once the last is taken), and counts in the slots."""
    pages = 40

    async def run_doc(image, options, progress=None):
        return {"document": {"type": "pdf", "pages": pages}, "pages": [Document.page(n) for n in range(1, pages + 1)]}

    async def go():
        book = await make_book(run_doc)
        job = (await book.submit(DOC, OcrOptions(), client="c"))["job_id"]
        await until(lambda: _done(book, job))
        counted = Counted(book)
        front = front_over(book)
        front.jobs.page = Method(counted.page)
        stream = page_lines(front, job, 5, STREAM_SLOTS.take("t"))
        first = [await stream.__anext__(), await stream.__anext__()]
        calls_after_two = counted.calls
        rest = [line async for line in stream]
        STREAM_SLOTS.per_client, saved = 1, STREAM_SLOTS.per_client
        try:
            place = STREAM_SLOTS.take("addr:127.0.0.1")
            async with http_over(book) as client:
                refused = await client.get(f"/v1/ocr/jobs/{job}/pages")
            STREAM_SLOTS.give(place)
        finally:
            STREAM_SLOTS.per_client = saved
        await close(book)
        return first, calls_after_two, rest, refused

    first, calls, rest, refused = asyncio.run(go())
    assert [json.loads(x)["page"] for x in first + rest] == list(range(5, pages + 1))
    assert calls == 2  # two lines sent, two pages asked for: the rest not yet
    assert refused.status_code == 503  # an ended job's stream counts in the client's streams too


def test_a_retried_attempts_pages_are_counted_once():
    """Attempt 1 reads pages 1-2 and fails; attempt 2 reads 1-3: within a
    bound that holds the three pages once, all three are kept."""
    from serve_app.jobs.state import Job, JobStatus, encode_result

    job = Job(job_id="j", created=0.0, status=JobStatus.RUNNING)
    pages = [Document.page(n) for n in (1, 2, 3)]
    size = sum(len(encode_result(p)) for p in pages)
    job.progress(2, 3, pages[:2], limit=size)
    job.progress(3, 3, pages, limit=size)  # the next attempt reads the same pages again, then page 3
    assert job.page_bytes == size and sorted(job.page_results) == [1, 2, 3]


def test_the_pages_stream_as_markdown_sends_each_page_written_so(make_book):
    async def go():
        doc = Document()
        book = await make_book(doc.run)
        async with http_over(book) as client:
            job = (await book.submit(DOC, OcrOptions(structure=True), client="c"))["job_id"]
            live = asyncio.ensure_future(client.get(f"/v1/ocr/jobs/{job}/pages?format=markdown"))
            for n in (2, 1, 3):
                doc.release(n)
            doc.finish.set()
            live = await live
            ended = await client.get(f"/v1/ocr/jobs/{job}/pages?format=markdown&from=2")
            hocr = await client.get(f"/v1/ocr/jobs/{job}/pages?format=hocr")
        await close(book)
        return live, ended, hocr

    live, ended, hocr = asyncio.run(go())
    assert lines(live) == [{"page": n, "markdown": f"page {n}\n"} for n in (1, 2, 3)]
    assert lines(ended) == [{"page": n, "markdown": f"page {n}\n"} for n in (2, 3)]
    assert hocr.status_code == 400 and "json or markdown" in hocr.json()["error"]["message"]
