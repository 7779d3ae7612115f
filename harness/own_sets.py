"""A user's own model set for the tests: the shipped PP-OCRv4 files copied
as a user's export is laid out (tests/integration/test_own_sets_*.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from serve_app.inference import weights


def own_v4(tmp: Path) -> dict:
    """The shipped v4 detector, recogniser and dictionary copied as a
    user's export is laid out, declared with v4's pre-processing."""
    det, rec, words = tmp / "my_det", tmp / "my_rec", tmp / "my_keys.txt"
    shutil.copytree(weights.default_stage_dir("det"), det)
    shutil.copytree(weights.default_stage_dir("rec"), rec)
    shutil.copy(weights.dictionary_path(), words)
    return {"name": "my_v4", "title": "v4, fine-tuned (a copy)", "det_model": str(det), "rec_model": str(rec),
            "rec_dict": str(words), "det": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}}
