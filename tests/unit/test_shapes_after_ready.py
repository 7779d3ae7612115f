"""`recognizer.warm: core` (serve_app.serving.shapes_after_ready): a batch at a
shape not built yet runs as built shapes of its width and reads the same;
the rest are built on the predictor's one thread, only while the crop
scheduler is idle, yielding to every queued batch. Stand-in predictors with
a real single-thread executor; explicit steps (threading events), no sleeps."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from serve_app.core.app_args import RecognizerArgs
from serve_app.core.engine_config import RecOptions
from serve_app.inference.runners import TextRecognizer
from serve_app.ocr.recognition import batch_width, input_shapes
from serve_app.serving.crop_scheduler import CropScheduler
from serve_app.serving.shapes_after_ready import DeferredShapes, core_shapes, kept_shapes

CHARSET = ["blank"] + list("abcdefghij") + [" "]


class ThreadPredictor:
    """Like PaddlePredictor: one thread runs everything (`call_async`, FIFO);
    `run` records each input shape (batch, width) and reads each row from its
    own pixels only (as the recogniser does with bucket padding). A call made
    while `gate` is clear blocks the thread until it is set."""

    name = "stand-in"

    def __init__(self):
        self.executor = ThreadPoolExecutor(max_workers=1)
        self.calls: list[tuple] = []  # ("run", (n, w), warm input?) and ("job", label), in the thread's order
        self.submitted: list[str] = []  # what was handed to the thread, in order
        self.gate = threading.Event()
        self.gate.set()
        self.thread_ids: set[int] = set()

    def run(self, x: np.ndarray) -> np.ndarray:
        self.thread_ids.add(threading.get_ident())
        self.gate.wait(30)
        n, _, _, w = x.shape
        self.calls.append(("run", (n, w), bool((x == 1.0).all(axis=(1, 2))[:, :8].all())))  # white: a warm-up input
        steps = w // 8
        probs = np.full((n, steps, len(CHARSET)), 0.01, np.float32)
        for i in range(n):
            filled = int((x[i, 0] > -1).any(axis=0).sum())  # the crop's columns, padding excluded
            code = 1 + (filled * 7 + int(x[i].sum() * 1000)) % (len(CHARSET) - 2)
            probs[i, : max(1, filled // 16), code] = 0.9
        return probs

    def job(self, label: str, gate: threading.Event | None = None):
        def fn():
            if gate is not None:
                gate.wait(30)
            self.calls.append(("job", label))
        return fn

    async def call_async(self, fn, *args):
        self.submitted.append(getattr(fn, "__name__", "?"))
        return await asyncio.wrap_future(self.executor.submit(fn, *args))

    def shapes_run(self) -> list[tuple[int, int]]:
        return [c[1] for c in self.calls if c[0] == "run"]


def crops(widths: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, (48, w, 3), dtype=np.uint8) for w in widths]


def setup(built_sizes=(1,), opts=RecOptions()):
    pred = ThreadPredictor()
    rec = TextRecognizer(pred, opts, CHARSET)
    shapes = input_shapes(opts)
    built = [s for s in shapes if s[0] in built_sizes]
    later = [(s, *rec.warm_call(s)) for s in shapes if s[0] not in built_sizes]
    deferred = DeferredShapes(built, later)
    sched = CropScheduler(
        deferred.batches(pred.call_async, rec.recognize_batch,
                         lambda cs: batch_width([c.shape[1] / c.shape[0] for c in cs], opts)),
        lambda c: batch_width([c.shape[1] / c.shape[0]], opts), 6)
    return pred, rec, deferred, sched


def test_the_core_set_is_every_width_at_batch_size_one():
    shapes = input_shapes(RecOptions())
    now, later = core_shapes(shapes)
    assert len(shapes) == 71 and len(now) == 15 and len(later) == 56
    assert sorted(w for _, w in now) == sorted(RecOptions().width_ladder)
    assert all(n == 1 for n, _ in now) and all(n > 1 for n, _ in later)


def test_the_core_set_stops_at_its_widest_width_and_the_wider_lone_crops_are_built_first_after_ready():
    shapes = input_shapes(RecOptions())
    now, later = core_shapes(shapes, RecognizerArgs().warm_core_max_width)
    assert [w for _, w in now] == [w for w in RecOptions().width_ladder if w <= 1024] and len(now) == 9
    assert later[:6] == [(1, w) for w in RecOptions().width_ladder if w > 1024]
    assert all(n > 1 for n, _ in later[6:]) and sorted(now + later) == sorted(shapes)


def test_a_width_with_nothing_built_runs_its_crops_one_by_one_and_is_built_by_the_first():
    ran = []
    d = DeferredShapes([(1, 320)], [((1, 2048), lambda _: ran.append("build"), None),
                                    ((2, 2048), lambda _: ran.append("build2"), None)])
    assert d.sizes(3, 2048) == [1, 1, 1]
    out = d.run_split(lambda items: ran.append(len(items)) or [x * 10 for x in items], [1, 2, 3], 2048)
    assert out == [10, 20, 30] and ran == [1, 1, 1] and (1, 2048) in d.built
    assert d.build_next(lambda: False) is True  # (1, 2048) skipped: the batch built it; (2, 2048) built
    assert ran[-1] == "build2" and d.left == 0 and d.stats()["finished_at"] is not None
    assert d.sizes(2, 2048) == [2]


def test_a_batch_that_fails_leaves_its_shape_unbuilt():
    d = DeferredShapes([(1, 320)], [((1, 2048), lambda _: None, None)])
    with pytest.raises(RuntimeError):
        d.run_split(lambda items: (_ for _ in ()).throw(RuntimeError("boom")), [1], 2048)
    assert (1, 2048) not in d.built and d.left == 1


@pytest.mark.parametrize("built, n, want", [
    ({1}, 5, [1, 1, 1, 1, 1]),
    ({1, 2}, 5, [2, 2, 1]),
    ({1, 2, 4}, 5, [4, 1]),
    ({1, 2, 4}, 4, [4]),
    ({1, 3}, 6, [3, 3]),
    (set(), 2, [1, 1]),  # nothing built at this width: size 1 (built by that batch)
])
def test_a_batch_at_an_unbuilt_shape_is_split_into_the_largest_built_sizes(built, n, want):
    d = DeferredShapes([(k, 320) for k in built], [])
    assert d.sizes(n, 320) == want
    assert sum(d.sizes(n, 320)) == n


def test_batch_sizes_keep_the_sizes_listed_and_each_widths_full_batch():
    shapes = input_shapes(RecOptions())
    kept = kept_shapes(shapes, [1, 2, 4])
    assert len(kept) == 51 and kept_shapes(shapes, None) == shapes
    by_width: dict[int, set] = {}
    for n, w in kept:
        by_width.setdefault(w, set()).add(n)
    assert by_width[320] == {1, 2, 4, 6}  # limit 6
    assert by_width[1280] == {1, 2, 4}  # limit 4
    assert by_width[1792] == {1, 2, 3}  # limit 3: a full batch is one call
    assert by_width[3200] == {1}
    # Sizes not kept run as kept ones, and every size up to the limit adds up.
    d = DeferredShapes(kept, [])
    assert d.left == 0 and d.finished_at is not None  # warm full: nothing to build after ready
    assert d.sizes(5, 320) == [4, 1] and d.sizes(3, 320) == [2, 1] and d.sizes(6, 320) == [6]
    assert d.sizes(3, 1792) == [3]


@pytest.mark.parametrize("sizes", [[2, 4], [0, 1], [1, 1, 2]])
def test_batch_sizes_without_1_or_with_repeats_are_refused(sizes):
    from pydantic import ValidationError

    from serve_app.core.app_args import RecognizerArgs

    with pytest.raises(ValidationError, match="batch_sizes"):
        RecognizerArgs(batch_sizes=sizes)
    assert RecognizerArgs(batch_sizes=[4, 1, 2]).batch_sizes == [1, 2, 4]


def test_a_split_batch_reads_the_same_text_in_the_same_order():
    pred, rec, deferred, _ = setup(built_sizes=(1,))
    batch = crops([300, 310, 280, 320, 305])  # one bucket (320)
    assert batch_width([c.shape[1] / c.shape[0] for c in batch], rec.opts) == 320
    whole = rec.recognize_batch(batch)  # one predictor call of 5
    split = deferred.run_split(rec.recognize_batch, batch, 320)
    assert [r.text for r in split] == [r.text for r in whole] and all(r.text for r in whole)
    assert [round(r.score, 6) for r in split] == [round(r.score, 6) for r in whole]
    assert pred.shapes_run() == [(5, 320)] + [(1, 320)] * 5
    assert deferred.split_batches == 1


def test_a_request_never_waits_for_a_build_and_builds_run_once_it_is_idle():
    async def go():
        pred, rec, deferred, sched = setup()
        reference = [r.text for r in TextRecognizer(ThreadPredictor(), rec.opts, CHARSET).recognize(
            crops([300, 310, 280, 320, 305, 600, 610]))]
        pred.gate.clear()  # the thread blocks on the first run: the request is in flight
        got = asyncio.ensure_future(sched.submit(crops([300, 310, 280, 320, 305, 600, 610])))
        await asyncio.sleep(0)  # let the scheduler hand its batches to the thread
        assert sched.active
        assert deferred.start(pred.call_async, sched)
        for _ in range(5):
            await asyncio.sleep(0)
        assert pred.submitted == ["run_split", "run_split"]  # its two batches; no build handed over while busy
        pred.gate.set()
        texts = [r.text for r in await got]
        await deferred.task
        assert texts == reference
        runs = pred.shapes_run()
        # The request's batches (5 crops at 320, 2 at 640) ran as built shapes (size 1) before any build.
        assert runs[:7] == [(1, 320)] * 5 + [(1, 640)] * 2
        assert sorted(runs[7:]) == sorted(s for s in input_shapes(rec.opts) if s[0] > 1)
        assert deferred.stats()["left"] == 0 and deferred.stats()["built"] == 71
        assert len(pred.thread_ids) == 1  # everything on the predictor's one thread
        pred.calls.clear()
        assert [r.text for r in await sched.submit(crops([300, 310, 280, 320, 305, 600, 610]))] == reference
        assert pred.shapes_run() == [(5, 320), (2, 640)]  # all built: no split
    asyncio.run(go())


def test_a_build_already_handed_to_the_thread_gives_way_to_a_batch_queued_after_it():
    async def go():
        pred, rec, deferred, sched = setup()
        hold = threading.Event()
        blocker = asyncio.ensure_future(pred.call_async(pred.job("canary", hold)))  # the thread is busy
        assert deferred.start(pred.call_async, sched)
        await asyncio.sleep(0)  # the scheduler is idle: the builder hands its first build over
        assert pred.submitted == ["fn", "build_next"]
        got = asyncio.ensure_future(sched.submit(crops([300, 310])))  # a request queued behind that build
        await asyncio.sleep(0)
        hold.set()
        await blocker
        await got
        await deferred.task
        calls = pred.calls
        assert calls[0] == ("job", "canary")
        assert calls[1] == ("run", (1, 320), False) and calls[2] == ("run", (1, 320), False)  # the request first
        assert deferred.yielded >= 1  # the build saw the queued batch and gave way
        assert deferred.stats()["built"] == 71
    asyncio.run(go())


def test_a_stream_of_requests_holds_every_build_back_until_it_stops():
    """The hostile case: a stranger keeping the recogniser busy waits for
    at most the one build already running when it came; every batch of its
    runs before any other build (builds only fill idle moments)."""
    async def go():
        pred, rec, deferred, sched = setup()
        pred.gate.clear()
        assert deferred.start(pred.call_async, sched)
        await asyncio.sleep(0)  # idle: one build handed over (blocked on the gate)
        assert pred.submitted == ["build_next"]
        reqs = []
        for k in range(7):  # queued while that build is still on the thread
            reqs.append(asyncio.ensure_future(sched.submit(crops([300, 310, 280, 600, 610, 620], seed=k))))
            await asyncio.sleep(0)
        pred.gate.set()
        await asyncio.gather(*reqs)
        await deferred.task
        warm = [c[2] for c in pred.calls]
        served = warm.index(True, 1)  # the first build after the one that was running
        assert warm[0] is True and not any(warm[1:served])
        assert all(warm[served:]) and len(warm[served:]) == 55  # the rest of the 56, after every request
        assert sum(n for n, _ in pred.shapes_run()[1:served]) == 7 * 6  # every crop of every request
        assert deferred.stats()["left"] == 0
    asyncio.run(go())


def test_a_shape_whose_build_fails_stays_split():
    d = DeferredShapes([(1, 320)], [((2, 320), lambda _: (_ for _ in ()).throw(RuntimeError("boom")), None)])
    assert d.build_next(lambda: False) is True
    assert d.stats()["failed"] == 1 and d.left == 0 and d.sizes(2, 320) == [1, 1]


def test_a_build_yields_on_the_thread_when_a_batch_is_waiting():
    d = DeferredShapes([(1, 320)], [((2, 320), lambda _: None, None)])
    assert d.build_next(lambda: True) is False
    assert d.yielded == 1 and d.left == 1 and (2, 320) not in d.built
    assert d.build_next(lambda: False) is True and (2, 320) in d.built


def test_no_build_while_another_stage_in_the_process_has_work_and_all_once_it_has_none():
    """One process with the detector and classifier beside the recogniser
    (serve_app/serving/stages_in_one_process.py): while the detector works on a
    request's image the recogniser is idle, but a build then would take the
    cores from that request; builds wait until no stage has work."""
    async def go():
        pred, rec, deferred, sched = setup()
        detector_pending = [1]  # an image at the detector
        assert deferred.start(pred.call_async, sched, lambda: detector_pending[0] > 0)
        for _ in range(6):  # several polls of the builder (it sleeps between them)
            await asyncio.sleep(0.06)
        assert pred.submitted == [] and deferred.stats()["left"] == 56
        detector_pending[0] = 0  # the detector is done; the recogniser still idle
        await deferred.task
        assert deferred.stats()["left"] == 0 and deferred.stats()["built"] == 71
        assert all(c[2] for c in pred.calls)  # every run was a build (white warm-up input)
    asyncio.run(go())
