"""Soak: zero errors at ~70% of saturation, with images of many sizes and a
hostile share (junk, oversized, slow, expired) mixed in, and every
replica's memory flat after warm-up (growth under 5%). `make test` runs a 1-minute version (after
30 s of settling); the 20-minute one is marked slow (`pytest -m slow tests/e2e/test_soak.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_soak(seconds: int, out: Path, sizes: int = 48, settle: float | None = None) -> dict:
    settle_args = ["--settle", str(settle)] if settle is not None else []
    proc = subprocess.run([sys.executable, "-m", "load_tests", "soak", "--seconds", str(seconds),
                           "--sizes", str(sizes), "--out", str(out), *settle_args],
                          cwd=REPO, capture_output=True, text=True, timeout=seconds + 900)
    summary = out / "summary.json"
    assert summary.is_file(), (proc.stdout[-2000:], proc.stderr[-3000:])
    assert (out / "soak_raw.json").is_file() and (out / "soak.md").is_file()
    return json.loads(summary.read_text())


def check(summary: dict) -> None:
    """Zero errors; every replica's private memory (RSS less the object
    store's shared pages, see harness/procfs.py) grows under 5%; the
    report is written from the raw records (soak_raw.json)."""
    assert summary["requests"] > 0
    assert summary["errors"] == 0, summary
    assert summary["memory_growth"], summary
    for replica, growth in summary["memory_growth"].items():
        assert growth < 0.05, (replica, growth, summary["memory_mb"][replica], summary["shared_mb"][replica])
    # The hostile share got its own answers (and the good clients none of them: errors == 0 above).
    # costly: harness/hostile.py's cases in turn (issue 24): 400 for what cannot be a page or image,
    # 413 for a page over its budget or text over its bound, 503 naming the jobs API for a request too big to take.
    expected = {"junk": {"400"}, "oversized": {"413"}, "slow": {"408"}, "expired": {"503", "504", "200"},
                "costly": {"400", "413", "503"}}
    hostile = summary["hostile"]
    assert set(hostile) == set(expected), hostile
    for kind, answers in hostile.items():
        assert set(answers) <= expected[kind], (kind, answers)


def test_soak_short(tmp_path):
    # 1 minute after 30 s of settling, 8 resized variants besides the 8 soak
    # images: the make-test-sized run. A 30 s settle once flagged heap growth
    # that was only settling; with the model processes' heap trimmed and one
    # malloc arena (serve_app/serving/heap.py) two runs after 30 s grew at
    # most +1.6% and +0.6% (2026-12-02, `python -m load_tests soak --seconds
    # 60 --settle 30 --sizes 8`). Every check above still has its inputs (~2
    # good requests a second, all five hostile kinds several times, six
    # memory samples); the 20-minute run below is the real memory check.
    check(run_soak(60, tmp_path, sizes=8, settle=30))


@pytest.mark.slow
def test_soak_long():
    # Its table, CSV and memory curve go to load_tests/out/ (not kept in git).
    check(run_soak(1200, REPO / "load_tests" / "out" / "soak-long"))
