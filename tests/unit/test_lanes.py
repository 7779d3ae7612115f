"""Priority lanes (serve_app.core.lanes): the gate in front of a FIFO batch queue
and the job queue serve interactive work first, bulk by age, and with lanes
off everything is one FIFO; the lane travels in the options and headers and
never reaches the result cache's key or an Idempotency-Key's payload."""

from __future__ import annotations

import asyncio

import pytest

from jobfakes import FakePipeline, settle, until
from serve_app.core.errors import BadRequest
from serve_app.http.headers import priority
from serve_app.jobs.book import JobBook, fingerprint
from serve_app.core.lanes import BULK, INTERACTIVE, LaneQueue, PriorityGate, lane_of
from serve_app.core.request_options import OcrOptions, parse_options
from serve_app.core.app_args import JobArgs, LaneArgs


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def admitted_order(gate: PriorityGate, arrivals: list[tuple[str, str]], clock: Clock = None,
                         age_s: float = 0.0) -> list[str]:
    """Holds the gate's one place, queues `arrivals` (name, lane), ages them
    by age_s, then releases: the order in which the waiters got through."""
    order: list[str] = []
    first = await gate.enter(INTERACTIVE)
    assert first

    async def one(name: str, lane: str) -> None:
        async with gate.hold(lane):
            order.append(name)
            await asyncio.sleep(0)

    tasks = []
    for name, lane in arrivals:
        tasks.append(asyncio.create_task(one(name, lane)))
        await asyncio.sleep(0)
        if clock is not None:
            clock.t += 0.01
    if clock is not None:
        clock.t += age_s
    gate.leave()
    await asyncio.gather(*tasks)
    return order


def test_gate_admits_interactive_first_then_bulk_in_arrival_order():
    gate = PriorityGate(1, max_wait_s=5.0)
    arrivals = [("b1", BULK), ("b2", BULK), ("i1", INTERACTIVE), ("b3", BULK), ("i2", INTERACTIVE)]
    assert asyncio.run(admitted_order(gate, arrivals)) == ["i1", "i2", "b1", "b2", "b3"]
    assert gate.used == 0 and not gate.waiters


def test_gate_with_lanes_off_is_fifo():
    gate = PriorityGate(1, max_wait_s=5.0, lanes=False)
    arrivals = [("b1", BULK), ("i1", INTERACTIVE), ("b2", BULK)]
    assert asyncio.run(admitted_order(gate, arrivals)) == ["b1", "i1", "b2"]


def test_bulk_that_waited_the_bound_goes_ahead_of_later_interactive_work():
    clock = Clock()
    gate = PriorityGate(1, max_wait_s=5.0, clock=clock)
    arrivals = [("b1", BULK), ("i1", INTERACTIVE), ("b2", BULK)]
    # b1 and b2 have waited past the bound; b1 came before i1, b2 after it
    assert asyncio.run(admitted_order(gate, arrivals, clock, age_s=6.0)) == ["b1", "i1", "b2"]
    assert gate.promoted == 1  # b1 (b2 went when no interactive work waited)


def test_aged_bulk_and_interactive_work_take_turns():
    """Two pages' tiles (bulk) aged in the detector's queue all went ahead
    of a one-word image that came after them (6-10 s beside two such
    pages): once aged, bulk items and interactive ones alternate, so an
    interactive item waits behind one aged bulk item per place, and bulk
    still gets every other place."""
    clock = Clock()
    gate = PriorityGate(1, max_wait_s=5.0, clock=clock)
    arrivals = [("b1", BULK), ("b2", BULK), ("b3", BULK), ("i1", INTERACTIVE), ("i2", INTERACTIVE)]
    assert asyncio.run(admitted_order(gate, arrivals, clock, age_s=6.0)) == ["b1", "i1", "b2", "i2", "b3"]
    assert gate.promoted == 2  # b1 and b2 went ahead of interactive work; b3 when none waited


def test_gate_lets_capacity_weight_through_and_a_heavy_item_alone():
    async def go():
        gate = PriorityGate(4, max_wait_s=5.0)
        assert await gate.enter(BULK, 3)
        # weight 2 does not fit beside 3: it waits; a bulk of 1 behind it does not overtake
        t2 = asyncio.create_task(gate.enter(INTERACTIVE, 2))
        t1 = asyncio.create_task(gate.enter(BULK, 1))
        await asyncio.sleep(0)
        assert not t2.done() and not t1.done() and gate.used == 3
        gate.leave(3, BULK)
        await asyncio.sleep(0)
        assert t2.done() and t1.done() and gate.used == 3
        gate.leave(2)
        gate.leave(1, BULK)
        assert await gate.enter(BULK, 9)  # heavier than the capacity: through when the gate is empty
        assert gate.used == 9
    asyncio.run(go())


def test_bulk_capacity_keeps_bulk_batches_short_and_leaves_room_for_interactive():
    async def go():
        gate = PriorityGate(4, max_wait_s=5.0, bulk_capacity=1)
        assert await gate.enter(BULK)
        second = asyncio.create_task(gate.enter(BULK))
        await asyncio.sleep(0)
        assert not second.done() and gate.queued(BULK) == 1  # bulk holds its one place
        assert await gate.enter(INTERACTIVE) and await gate.enter(INTERACTIVE, 2)  # interactive still fits
        gate.leave(1, BULK)
        await asyncio.sleep(0)
        assert second.done() and gate.bulk_used == 1 and gate.used == 4
        assert await PriorityGate(4, 5.0, bulk_capacity=1).enter(BULK, 3)  # heavier: through alone
    asyncio.run(go())


def test_a_cancelled_waiter_frees_its_turn_and_bypassed_lanes_pass():
    async def go():
        gate = PriorityGate(1, max_wait_s=5.0, bypass=(INTERACTIVE,))
        assert await gate.enter(BULK)
        assert await gate.enter(INTERACTIVE) is False  # not gated, nothing to leave
        waiting = asyncio.create_task(gate.enter(BULK))
        behind = asyncio.create_task(gate.enter(BULK))
        await asyncio.sleep(0)
        assert gate.queued(BULK) == 2
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert gate.queued(BULK) == 1
        gate.leave(1, BULK)
        assert await behind and gate.used == 1
        # admitted, then its caller is cancelled before it runs: the turn passes on
        gate2 = PriorityGate(1, max_wait_s=5.0)
        assert await gate2.enter(BULK)
        late = asyncio.create_task(gate2.enter(BULK))
        await asyncio.sleep(0)
        gate2.leave(1, BULK)  # late is admitted ...
        late.cancel()  # ... and cancelled before it resumes
        await asyncio.gather(late, return_exceptions=True)
        assert gate2.used == 0 and gate2.bulk_used == 0
    asyncio.run(go())


def test_lane_queue_interactive_first_bulk_by_age_and_fifo_when_off():
    async def go():
        clock = Clock()
        q = LaneQueue(max_wait_s=5.0, clock=clock)
        for item, lane in [("b1", BULK), ("i1", INTERACTIVE), ("b2", BULK), ("i2", INTERACTIVE)]:
            q.put_nowait(item, lane)
        assert [await q.get(), await q.get()] == ["i1", "i2"]
        assert q.qsize() == 2 and q.queued(BULK) == 2
        assert await q.get() == "b1"
        q.put_nowait("i3", INTERACTIVE)
        clock.t += 6.0  # b2 has waited past the bound: ahead of i3
        assert [await q.get(), await q.get()] == ["b2", "i3"]
        assert q.promoted == 1
        off = LaneQueue(max_wait_s=5.0, lanes=False)
        for item, lane in [("b1", BULK), ("i1", INTERACTIVE)]:
            off.put_nowait(item, lane)
        assert [await off.get(), await off.get()] == ["b1", "i1"]
    asyncio.run(go())


def test_lane_of_options_and_header():
    assert lane_of(None) == INTERACTIVE and lane_of(None, BULK) == BULK and lane_of(INTERACTIVE, BULK) == INTERACTIVE
    assert parse_options({"priority": "bulk"}).priority == BULK
    assert OcrOptions().with_lane(BULK).priority == BULK
    assert OcrOptions(priority=INTERACTIVE).with_lane(BULK).priority == INTERACTIVE
    with pytest.raises(BadRequest, match="priority is interactive or bulk"):
        parse_options({"priority": "urgent"})
    assert priority({}) is None and priority({"x-priority": " Bulk "}) == BULK
    with pytest.raises(BadRequest, match="X-Priority must be interactive or bulk"):
        priority({"x-priority": "high"})


def test_the_lane_is_not_an_idempotency_payload():
    assert fingerprint(b"img", OcrOptions(priority=BULK)) == fingerprint(b"img", OcrOptions())
    assert "priority" not in OcrOptions(priority=BULK).key_dict()


def test_job_book_runs_interactive_jobs_before_bulk_jobs_queued_earlier():
    async def go():
        pipe = FakePipeline(open_gate=False)
        book = JobBook(pipe.run, JobArgs(concurrency=1), LaneArgs())
        await book.start()
        first = await book.submit(b"first", OcrOptions(priority=BULK))  # taken by the one worker at once
        await until(lambda: len(pipe.calls) == 1)
        bulk = [await book.submit(f"b{k}".encode(), OcrOptions(priority=BULK)) for k in range(3)]
        urgent = await book.submit(b"urgent", OcrOptions(priority=INTERACTIVE))
        old = await book.submit(b"old", OcrOptions())  # no lane (a job journaled before lanes): bulk
        pipe.gate.set()
        ids = [first["job_id"], *(j["job_id"] for j in bulk), urgent["job_id"], old["job_id"]]
        views = await settle(book, ids)
        assert all(v["status"] == "succeeded" for v in views.values())
        assert [bytes(c[0]) for c in pipe.calls] == [b"first", b"urgent", b"b0", b"b1", b"b2", b"old"]
        book.close()
    asyncio.run(go())


def test_a_restarted_store_keeps_each_jobs_lane_and_runs_interactive_first(tmp_path):
    """The lane lives in the journaled options (no schema change): after a
    restart the recovered interactive job runs before bulk ones queued earlier."""
    path = str(tmp_path / "jobs.sqlite")

    async def first_life():
        pipe = FakePipeline(open_gate=False)
        book = JobBook(pipe.run, JobArgs(concurrency=1, journal=path), LaneArgs())
        await book.start()
        ids = [(await book.submit(f"b{k}".encode(), OcrOptions(priority=BULK)))["job_id"] for k in range(3)]
        ids.append((await book.submit(b"i", OcrOptions(priority=INTERACTIVE)))["job_id"])
        await until(lambda: len(pipe.calls) == 1)  # b0 is running, the store dies
        book.close()
        return ids

    async def second_life(ids):
        pipe = FakePipeline()
        book = JobBook(pipe.run, JobArgs(concurrency=1, journal=path), LaneArgs())
        await book.start()
        views = await settle(book, ids)
        book.close()
        assert all(v["status"] == "succeeded" for v in views.values())
        assert [c[1].priority for c in pipe.calls] == [INTERACTIVE, BULK, BULK, BULK]
        return [bytes(c[0]) for c in pipe.calls]

    ids = asyncio.run(first_life())
    order = asyncio.run(second_life(ids))
    assert order == [b"i", b"b0", b"b1", b"b2"]  # b0 was running when the store died: it runs again


def test_ocr_client_map_sends_bulk_unless_the_options_name_a_lane():
    from serve_app.client import bulk

    assert bulk(None) == {"priority": "bulk"}
    assert bulk({"cls": False}) == {"priority": "bulk", "cls": False}
    assert bulk({"priority": "interactive"}) == {"priority": "interactive"}


def test_a_waiter_cancelled_in_the_same_turn_as_a_release_does_not_leak_the_place():
    """A burst whose deadlines pass: a waiter's task is cancelled (its
    future with it) and, before its clean-up runs, the holder leaves. The
    place must go to the next live waiter, and come back after it."""

    async def run():
        gate = PriorityGate(1, 5.0)
        assert await gate.enter(INTERACTIVE)
        doomed = asyncio.ensure_future(gate.enter(INTERACTIVE))
        later = asyncio.ensure_future(gate.enter(INTERACTIVE))
        await asyncio.sleep(0)
        doomed.cancel()  # its future is cancelled now; its except-branch runs on its next step
        gate.leave(1, INTERACTIVE)  # must skip the cancelled waiter, not raise
        assert await later and gate.used == 1
        with pytest.raises(asyncio.CancelledError):
            await doomed
        gate.leave(1, INTERACTIVE)
        assert gate.used == 0 and not gate.waiters
        assert await asyncio.wait_for(gate.enter(BULK), 1)  # the place is free again

    asyncio.run(run())


def test_lane_queue_serves_a_newcomer_before_the_backlog_it_arrives_behind():
    """One owner's backlog is being served; another owner arrives: its item
    is the very next one taken (not one more of the backlog's first), then
    the two alternate."""
    async def go():
        q = LaneQueue(max_wait_s=60.0)
        for k in range(5):
            q.put_nowait(f"a{k}", BULK, owner="A")
        assert await q.get() == "a0"  # taken by the one worker: A was served last
        q.put_nowait("b0", BULK, owner="B")
        q.put_nowait("b1", BULK, owner="B")
        q.put_nowait("c0", BULK, owner="C")
        return [await q.get() for _ in range(7)]
    assert asyncio.run(go()) == ["b0", "c0", "a1", "b1", "a2", "a3", "a4"]


def test_lane_queue_take_gives_an_owners_oldest_item_which_then_waits_its_turn_like_one_served():
    """take(owner) (the job book's place for a client with nothing running):
    that owner's oldest item, interactive first; the owner then goes to the
    back of the turn as if served; a get() never returns a taken item, and
    with nothing left it waits."""
    async def go():
        q = LaneQueue(max_wait_s=60.0)
        for k in range(3):
            q.put_nowait(f"a{k}", BULK, owner="A")
        q.put_nowait("b0", BULK, owner="B")
        q.put_nowait("b1", INTERACTIVE, owner="B")
        assert q.take("B") == "b1" and q.take("C") is None and q.qsize() == 4
        got = [await q.get() for _ in range(4)]
        assert q.qsize() == 0 and q.take("A") is None
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(q.get(), 0.05)  # the taken item's permit is spent on nothing
        return got
    assert asyncio.run(go()) == ["a0", "b0", "a1", "a2"]


def test_a_bulk_gate_admits_the_owner_holding_fewest_places_first_also_once_everything_has_aged():
    """The pipeline's bulk gate (interactive bypasses it): two documents'
    pages (owners A and B) hold its 2 places and 6 more wait; a one-page
    job (owner C) arrives last: it takes the next free place, before the
    older pages, also when they have all waited past max_wait_s."""
    async def go(age: float):
        clock = Clock()
        gate = PriorityGate(2, max_wait_s=5.0, bypass=(INTERACTIVE,), clock=clock)
        order = []

        async def page(owner, k):
            async with gate.hold(BULK, 1, owner):
                order.append(f"{owner}{k}")
                await release[f"{owner}{k}"].wait()

        names = [("A", 0), ("B", 0), ("A", 1), ("A", 2), ("B", 1), ("B", 2), ("A", 3), ("B", 3)]
        release = {f"{o}{k}": asyncio.Event() for o, k in names + [("C", 0)]}
        tasks = [asyncio.ensure_future(page(o, k)) for o, k in names]
        await asyncio.sleep(0)
        clock.t += age
        tasks.append(asyncio.ensure_future(page("C", 0)))
        await asyncio.sleep(0)
        release["A0"].set()
        for _ in range(5):
            await asyncio.sleep(0)
        for e in release.values():
            e.set()
        await asyncio.gather(*tasks)
        return order, (gate.held, gate.given)

    for age in (0.0, 60.0):
        order, held = asyncio.run(go(age))
        assert order[:3] == ["A0", "B0", "C0"], (age, order)
        assert order[3:5] == ["A1", "B1"] and held == ({}, {})  # then the two documents in turn; nothing kept after
