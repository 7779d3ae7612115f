"""Fair, work-conserving crop batching for one recogniser predictor.

Serve's `@serve.batch` gathers *requests* (each an image's list of crops).
This scheduler, underneath it, decides which crops go into each *predictor*
batch:

- Work-conserving: a predictor batch starts as soon as the predictor is
  free, made of whatever is pending; nothing waits for company.
- Cross-request: crops of the same width bucket from different requests run
  in one predictor batch (same bucket -> same input width -> a crop reads the
  same whatever it is batched with).
- Fair: a request not yet served leads the next batch, then requests in
  progress take turns (round robin, one predictor batch per turn). An image
  with hundreds of lines no longer holds every later request's recognition
  until all of its lines are read (head-of-line blocking): a one-line image
  arriving behind it waits for the (at most two) batches already handed to
  the predictor, then runs; and newcomers and requests in progress take
  alternate batches while both wait, so the big one gets a turn every round
  of the rotation however fast small ones arrive: it never starves.
- By client: requests that name a client (a job's pages, another client's
  one image) lead batches by their client's turn, not their age: the
  client whose requests have led the fewest batches goes first (a client
  that arrives counts one less than the least served). One client's
  hundred queued pages are not all read before another client's one.
- Lanes (serve_app.core.lanes): interactive requests lead every batch while any
  has crops pending (fresh first, then in turns); bulk ones only when none
  has, or once a bulk request has waited `max_wait_s` since it came (then
  it ranks as interactive). Bulk crops fill the spare places of an
  interactive-led batch only with `bulk_fill`. While only bulk work is
  pending, `bulk_depth` batches (1) are handed to the predictor at once, so
  an interactive request arriving meanwhile waits for at most one bulk
  batch.

No Ray import: unit-tested with a plain function for the predictor.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from typing import Any, Awaitable, Callable, Optional, Union

from serve_app.core.errors import DeadlineExceeded
from serve_app.serving.isolation import run_isolated
from serve_app.core.lanes import BULK, INTERACTIVE, LANES, _Null


class _Request:
    __slots__ = ("id", "items", "buckets", "order", "pos", "received", "results", "future", "deadline", "lane",
                 "since", "client")

    def __init__(self, rid: int, items: list, buckets: list[int], future: asyncio.Future,
                 deadline: Optional[float] = None, lane: str = INTERACTIVE, client: Any = None):
        self.id = rid
        self.lane = lane
        self.client = client or None  # requests that name none share one turn (in rotation within it)
        self.since = time.monotonic()
        self.deadline = deadline  # time.time(); unread crops are dropped once it has passed
        self.items = items
        self.buckets = buckets
        # Bucket order (stable): a request's crops of one bucket are adjacent.
        self.order = sorted(range(len(items)), key=lambda i: buckets[i])
        self.pos = 0  # crops handed to a batch
        self.received = 0  # crops whose result is in
        self.results: list = [None] * len(items)
        self.future = future

    def next_bucket(self) -> int:
        return self.buckets[self.order[self.pos]]

    def done(self) -> bool:
        """Every crop handed out (results may still be on their way)."""
        return self.pos >= len(self.order)


class CropScheduler:
    """`await submit(items)` -> one result per item, in order.

    run_batch(items) -> results runs one predictor batch (it must not be
    called concurrently with itself; the scheduler guarantees that).
    bucket_of(item) -> the item's width bucket: only items of one bucket
    share a batch. batch_size: items per batch, or bucket -> items per
    batch of that bucket. on_batch(requests, items, seconds) is told about every
    predictor batch run (for metrics)."""

    def __init__(self, run_batch: Callable[[list], Awaitable[list]], bucket_of: Callable[[Any], int],
                 batch_size: Union[int, Callable[[int], int]], on_batch: Optional[Callable[[int, int, float], None]] = None):
        self.run_batch = run_batch
        self.bucket_of = bucket_of
        # Items per batch, as a function of the bucket.
        self.limit: Callable[[int], int] = batch_size if callable(batch_size) else (lambda _bucket: batch_size)
        self.on_batch = on_batch
        self.queue: deque[_Request] = deque()
        # False: a predictor batch holds one request's crops only ("batching off").
        self.cross_request = True
        # Predictor batches handed to the predictor's thread at once (its
        # queue is FIFO): 2 hides this loop's wake-up between batches.
        self.depth = 2
        # Lanes (set by the deployment from serve_app.core.app_args.LaneArgs);
        # lanes=False: every request is one lane (the scheduler as before).
        self.lanes = True
        self.max_wait_s = 5.0
        self.bulk_fill = False
        self.bulk_depth = 1
        self.promoted = 0  # bulk batches led by age while interactive crops were pending
        self.metrics: Any = _Null()  # serve_app.serving.metrics.LaneMetrics
        self._ids = itertools.count()
        self._fresh_led = False  # the last batch was led by a newcomer
        self.turns: dict[Any, int] = {}  # client -> batches its requests have led (while it has some here)
        self._entered: dict[Any, int] = {}  # client -> its turn's count when it came
        self._worker: Optional[asyncio.Task] = None
        # True from a submit until the worker has nothing queued or running;
        # read from the predictor's thread too (serve_app.serving.shapes_after_ready).
        self.active = False

    async def wait_idle(self) -> None:
        """Return once nothing is queued here or running on the predictor."""
        while self.active and self._worker is not None and not self._worker.done():
            await asyncio.wait({self._worker})

    @property
    def pending_items(self) -> int:
        return sum(len(r.order) - r.pos for r in self.queue)

    def pending_by_lane(self) -> dict[str, int]:
        out = dict.fromkeys(LANES, 0)
        for r in self.queue:
            out[r.lane if r.lane in out else INTERACTIVE] += len(r.order) - r.pos
        return out

    def _urgent(self, r: _Request, now: float) -> bool:
        return not self.lanes or r.lane != BULK or now - r.since >= self.max_wait_s

    async def submit(self, items: list, deadline: Optional[float] = None, lane: str = INTERACTIVE,
                     client: Any = None) -> list:
        """One result per item. With a deadline (time.time()), crops not yet
        handed to the predictor when it passes are dropped and the caller
        gets DeadlineExceeded; a cancelled caller's unread crops are dropped too.
        `client`: whose turn the request takes (None: the turn of all that name none)."""
        if not items:
            return []
        fut = asyncio.get_running_loop().create_future()
        req = _Request(next(self._ids), list(items), [self.bucket_of(x) for x in items], fut, deadline, lane, client)
        if req.client not in self.turns:  # a client arriving: next in turn
            self._enter(req.client)
        self.queue.append(req)
        self.active = True
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work())
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            # The caller gave up (deadline, disconnect): drop what is not read yet.
            if req in self.queue:
                self.queue.remove(req)
                self._forget(req.client)
            raise

    def _take(self) -> list[tuple[_Request, int]]:
        """The next predictor batch. Its leader is the oldest request that
        has not been served yet, else the request at the head of the
        rotation; the leader picks the width bucket and fills the batch
        first, then unserved requests, then the rest in rotation order add
        their crops of that bucket. The leader then goes to the back of the
        rotation. While both newcomers and requests in progress wait, they
        lead alternate batches. So a newcomer runs in the next batch or the
        one after (most images need one to three batches), and every request
        in progress gets a turn per round of the rotation: no request
        starves, however many small ones arrive.
        With lanes, all this among the urgent requests (interactive, or
        bulk waiting max_wait_s) while there are any, else among bulk."""
        now = time.time()
        for r in [r for r in self.queue if r.deadline is not None and now > r.deadline and not r.done()]:
            self._finish(r, DeadlineExceeded("the request's deadline passed before all its crops were read; "
                                             "the rest were dropped"))
        waiting = [r for r in self.queue if not r.done()]
        if not waiting:
            return []
        mono = time.monotonic()
        urgent = [r for r in waiting if self._urgent(r, mono)]
        pool = urgent or waiting
        fresh = [r for r in pool if r.pos == 0]
        started = [r for r in pool if r.pos > 0]
        # Newcomers and requests in progress alternate while both wait: a
        # stream of newcomers (each needing a batch or two) never holds
        # the rotation back for good. Among either, the client with the
        # fewest batches led goes first (min keeps the queue's order within it).
        candidates = fresh if fresh and not (started and self._fresh_led) else (started or pool)
        leader = min(candidates, key=lambda r: self.turns.get(r.client, 0))
        self._fresh_led = leader.pos == 0
        self.turns[leader.client] = self.turns.get(leader.client, 0) + 1
        if leader.lane == BULK and self.lanes and urgent and any(r.lane != BULK for r in waiting):
            self.promoted += 1  # aged bulk ahead of interactive work
            self.metrics.promotions.inc()
        bucket = leader.next_bucket()
        limit = self.limit(bucket)
        picked: list[tuple[_Request, int]] = []
        others = [r for r in fresh if r is not leader] + [r for r in pool if r.pos > 0 and r is not leader]
        if urgent and self.bulk_fill and len(urgent) < len(waiting):  # bulk fills an interactive-led batch
            rest = [r for r in waiting if r not in urgent]
            others += [r for r in rest if r.pos == 0] + [r for r in rest if r.pos > 0]
        for req in [leader] + (others if self.cross_request else []):
            if req.pos == 0 and req.lane == BULK and self.lanes and req.next_bucket() == bucket:
                self.metrics.bulk_wait.observe((mono - req.since) * 1000)
            while (len(picked) < limit and not req.done()
                   and req.next_bucket() == bucket):
                picked.append((req, req.order[req.pos]))
                req.pos += 1
            if len(picked) >= limit:
                break
        self.queue.remove(leader)
        self.queue.append(leader)
        for lane, n in self.pending_by_lane().items():
            self.metrics.queued.set(n, tags={"lane": lane})
        return picked

    def _depth(self) -> int:
        """Batches to keep handed to the predictor: `depth`, but
        `bulk_depth` while no urgent (interactive or aged) crop is pending."""
        if not self.lanes:
            return self.depth
        mono = time.monotonic()
        if any(not r.done() and self._urgent(r, mono) for r in self.queue):
            return self.depth
        return min(self.depth, self.bulk_depth)

    def _enter(self, client: Any) -> None:
        """A client arriving goes before every client that has led a batch
        since it came, beside (after, by age) those that have not yet."""
        floor = min(self.turns.values(), default=0)
        waiting = any(t == floor and self._entered.get(c) == t for c, t in self.turns.items())
        self.turns[client] = self._entered[client] = floor if waiting or not self.turns else floor - 1

    def _forget(self, client: Any) -> None:
        """A client with no request here leaves the turn."""
        if not any(r.client == client for r in self.queue):
            self.turns.pop(client, None)
            self._entered.pop(client, None)

    def _finish(self, req: _Request, error: Optional[BaseException] = None) -> None:
        if req in self.queue:
            self.queue.remove(req)
            self._forget(req.client)
        if not req.future.done():
            if error is not None:
                req.future.set_exception(error)
            else:
                req.future.set_result(req.results)

    async def _work(self) -> None:
        try:
            await self._loop()
        except BaseException as e:  # never leave a caller waiting on a dead worker
            for req in list(self.queue):
                self._finish(req, e if isinstance(e, Exception) else RuntimeError("recogniser stopped"))
            raise
        finally:
            self.active = False

    async def _loop(self) -> None:
        """Keeps `depth` batches handed to the predictor's thread, so it
        never idles while this loop wakes up to compose the next one."""
        inflight: deque = deque()
        last_end = 0.0
        while True:
            while len(inflight) < self._depth():
                picked = self._take() if self.queue else []
                if not picked:
                    break
                # One predictor batch; if it fails, each request's share runs
                # alone and only a request whose share fails gets the error.
                parts: dict[int, list[tuple[_Request, int]]] = {}
                for req, i in picked:
                    parts.setdefault(req.id, []).append((req, i))
                shares = list(parts.values())
                fut = asyncio.ensure_future(
                    run_isolated(self.run_batch, [[req.items[i] for req, i in share] for share in shares]))
                inflight.append((shares, time.perf_counter(), fut))
            if not inflight:
                return
            shares, t_sub, fut = inflight.popleft()
            answers = await fut
            end = time.perf_counter()
            for share, answer in zip(shares, answers):
                req = share[0][0]
                if isinstance(answer, Exception):
                    self._finish(req, answer)
                    continue
                for (_, i), r in zip(share, answer):
                    req.results[i] = r
                req.received += len(share)
                if req.received >= len(req.items):
                    self._finish(req)
            if self.on_batch is not None:
                # compute time: from when the thread could start it (the previous batch's end)
                self.on_batch(len(shares), sum(len(s) for s in shares), end - max(t_sub, last_end))
            last_end = end
