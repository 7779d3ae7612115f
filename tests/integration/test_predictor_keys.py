"""Several predictors of one program in one process each answer with their
own model (serve_app/inference/ov_slots.py). Paddle keys its OpenVINO
engines process-wide by the program's variable names and the precision, and
a second predictor under a key frees the first one's engine: before the
slots, the first one's next run segfaulted or failed with "CompiledModel was
not initialized" (CI, 2026-12-05: every in-process engine test after the CLI
test had made its own engine). Each case runs in a child process, so such a
crash fails the test instead of ending the session, with glibc's
MALLOC_PERTURB_ set, so that a run on freed memory crashes every time
instead of now and then."""

from __future__ import annotations

import numpy as np
import pytest

from harness.in_child import call_in_child
from harness.predictor_keys import classifier_beside_its_fine_tuned_copy, engines_one_after_another


@pytest.fixture(autouse=True)
def freed_memory_overwritten(monkeypatch):
    monkeypatch.setenv("MALLOC_PERTURB_", "165")  # read at the child's start (spawn)


def test_a_second_and_third_engine_leave_the_first_reading_the_same():
    out = call_in_child(engines_one_after_another, "rapidocr_en.jpg")
    assert "MovieShots" in " ".join(out["first"])
    assert all(texts == out["first"] for texts in out.values()), out


def test_a_fine_tuned_copy_beside_its_base_answers_with_its_own_weights(tmp_path):
    """Same architecture and variable names, other weights: what a user's
    own set trained from a built-in one is, loaded beside it in make serve's
    one-process profile."""
    out = call_in_child(classifier_beside_its_fine_tuned_copy, str(tmp_path / "tuned"))
    assert not np.allclose(out["base"], out["tuned"], atol=1e-3)  # the other weights are in effect
    for name in ("base after tuned loaded", "base after tuned reloaded"):
        np.testing.assert_allclose(out[name], out["base"], atol=1e-6, err_msg=name)
    for name in ("tuned again", "tuned alone"):
        np.testing.assert_allclose(out[name], out["tuned"], atol=1e-6, err_msg=name)
