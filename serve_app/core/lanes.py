"""Priority lanes: `interactive` work (sync HTTP, handle calls) is served
first, `bulk` work (jobs, `OcrClient.map`, `X-Priority: bulk`) gets the spare
capacity, and a bulk item that has waited longer than `bulk_max_wait_s` at
one queue is served as if it were interactive (so bulk never starves).

The lane travels with a request in its options (`OcrOptions.priority`; None
until the entry point resolves it) and in its RequestContext
(serve_app.core.request_context), which every stage call is given. It never changes a result and is not part
of the result cache's key.

The two queues every lane-aware place uses, pure (no Ray), unit-tested:
- `PriorityGate`: at most `capacity` (weighted) items through at once,
  interactive first, bulk by age; in front of a FIFO queue that cannot be
  reordered (Serve's `@serve.batch`), or as a cap on bulk work in flight.
- `LaneQueue`: the job store's queue of jobs, interactive first, bulk by age.
The recogniser's crop scheduler (serve_app.serving.crop_scheduler) orders its own
predictor batches the same way."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict, deque
from typing import Any, AsyncIterator, Callable, Literal, Optional, Union

INTERACTIVE = "interactive"
BULK = "bulk"
LANES = (INTERACTIVE, BULK)
Lane = Literal["interactive", "bulk"]

def lane_of(priority: Optional[str], default: str = INTERACTIVE) -> str:
    """A request's lane: its own `priority`, else its entry point's default."""
    return priority if priority in LANES else default


class _Null:
    """Metrics stand-in: every metric, every call a no-op."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return None


class _Waiter:
    __slots__ = ("lane", "weight", "since", "seq", "future", "owner")

    def __init__(self, lane: str, weight: int, since: float, seq: int, future: asyncio.Future, owner: Any = None):
        self.lane, self.weight, self.since, self.seq, self.future = lane, weight, since, seq, future
        self.owner = owner


class PriorityGate:
    """`async with gate.hold(lane, weight): ...` lets at most `capacity`
    weight through at once (an item heavier than the capacity goes through
    alone). Waiters are admitted interactive first (oldest first), then bulk
    (oldest first); a bulk waiter that has waited `max_wait_s` ranks as
    interactive from then on (by its arrival: an aged bulk item precedes
    interactive items that came after it), but aged bulk and interactive
    waiters then take turns: after an aged bulk item is let through, the
    next place goes to an interactive waiter if one waits. Bulk never
    starves, and an interactive item waits behind at most one aged bulk
    item per place (two clients' pages had their 8 tiles, aged in the
    detector's queue, all go before a one-word image: 6-10 s). No waiter
    overtakes a better ranked one that does not fit yet. When the bulk lane's turn comes, the
    places go to owners (say, a document being read: its pages) in turn:
    the bulk waiter whose owner has been given the fewest goes first (a new
    owner counts one less than the least served, so it is next), then the
    oldest: a one-page job's page is not queued behind every page of the
    documents read before it.

    `bulk_capacity` (None: all of it) caps the weight bulk items hold at
    once (an item through alone when no bulk is held), e.g. so that a batch
    of bulk work, which cannot be interrupted, stays short.

    `lanes=False` (everything one lane): plain FIFO. `bypass` lanes are not
    gated at all (e.g. a cap on bulk work only: bypass=("interactive",)).
    `metrics` (serve_app.serving.metrics.LaneMetrics or None) is told queued counts
    per lane, each bulk wait, and each promotion by age."""

    def __init__(self, capacity: Union[int, Callable[[], int]], max_wait_s: float, lanes: bool = True,
                 bypass: tuple[str, ...] = (), metrics: Any = None, clock: Callable[[], float] = time.monotonic,
                 bulk_capacity: Optional[int] = None):
        self.capacity: Callable[[], int] = capacity if callable(capacity) else (lambda: capacity)
        self.bulk_capacity = bulk_capacity if lanes else None
        self.bulk_used = 0
        self.max_wait_s = max_wait_s
        self.lanes = lanes
        self.bypass = bypass
        self.metrics = metrics or _Null()
        self.clock = clock
        self.used = 0
        self.waiters: list[_Waiter] = []
        self.held: dict[Any, int] = {}  # owner -> places it holds (owners given)
        self.given: dict[Any, int] = {}  # owner -> places given it while it holds or waits (its turn's count)
        self.promoted = 0
        self._aged_last = False  # the last place went to an aged bulk waiter ahead of interactive ones
        self._seq = itertools.count()

    def queued(self, lane: str) -> int:
        return sum(1 for w in self.waiters if w.lane == lane)

    def _next(self, now: float) -> _Waiter:
        """Interactive first (oldest first), unless the oldest bulk waiter has
        waited max_wait_s and came before it: then, as whenever only bulk
        waits, the bulk waiter whose owner holds the fewest places (then the oldest)."""
        if not self.lanes:
            return min(self.waiters, key=lambda w: w.seq)
        first = min((w for w in self.waiters if w.lane != BULK), key=lambda w: (w.since, w.seq), default=None)
        bulk = [w for w in self.waiters if w.lane == BULK]
        if bulk:
            oldest = min(bulk, key=lambda w: (w.since, w.seq))
            if first is None or (now - oldest.since >= self.max_wait_s and oldest.since <= first.since
                                 and not self._aged_last):
                return min(bulk, key=lambda w: (self.given.get(w.owner, 0), w.since, w.seq))
        return first

    def _forget(self, owner: Any) -> None:
        """An owner that holds nothing and waits for nothing leaves the turn."""
        if owner is not None and owner not in self.held and not any(w.owner == owner for w in self.waiters):
            self.given.pop(owner, None)

    def _admit(self) -> None:
        now = self.clock()
        while self.waiters:
            best = self._next(now)
            if best.future.done():
                # Its caller was cancelled (deadline, client gone) and has not
                # yet run its clean-up: it takes no turn (set_result on its
                # future would raise, and the turn would never be given back).
                self.waiters.remove(best)
                self._forget(best.owner)
                continue
            if self.used > 0 and self.used + best.weight > self.capacity():
                break
            if (best.lane == BULK and self.bulk_capacity is not None and self.bulk_used > 0
                    and self.bulk_used + best.weight > self.bulk_capacity):
                break  # only bulk waits (interactive ranks first): its share is full
            self.waiters.remove(best)
            self.used += best.weight
            if best.owner is not None:
                self.held[best.owner] = self.held.get(best.owner, 0) + 1
                self.given[best.owner] = self.given.get(best.owner, 0) + 1
            if best.lane == BULK:
                self.bulk_used += best.weight
            self._aged_last = False
            if self.lanes and best.lane == BULK:
                waited = now - best.since
                self.metrics.bulk_wait.observe(waited * 1000)
                if waited >= self.max_wait_s and any(w.lane != BULK for w in self.waiters):
                    self.promoted += 1  # it went ahead of interactive work because of its age
                    self.metrics.promotions.inc()
                    self._aged_last = True  # the next place: interactive work's, if any waits
            best.future.set_result(None)
        self._report()

    def _report(self) -> None:
        for lane in LANES:
            self.metrics.queued.set(self.queued(lane), tags={"lane": lane})

    async def enter(self, lane: str, weight: int = 1, owner: Any = None) -> bool:
        """Wait for a turn; True if the caller must `leave(weight, lane, owner)` after."""
        if lane in self.bypass:
            return False
        loop = asyncio.get_running_loop()
        w = _Waiter(lane, max(1, weight), self.clock(), next(self._seq), loop.create_future(), owner)
        if owner is not None and owner not in self.given:  # a new owner: next in turn
            self.given[owner] = min(self.given.values(), default=1) - 1
        self.waiters.append(w)
        self._admit()
        try:
            await w.future
        except BaseException:
            if w.future.done() and not w.future.cancelled():
                self.leave(w.weight, lane, owner)  # admitted, but its caller is gone: pass the turn on
            elif w in self.waiters:
                self.waiters.remove(w)
                self._forget(owner)
                self._admit()
            raise
        return True

    def leave(self, weight: int = 1, lane: str = INTERACTIVE, owner: Any = None) -> None:
        self.used -= max(1, weight)
        if owner is not None:
            left = self.held.get(owner, 0) - 1
            if left > 0:
                self.held[owner] = left
            else:
                self.held.pop(owner, None)
                self._forget(owner)
        if lane == BULK:
            self.bulk_used -= max(1, weight)
        self._admit()

    @contextlib.asynccontextmanager
    async def hold(self, lane: str, weight: int = 1, owner: Any = None) -> AsyncIterator[None]:
        gated = await self.enter(lane, weight, owner)
        try:
            yield
        finally:
            if gated:
                self.leave(weight, lane, owner)


_NOBODY = object()


class LaneQueue:
    """An unbounded queue of two lanes: `get()` returns the oldest
    interactive item, unless no interactive item is queued or the oldest
    bulk item has waited `max_wait_s` (then that one). `lanes=False`: one
    FIFO. Within a lane, items put with an `owner` (a client) are served
    in turn by owner, each owner's in order: one owner's thousand items
    wait behind one of every other owner's, not the other way round. An
    owner that arrives (or comes back) takes its turn before the owner
    served last: a newcomer's item is the next one served once the items
    already taken are done, not one more of a backlog's."""

    def __init__(self, max_wait_s: float, lanes: bool = True, metrics: Any = None,
                 clock: Callable[[], float] = time.monotonic):
        self.max_wait_s = max_wait_s
        self.lanes = lanes
        self.metrics = metrics or _Null()
        self.clock = clock
        # lane -> owner -> its items (oldest first); owners in the order they are next served
        self._q: dict[str, "OrderedDict[Any, deque]"] = {lane: OrderedDict() for lane in LANES}
        self._n: dict[str, int] = {lane: 0 for lane in LANES}
        self._last: dict[str, Any] = {}  # lane -> the owner served last (the back of its turn)
        self._ready = asyncio.Semaphore(0)
        self._seq = itertools.count()
        self.promoted = 0

    def qsize(self) -> int:
        return sum(self._n.values())

    def queued(self, lane: str) -> int:
        return self._n[lane]

    def put_nowait(self, item: Any, lane: str = BULK, owner: Any = None) -> None:
        lane = lane if self.lanes and lane in LANES else INTERACTIVE
        owners = self._q[lane]
        new = owner not in owners
        owners.setdefault(owner, deque()).append((self.clock(), next(self._seq), item))
        last = self._last.get(lane, _NOBODY)
        if new and last is not _NOBODY and last in owners and last != owner:
            owners.move_to_end(last)  # the newcomer goes ahead of the owner just served
        self._n[lane] += 1
        self._ready.release()
        self._report()

    def _oldest(self, lane: str) -> Optional[float]:
        heads = [q[0][0] for q in self._q[lane].values()]
        return min(heads) if heads else None

    def _pop(self, lane: str) -> tuple:
        """The next owner's oldest item in `lane`; that owner goes to the back of the turn."""
        owners = self._q[lane]
        owner, q = next(iter(owners.items()))
        item = q.popleft()
        self._last[lane] = owner
        if q:
            owners.move_to_end(owner)
        else:
            del owners[owner]
        self._n[lane] -= 1
        return item

    def take(self, owner: Any) -> Any:
        """`owner`'s oldest item, whatever the turn (interactive first);
        None if it has none queued. (The job book's place for a client with
        nothing running.)"""
        for lane in LANES:
            if self._q[lane].get(owner):
                self._q[lane].move_to_end(owner, last=False)
                item = self._pop(lane)  # served: it goes to the back of the turn
                self._report()
                return item[2]  # its permit stays: a get() that finds nothing waits again
        return None

    def get_nowait(self) -> Any:
        """The next item (IndexError when empty)."""
        if not self.qsize():
            raise IndexError("the queue is empty")
        now = self.clock()
        oldest_bulk = self._oldest(BULK)
        aged = oldest_bulk is not None and now - oldest_bulk >= self.max_wait_s
        if self._n[INTERACTIVE] and not aged:
            item = self._pop(INTERACTIVE)
        elif self._n[BULK]:
            item = self._pop(BULK)
            self.metrics.bulk_wait.observe((now - item[0]) * 1000)
            if self._n[INTERACTIVE]:
                self.promoted += 1
                self.metrics.promotions.inc()
        else:
            item = self._pop(INTERACTIVE)
        self._report()
        return item[2]

    async def get(self) -> Any:
        while True:
            await self._ready.acquire()
            if self.qsize():  # else its item was take()n
                return self.get_nowait()

    def _report(self) -> None:
        for lane in LANES:
            self.metrics.queued.set(self._n[lane], tags={"lane": lane})
