"""The load-test harness's pure parts: the one percentile definition, the
per-point summary, the raw JSON round trip and the reports rendered from a
tiny raw JSON (no Ray, no models)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from load_tests.stats import Record, error_kinds, percentile, percentiles, summarize  # noqa: E402


def test_percentile_is_linear_interpolation_between_ranks():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(range(1, 101), 99) == pytest.approx(99.01)
    assert percentile([3, 1, 2], 0) == 1 and percentile([3, 1, 2], 100) == 3
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    assert percentiles([1, 2, 3, 4]) == {"p50": 2.5, "p90": pytest.approx(3.7), "p99": pytest.approx(3.97)}


def rec(t0, ms, ok=True, image="a.jpg", status=200, error=None, timings=None):
    return Record(t0, t0 + ms / 1000.0, status, ok, error, image, timings)


def test_summary_counts_requests_sent_in_the_window_and_answers_received_in_it():
    recs = [rec(0.5, 100),  # sent before the window: not counted
            rec(1.0, 100, timings={"total": 80.0}), rec(1.5, 300, timings={"total": 200.0}),
            rec(2.0, 50, ok=False, status=503, error="HTTP 503: overloaded"),
            rec(2.9, 400)]  # sent in the window, answered after it: latency yes, throughput no
    s = summarize(recs, (1.0, 3.0))
    assert (s["requests"], s["ok"], s["errors"]) == (4, 3, 1)
    assert s["error_rate"] == 0.25
    assert s["throughput"] == pytest.approx(2 / 2.0)  # ok answers at 1.1 and 1.8 s; 0.6 and 3.3 are outside
    assert s["p50_ms"] == pytest.approx(300.0)
    assert s["max_ms"] == pytest.approx(400.0)
    assert s["stage_ms"] == {"total": 140.0}
    assert s["error_kinds"] == {"HTTP 503: overloaded": 1}


def test_empty_window_gives_nan_not_an_error():
    s = summarize([], (0.0, 1.0))
    assert s["requests"] == 0 and math.isnan(s["p99_ms"]) and s["throughput"] == 0.0


def test_error_kinds_most_frequent_first():
    recs = [rec(0, 1, ok=False, error="a")] + [rec(0, 1, ok=False, error="b")] * 2 + [rec(0, 1, ok=False, status=0)]
    assert list(error_kinds(recs)) == ["b", "a", "status 0"]


def test_record_json_round_trip_and_old_key():
    r = rec(10.25, 123.456, timings={"det": 1.0})
    d = r.to_json(10.0)
    assert d["t_send"] == 0.25 and d["latency_ms"] == 123.46
    back = Record.from_json(json.loads(json.dumps(d)))
    assert back.latency_ms == pytest.approx(123.456, abs=1e-3) and back.timings == {"det": 1.0}


def point(target, mode, load, latencies, window_s=2.0, images=("a.jpg", "b.jpg")):
    recs = [rec(0.1 * i, ms, image=images[i % len(images)], timings={"total": ms * 0.8})
            for i, ms in enumerate(latencies)]
    return {"target": target, "label": target, "mode": mode, "load": load, "window_s": window_s,
            "summary": summarize(recs, (0.0, window_s)), "batches": None, "loadavg": [0.5, 0.5, 0.5],
            "cpu": {"machine": 1.0, "ours": 1.0, "others": 0.0},
            "records": [r.to_json() for r in recs]}


def tiny_raw():
    return {
        "argv": ["--quick"], "started": "2026-12-01 05:00:00 UTC", "wall_s": 10.0, "loadavg_start": [0.1] * 3,
        "loadavg_end": [0.2] * 3, "git": ["abc123", []], "machine": "test", "versions": "python 3",
        "cold": {"deploy_to_ready_s": 5.0}, "probes": {}, "notes": ["a note"], "failures": [],
        "images": ["a.jpg", "b.jpg"],
        "points": [point("engine", "loop", 1, [100, 200] * 5), point("simple", "closed", 1, [110, 210] * 5),
                   point("http", "closed", 1, [115, 215] * 5), point("http", "closed", 4, [300, 500] * 10)],
    }


def test_report_is_rendered_from_raw_json_alone(tmp_path):
    from load_tests.bench import parse_args
    from load_tests.report import summary_line, write_report

    raw = json.loads(json.dumps(tiny_raw()))
    args = parse_args(["--quick", "--out", str(tmp_path / "a")])
    run, path = write_report(raw, args)
    md = path.read_text()
    assert "| target | load | requests | errors | img/s | p50 ms | p90 ms | p99 ms |" in md
    assert "| service, HTTP | 4 clients | 20 |" in md
    assert "## Targets" in md and "- a note" in md
    assert md.rstrip().splitlines()[-1] == summary_line(run)
    assert "targets met" in summary_line(run)
    args.out = tmp_path / "b"
    _, again = write_report(json.loads(json.dumps(raw)), args)
    assert again.read_text() == md


def test_soak_summary_from_raw(tmp_path):
    from load_tests.report import write_soak_report

    recs = [rec(0.2 * i, 100 + i) for i in range(10)] + [rec(1.0, 5, ok=False, status=0, error="ClientError: x")]
    raw = {"seconds": 2.0, "saturation_img_s": 5.0, "offered_img_s": 3.5, "window_s": 2.0,
           "records": [r.to_json() for r in recs],
           "memory": [[0.0, {"TextDetector:1": 100.0, "TextDetector:1 shm": 5.0}],
                      [2.0, {"TextDetector:1": 102.0, "TextDetector:1 shm": 9.0}]]}
    s = write_soak_report(raw, tmp_path)
    assert (s["requests"], s["errors"]) == (11, 1)
    assert s["p50_ms"] == round(percentile([100 + i for i in range(10)], 50), 1)
    assert s["memory_growth"] == {"TextDetector:1": 0.02}
    assert s["shared_mb"] == {"TextDetector:1": [5.0, 9.0]}
    assert json.loads((tmp_path / "summary.json").read_text()) == s
    assert "| TextDetector:1 | 100 | 102 | 2.00% |" in (tmp_path / "soak.md").read_text()


def test_the_harness_imports_without_ray():
    code = ("import sys; import load_tests.bench, load_tests.soak, load_tests.bench_engine; "
            "sys.exit(1 if 'ray' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
