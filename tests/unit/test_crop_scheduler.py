"""The recogniser's crop scheduler: fair turns, cross-request batches,
per-request errors, cancellation. Items here are (bucket, value) pairs and
the "predictor" doubles each value."""

import asyncio

import pytest

from harness.fakes import OneThreadBatchFunction
from serve_app.serving.crop_scheduler import CropScheduler


def make(pred, batch_size=4, log=None):
    return CropScheduler(pred, lambda item: item[0], batch_size,
                         on_batch=(lambda r, n, s: log.append((r, n))) if log is not None else None)


def test_results_in_submission_order_and_batches_hold_one_bucket():
    async def go():
        pred = OneThreadBatchFunction()
        items = [(b, v) for v, b in enumerate([2, 1, 2, 1, 3, 1, 1, 1, 2])]
        out = await make(pred).submit(items)
        assert out == [v * 2 for _, v in items]
        assert all(len({b for b, _ in batch}) == 1 for batch in pred.batches)
        assert max(len(b) for b in pred.batches) == 4
    asyncio.run(go())


def test_batch_size_can_depend_on_the_bucket():
    async def go():
        pred = OneThreadBatchFunction()
        items = [(b, v) for v, b in enumerate([1] * 7 + [9] * 5)]
        out = await make(pred, batch_size=lambda bucket: 3 if bucket == 1 else 2).submit(items)
        assert out == [v * 2 for _, v in items]
        assert sorted(len(b) for b in pred.batches if b[0][0] == 1) == [1, 3, 3]
        assert sorted(len(b) for b in pred.batches if b[0][0] == 9) == [1, 2, 2]
    asyncio.run(go())


def test_a_small_request_does_not_wait_for_a_big_one():
    async def go():
        pred = OneThreadBatchFunction(delay=0.001)
        sched = make(pred, batch_size=4)
        big = asyncio.create_task(sched.submit([(1, v) for v in range(100)]))
        await asyncio.sleep(0)  # the big one is queued first
        small = asyncio.create_task(sched.submit([(5, 1000)]))
        assert await small == [2000]
        # behind at most the two batches already handed to the predictor, not all 25 of the big one
        assert [(5, 1000)] in pred.batches[:3], pred.batches[:4]
        assert not big.done()
        assert await big == [v * 2 for v in range(100)]
    asyncio.run(go())


def test_same_bucket_crops_of_different_requests_share_a_batch():
    async def go():
        pred = OneThreadBatchFunction(delay=0.001)
        log = []
        sched = make(pred, batch_size=6, log=log)
        a, b, c = await asyncio.gather(sched.submit([(1, 1), (1, 2)]), sched.submit([(1, 3)]),
                                       sched.submit([(1, 4), (2, 5)]))
        assert (a, b, c) == ([2, 4], [6], [8, 10])
        assert pred.batches[0] == [(1, 1), (1, 2), (1, 3), (1, 4)]
        assert log[0] == (3, 4)
    asyncio.run(go())


def test_a_failing_crop_fails_only_its_request():
    async def go():
        pred = OneThreadBatchFunction(fail_on=13)
        sched = make(pred, batch_size=8)
        good, bad = await asyncio.gather(sched.submit([(1, 1), (1, 2)]), sched.submit([(1, 13), (1, 3)]),
                                         return_exceptions=True)
        assert good == [2, 4]
        assert isinstance(bad, ValueError)
        assert sched.queue == deque_empty()
    asyncio.run(go())


def deque_empty():
    from collections import deque
    return deque()


def test_a_cancelled_request_stops_taking_predictor_time():
    async def go():
        pred = OneThreadBatchFunction(delay=0.005)
        sched = make(pred, batch_size=2)
        doomed = asyncio.create_task(sched.submit([(1, v) for v in range(50)]))
        await asyncio.sleep(0.012)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        ran = len(pred.batches)
        assert await sched.submit([(1, 7)]) == [14]
        assert len(pred.batches) <= ran + 2  # the rest of the cancelled request never ran
    asyncio.run(go())


class StepPredictor:
    """A predictor that runs one batch each time the test says `step()`:
    the test, not the machine's scheduler, decides what happens between
    two batches."""

    def __init__(self):
        self.batches: list[list] = []
        self.waiting = 0
        self.free = False  # True: batches run without waiting for step()
        self._go = asyncio.Semaphore(0)

    async def __call__(self, items):
        self.waiting += 1
        if not self.free:
            await self._go.acquire()
        self.waiting -= 1
        self.batches.append(list(items))
        return [v * 2 for _, v in items]

    async def step(self):
        """Lets exactly one batch run, then lets every task settle."""
        await settle()
        assert self.waiting, "no batch was handed to the predictor"
        self._go.release()
        await settle()


async def settle():
    # No timers anywhere: a fixed number of loop turns lets every ready task run.
    for _ in range(50):
        await asyncio.sleep(0)


def test_a_big_request_is_not_starved_by_a_stream_of_small_ones():
    """One small request (2 batches of work) arrives before every predictor
    batch: twice what the predictor can serve. Newcomers and requests in
    progress lead alternate batches and those in progress take turns, so
    the big request's k-th batch comes at most 2k batches after its
    previous one (the rotation ahead of it grows by at most one request a
    round) and it finishes within 10 x 11 batches. Newcomers always first
    (the scheduler before this rule) gave it 2 of 200 batches."""
    async def go():
        pred = StepPredictor()
        sched = make(pred, batch_size=2)
        big = asyncio.create_task(sched.submit([(1, v) for v in range(20)]))
        smalls = []
        for _ in range(110):
            smalls.append(asyncio.create_task(sched.submit([(2, 1), (2, 2), (2, 3), (2, 4)])))
            await pred.step()
            if big.done():
                break
        assert big.done(), f"the big request starved: {sum(b[0][0] == 1 for b in pred.batches)} of its 10 batches ran"
        assert big.result() == [v * 2 for v in range(20)]
        turns = [k for k, b in enumerate(pred.batches) if b[0][0] == 1]
        assert len(turns) == 10
        assert all(b - a <= 2 * k for k, (a, b) in enumerate(zip(turns, turns[1:]), start=1)), turns
        pred.free = True  # the rest are served too
        for _ in range(pred.waiting):
            pred._go.release()
        assert await asyncio.gather(*smalls) == [[2, 4, 6, 8]] * len(smalls)
    asyncio.run(go())


def test_without_cross_request_batching_a_batch_holds_one_request():
    async def go():
        pred = OneThreadBatchFunction(delay=0.001)
        sched = make(pred, batch_size=6)
        sched.cross_request = False
        a, b = await asyncio.gather(sched.submit([(1, 1), (1, 2)]), sched.submit([(1, 3)]))
        assert (a, b) == ([2, 4], [6])
        assert pred.batches == [[(1, 1), (1, 2)], [(1, 3)]]
    asyncio.run(go())


def test_crops_of_a_request_whose_deadline_passed_are_dropped_and_others_served():
    import time

    from serve_app.core.errors import DeadlineExceeded

    async def go():
        pred = OneThreadBatchFunction(delay=0.005)
        sched = make(pred, batch_size=2)
        doomed = asyncio.create_task(sched.submit([(1, v) for v in range(50)], deadline=time.time() + 0.012))
        await asyncio.sleep(0.03)
        with pytest.raises(DeadlineExceeded):
            await doomed
        ran = len(pred.batches)
        assert ran < 10  # 25 batches if it had run in full
        assert await sched.submit([(1, 7)], deadline=time.time() + 5) == [14]
        assert len(pred.batches) == ran + 1
        assert sched.pending_items == 0
    asyncio.run(go())


# -- priority lanes (serve_app.core.lanes) ---------------------------------------------


def test_interactive_crops_lead_every_batch_while_bulk_waits():
    async def go():
        pred = StepPredictor()
        sched = make(pred, batch_size=2)
        bulk = asyncio.create_task(sched.submit([(1, v) for v in range(20)], lane="bulk"))
        await pred.step()  # the bulk request is being read: one batch done, the next handed over
        inter = asyncio.create_task(sched.submit([(1, 100 + v) for v in range(6)], lane="interactive"))
        await settle()
        pred.free = True
        for _ in range(pred.waiting):
            pred._go.release()
        assert await inter == [2 * (100 + v) for v in range(6)]
        first = next(k for k, b in enumerate(pred.batches) if (1, 100) in b)
        last = max(k for k, b in enumerate(pred.batches) if any(v >= 100 for _, v in b))
        # behind only the one bulk batch handed out before it came (bulk_depth 1), then its 3 batches in a row
        assert first == 2 and last == first + 2, pred.batches
        assert not any(v < 100 for b in pred.batches[first:last + 1] for _, v in b)  # no bulk filling (bulk_fill off)
        assert await bulk == [v * 2 for v in range(20)]
    asyncio.run(go())


def test_bulk_fills_an_interactive_batch_only_with_bulk_fill():
    async def go(fill: bool):
        pred = OneThreadBatchFunction(delay=0.001)
        sched = make(pred, batch_size=4)
        sched.bulk_fill = fill
        await asyncio.gather(sched.submit([(1, 1), (1, 2)], lane="bulk"), sched.submit([(1, 3)], lane="interactive"))
        return pred.batches

    assert asyncio.run(go(False)) == [[(1, 3)], [(1, 1), (1, 2)]]
    assert asyncio.run(go(True)) == [[(1, 3), (1, 1), (1, 2)]]


def test_bulk_that_waited_the_bound_leads_again_and_lanes_off_is_one_lane():
    async def go(lanes: bool, max_wait_s: float):
        pred = OneThreadBatchFunction(delay=0.002)
        sched = make(pred, batch_size=1)
        sched.lanes, sched.max_wait_s = lanes, max_wait_s
        blocker = asyncio.create_task(sched.submit([(1, 0)], lane="interactive"))
        await asyncio.sleep(0)
        bulk = asyncio.create_task(sched.submit([(1, 1)], lane="bulk"))
        await asyncio.sleep(0)
        stream = [asyncio.create_task(sched.submit([(1, 10 + k)], lane="interactive")) for k in range(5)]
        await asyncio.gather(blocker, bulk, *stream)
        return [b[0][1] for b in pred.batches].index(1), sched.promoted

    # lanes on, no aging within the test: bulk after every interactive crop
    assert asyncio.run(go(True, 60.0)) == (6, 0)
    # aged at once: it leads as soon as it is pending, ahead of the interactive ones behind it
    assert asyncio.run(go(True, 0.0)) == (1, 1)
    assert asyncio.run(go(False, 60.0)) == (1, 0)  # one lane: the request not served yet leads, as before


def test_pending_crops_are_counted_by_lane():
    async def go():
        pred = OneThreadBatchFunction(delay=0.01)
        sched = make(pred, batch_size=1)
        a = asyncio.create_task(sched.submit([(1, 1), (1, 2)], lane="bulk"))
        b = asyncio.create_task(sched.submit([(1, 3)]))
        await asyncio.sleep(0)  # both queued; the worker has not taken a batch yet
        assert sched.pending_by_lane() == {"interactive": 1, "bulk": 2}
        await asyncio.gather(a, b)
        assert sched.pending_by_lane() == {"interactive": 0, "bulk": 0}
    asyncio.run(go())


def test_a_clients_one_page_leads_a_batch_before_another_clients_queued_pages():
    """Client a's 12 bulk pages are queued (one batch each), then client
    b's one page: b's leads the next batch composed, not the thirteenth
    (requests not yet served once led by age: a's every queued page first)."""
    async def go():
        pred = StepPredictor()
        sched = make(pred, batch_size=2)
        a = [asyncio.create_task(sched.submit([(1, 10 * k), (1, 10 * k + 1)], lane="bulk", client="a"))
             for k in range(12)]
        await pred.step()  # a's first page read, its second handed to the predictor
        b = asyncio.create_task(sched.submit([(1, 1000), (1, 1001)], lane="bulk", client="b"))
        await settle()
        pred.free = True
        for _ in range(pred.waiting):
            pred._go.release()
        assert await b == [2000, 2002]
        at = next(k for k, batch in enumerate(pred.batches) if (1, 1000) in batch)
        assert at == 2, pred.batches  # behind only the batch handed out before it came
        assert await asyncio.gather(*a) == [[20 * k, 20 * k + 2] for k in range(12)]
        # two clients with pages queued: their pages lead in turn
        pred.batches.clear()
        a2 = [asyncio.create_task(sched.submit([(1, k)], lane="bulk", client="a")) for k in range(4)]
        b2 = [asyncio.create_task(sched.submit([(1, 100 + k)], lane="bulk", client="b")) for k in range(4)]
        await asyncio.gather(*a2, *b2)
        leaders = ["b" if batch[0][1] >= 100 else "a" for batch in pred.batches]
        assert leaders == ["a", "b", "a", "b"], pred.batches  # each batch led by the other client, filled by both
        assert sched.turns == {}  # nothing queued: no client keeps a turn
    asyncio.run(go())
