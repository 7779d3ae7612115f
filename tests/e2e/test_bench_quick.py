"""The load-test harness end to end: `python -m load_tests serve load --quick` as a
subprocess (its own local Ray, the service from deployments.yaml, the simple
server, the in-process baselines). It proves the harness works; nothing about
speed is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from harness.service import free_ports  # noqa: E402

TABLE_HEADER = "| target | load | requests | errors | img/s | p50 ms | p90 ms | p99 ms |"


def test_bench_quick(tmp_path):
    out, raw = tmp_path / "report", tmp_path / "results.json"
    port, simple_port = free_ports(2)
    proc = subprocess.run(
        [sys.executable, "-m", "load_tests", "serve", "load", "--quick", "--out", str(out), "--raw", str(raw),
         "--port", str(port), "--simple-port", str(simple_port)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + "\n" + proc.stderr[-6000:]

    doc = json.loads(raw.read_text())
    assert doc["failures"] == []
    points = doc["points"]
    # every phase that needs nothing optional ran (rapidocr and jobs may be skipped, with a note)
    assert {"engine", "simple", "cold", "http", "open", "handle", "nobatch"} <= {p["target"] for p in points}
    records = [(p["label"], r) for p in points for r in p["records"]]
    assert records
    failed = [(label, r["status"], r["error"]) for label, r in records if not (r["ok"] and r["status"] == 200)]
    assert failed == []

    report = (out / "benchmarks.md").read_text()
    assert TABLE_HEADER in report
    rows = [line for line in report.splitlines() if line.startswith("| service, HTTP |")]
    assert rows, report
    assert any(line.startswith("Summary:") for line in proc.stdout.splitlines())

    # the report is rendered from the raw JSON alone: --from-raw writes the same document
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, "-m", "load_tests", "serve", "load", "--from-raw", str(raw), "--out",
                           str(again)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (again / "benchmarks.md").read_text() == report
