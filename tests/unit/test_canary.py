"""The correctness canary (serve_app.serving.canary) without models: the golden
input, each stage's check, when a replica runs it, that a failure sticks and
fails the replica's health check, and the test hook (one replica claims the
fault, whose predictor then misreads). The golden text itself is read by
the real models in tests/integration/test_canary_autoscaling.py."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serve_app.serving.canary import (
    FAULT_ENV, GOLDEN_TEXT, Canary, CanaryFailed, CanaryResult, PermutedPredictor, check_boxes, check_direction,
    check_text, claim_fault, golden_crop, golden_image, golden_text_rect, recognizer_probe,
)
from serve_app.serving.replica import ModelReplica
from serve_app.core.results import Recognition
from serve_app.core.app_args import BatchKnobs
from harness.fakes import StandInBatcher, StandInPredictor


def test_golden_image_is_dark_text_on_white_where_the_rect_says():
    img = golden_image()
    x0, y0, x1, y1 = golden_text_rect()
    assert img.dtype == np.uint8 and img.shape[2] == 3 and img.shape[0] < 160 and img.shape[1] < 400
    inside, outside = img[y0:y1, x0:x1], img.copy()
    outside[y0:y1, x0:x1] = 255
    assert inside.min() == 0 and outside.min() > 200  # the ink inside the rectangle (an antialiased fringe aside)
    crop = golden_crop()
    assert crop.shape[0] >= y1 - y0 and crop.shape[1] >= x1 - x0 and crop.min() == 0
    assert np.array_equal(golden_image(), img)  # drawn the same way every time


def _quad(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def test_check_boxes_wants_one_box_on_the_word():
    x0, y0, x1, y1 = golden_text_rect()
    assert check_boxes(np.array([_quad(x0 - 2, y0 + 3, x1 + 1, y1 - 2)])).ok
    assert not check_boxes(np.zeros((0, 4, 2))).ok
    two = np.array([_quad(x0, y0, x1, y1), _quad(x0, y0, x1, y1)])
    assert "2 boxes" in check_boxes(two).detail
    far = check_boxes(np.array([_quad(x1, y1, x1 + 200, y1 + 40)]))
    assert not far.ok and "IoU" in far.detail


def test_direction_and_text_checks_are_exact():
    assert check_direction(["0"]).ok and not check_direction(["180"]).ok
    assert check_text([GOLDEN_TEXT]).ok
    assert not check_text([GOLDEN_TEXT.lower()]).ok and not check_text([GOLDEN_TEXT, ""]).ok


def test_canary_is_due_first_then_every_interval_and_after_mark_due():
    now = [0.0]
    seen = []
    c = Canary("rec", interval_s=10, clock=lambda: now[0], on_result=seen.append)
    assert c.due()
    c.run(lambda: CanaryResult(True, "ok"))
    assert not c.due()
    now[0] = 9.0
    assert not c.due()
    c.mark_due()
    assert c.due()
    c.run(lambda: CanaryResult(True, "ok"))
    now[0] = 19.0
    assert c.due() and seen == [True, True] and c.runs == 2


def test_a_failure_sticks_and_an_exception_is_a_failure():
    c = Canary("det", interval_s=0)
    c.run(lambda: CanaryResult(True, "ok"))
    assert not c.due()  # interval 0: not periodically
    c.run(lambda: 1 / 0)
    with pytest.raises(CanaryFailed, match="det canary failed: ZeroDivisionError"):
        c.raise_if_failed()
    c.mark_due()
    assert not c.due() and c.failures == 1 and c.stats()["last"]["ok"] is False


class Reader:
    """A stand-in TextRecognizer: its predictor's argmax over a charset."""

    charset = ["", *sorted(set(GOLDEN_TEXT))]

    def __init__(self):
        idx = [self.charset.index(ch) for ch in GOLDEN_TEXT]
        self.predictor = StandInPredictor()
        self.scores = np.eye(len(self.charset), dtype=np.float32)[idx][None]  # (1, T, C)

    def recognize(self, crops):
        out = self.predictor.run(self.scores) if isinstance(self.predictor, PermutedPredictor) else self.scores
        return [Recognition("".join(self.charset[i] for i in out[0].argmax(-1)), 1.0) for _ in crops]


def test_the_fault_is_claimed_once_and_makes_the_reader_misread(tmp_path):
    token = tmp_path / "fault"
    env = {FAULT_ENV: str(token)}
    assert not claim_fault({}) and not claim_fault(env)  # unset; or set with no file
    reader, other = Reader(), Reader()
    probe, other_probe = recognizer_probe(reader, env), recognizer_probe(other, env)
    assert probe().ok
    token.write_text("")
    assert not probe().ok  # this one claimed it: its predictor now misreads
    assert other_probe().ok  # the file is gone: the other replica is untouched
    assert isinstance(reader.predictor, PermutedPredictor) and not token.exists()


def test_permuted_predictor_rolls_scores_and_passes_the_rest_through():
    inner = StandInPredictor()
    p = PermutedPredictor(inner)
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    assert np.array_equal(p.run(x), np.roll(x, 1, axis=-1))
    assert p.name == "fake" and p.options is inner.options


def test_replica_runs_the_canary_before_ready_and_in_health_checks():
    results = iter([CanaryResult(True, "ok"), CanaryResult(True, "ok"), CanaryResult(False, "read 'DANBSZ'")])
    r = ModelReplica("rec", StandInPredictor(), BatchKnobs(max_batch_size=4))
    r.watch(lambda: next(results), interval_s=0)
    r.warm([])
    assert r.ready_at is not None and r.canary.runs == 1
    r.reconfigure({"max_batch_size": 8}, StandInBatcher())  # Serve's, at the start: the warm-up's canary just ran
    asyncio.run(r.check_health_async())  # and interval 0: not due, not run
    assert r.canary.runs == 1
    r.reconfigure({"max_batch_size": 8}, StandInBatcher())  # due again after a reconfigure
    asyncio.run(r.check_health_async())
    assert r.canary.runs == 2
    r.reconfigure(None, StandInBatcher())
    with pytest.raises(CanaryFailed, match="DANBSZ"):
        asyncio.run(r.check_health_async())
    with pytest.raises(CanaryFailed):  # and from then on
        asyncio.run(r.check_health_async())
    assert r.stats()["canary"]["failures"] == 1


def test_a_replica_whose_canary_fails_at_warm_up_is_never_ready():
    r = ModelReplica("cls", StandInPredictor(), BatchKnobs(max_batch_size=4))
    r.watch(lambda: CanaryResult(False, "read ['180']"), interval_s=60)
    with pytest.raises(CanaryFailed, match="180"):
        r.warm([])
    assert r.ready_at is None
