"""Stored job results as they are sent, made once per ingress replica and
reused: GET /v1/ocr/jobs/{job_id} of a succeeded job in any format (the
JSON body spliced from its stored bytes, or text, hOCR, ALTO written by the
render pool) is made by one request, kept (least recently used first out,
at most `max_bytes` in all) and streamed to every reader from the one
copy, in chunks. Readers that come while it is being made wait on that one
making; the bytes are fetched from the job store only then. So sixteen
readers of one large result cost one fetch, one render and one copy, not
sixteen (they took ~1 GB of the ingress and /healthz 4.7 s). A succeeded
job's result never changes; the job store is asked for its status
(JobStore.head) at most once per HEAD_KEEP_S per ended job and ingress
replica (an expired job is a 404 within that), never for its bytes when
they are kept. No Ray import."""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

from fastapi.responses import JSONResponse, Response, StreamingResponse

from serve_app.core.errors import NotFound
from serve_app.flow.formats import MEDIA_TYPES
from serve_app.flow.render_pool import Place
from serve_app.http.policies.result_cache import ResultCache
from serve_app.jobs.state import job_body

CHUNK_BYTES = 256 * 1024  # a streamed answer is sent in pieces of this size (each copied once, then dropped)
# An ended job's head (its status, the result's size) is kept this long per ingress replica: a client reading one
# result in a loop (with a new token each time) made a job store call from the ingress's loop per read.
HEAD_KEEP_S = 1.0
MAX_HEADS = 1024  # heads kept at most (least recently used go first)


class Answers:
    """Made answers by key: kept within `max_bytes`, made once at a time per key."""

    def __init__(self, max_bytes: int, bytes_per_s: float = 0, ttl_s: float = 3600.0):
        self.pacer = Pacer(bytes_per_s) if bytes_per_s > 0 else None
        self.cache = ResultCache(max_bytes, ttl_s) if max_bytes > 0 else None
        self.making: dict[str, asyncio.Future] = {}
        self.made = 0  # answers made (not found kept, not joined)
        self.joined = 0  # reads that waited on another read's making
        self.hits = 0
        self.heads = ResultCache(MAX_HEADS, HEAD_KEEP_S)  # job id -> an ended job's head (each counts 1)

    def head(self, job_id: str) -> Any:
        """An ended job's head as kept within HEAD_KEEP_S, else None."""
        return self.heads.get(job_id)

    def keep_head(self, job_id: str, found: Any) -> None:
        self.heads.put(job_id, found, 1)

    async def get(self, key: str, make: Callable[[], Awaitable[tuple[bytes, str]]]) -> tuple[bytes, str]:
        """(bytes, media type) kept under `key`, or made by `make()` (once,
        however many ask meanwhile; a reader that leaves does not stop it)."""
        if self.cache is not None:
            found = self.cache.get(key)
            if found is not None:
                self.hits += 1
                return found
        flight = self.making.get(key)
        if flight is None:
            flight = asyncio.ensure_future(make())
            self.making[key] = flight
            self.made += 1
            flight.add_done_callback(lambda f: self._made(key, f))
        else:
            self.joined += 1
        return await asyncio.shield(flight)

    def _made(self, key: str, flight: asyncio.Future) -> None:
        self.making.pop(key, None)
        if self.cache is not None and not flight.cancelled() and flight.exception() is None:
            content, media = flight.result()
            self.cache.put(key, (content, media), len(content))

    def stats(self) -> dict[str, Any]:
        return {"kept": len(self.cache) if self.cache is not None else 0,
                "bytes": self.cache.bytes if self.cache is not None else 0,
                "made": self.made, "joined": self.joined, "hits": self.hits, "making": len(self.making)}


class Pacer:
    """The pace of every streamed answer together: at most `rate` bytes a
    second (a token bucket of `burst` bytes). Serve's replica takes an
    app's pieces as fast as they come and keeps those its proxy has not
    taken yet, so an answer written at once is held whole in the ingress
    (16 readers of an 8.7 MB hOCR: +250 MB) and sent at whatever CPU it
    takes from everything else (/healthz 0.9 s); paced, the answers in
    flight hold a few pieces and their sending is a bounded share of a core."""

    def __init__(self, rate: float, burst: int = 4 * CHUNK_BYTES, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.at = clock()

    def wait_s(self, n: int) -> float:
        """Seconds to wait before `n` bytes may go (0: take them now, and they are taken)."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= min(n, self.burst):
            self.tokens -= n  # may go below 0: the next piece waits for it
            return 0.0
        return (min(n, self.burst) - self.tokens) / self.rate

    async def take(self, n: int) -> None:
        while True:
            wait = self.wait_s(n)
            if wait <= 0:
                return
            await asyncio.sleep(wait)


def streamed(content: bytes, media_type: str, place: Optional[Place] = None,
             pacer: Optional[Pacer] = None) -> Response:
    """`content` sent in CHUNK_BYTES pieces at the pacer's pace: a reader
    holds a few pieces at a time of the ingress's memory, never a copy of
    the whole answer. `place` (a large result's read place) is held until
    the last piece is sent, or the answer is dropped."""
    if len(content) <= CHUNK_BYTES:
        if place is not None:
            place.release()
        return Response(content, media_type=media_type)

    async def pieces() -> AsyncIterator[bytes]:
        try:
            view = memoryview(content)
            for at in range(0, len(view), CHUNK_BYTES):
                if pacer is not None:
                    await pacer.take(min(CHUNK_BYTES, len(view) - at))
                yield bytes(view[at:at + CHUNK_BYTES])
        finally:
            if place is not None:
                place.release()

    stream = pieces()
    if place is not None:
        weakref.finalize(stream, place.release)  # a response never started still gives its place back
    return StreamingResponse(stream, media_type=media_type, headers={"Content-Length": str(len(content))})


async def job_answer(front: Any, job_id: str, fmt: str, downstream: Callable) -> Response:
    """GET /v1/ocr/jobs/{job_id}: its status (JSON) while it is not done,
    else its result in `fmt`, made once and streamed (module doc). The job
    store is asked for the status first (JobStore.head), and for the
    stored bytes only to make an answer not kept. A large result's read
    (its making, or waiting on it, and its sending) holds one of the render
    pool's read places (RenderPool.read_place: a few at once, a few more
    waiting briefly, else 503). An ended job's head is kept HEAD_KEEP_S."""
    found = front.answers.head(job_id)
    if found is None:
        found = await downstream(front.jobs.head.remote(job_id))
        if found is None:
            raise NotFound(f"no job {job_id!r}: unknown, or expired after its time to live")
        if found[0].get("status") in ("succeeded", "failed"):  # ended: it changes no more (but its delivery)
            front.answers.keep_head(job_id, found)
    head, size = found
    if head.get("status") != "succeeded" or size is None:
        return JSONResponse(head)

    async def make() -> tuple[bytes, str]:
        got = await downstream(front.jobs.get_raw.remote(job_id))  # the stored bytes, never parsed there
        if got is None or got[1] is None:
            raise NotFound(f"no job {job_id!r}: unknown, or expired after its time to live")
        if fmt == "json":  # the stored bytes as they are, the status fields spliced in front
            return await asyncio.to_thread(job_body, got[0], got[1]), MEDIA_TYPES["json"]
        return await front.renders.render(got[1], fmt)  # parsed and written in a render child

    place = await front.renders.read_place(size)
    try:
        # JSON carries the status fields, which change after the job ends (its callback's delivery): a
        # changed head is another answer. The rendered formats carry the result alone.
        fields = json.dumps(head, sort_keys=True) if fmt == "json" else ""
        content, media = await front.answers.get(f"{job_id}|{head.get('finished_at')}|{fmt}|{fields}", make)
    except BaseException:
        place.release()
        raise
    return streamed(content, media, place, front.answers.pacer)
