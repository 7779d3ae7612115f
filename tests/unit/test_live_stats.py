"""serve_app.http.policies.live_stats: the live view's rolling request history (buckets
that roll off, percentiles, bounded samples) and its stage summaries."""

from __future__ import annotations

import random
import types

import pytest

from serve_app.http.policies.live_stats import RollingHistory, batch_summary, deployment_summary, percentile, stage_summary


def test_requests_fall_in_their_bucket_and_old_buckets_roll_off():
    h = RollingHistory(bucket_s=5, span_s=30)  # 6 buckets
    h.record(1000.0, 200, 10.0, {"det": 4.0, "rec": 6.0})
    h.record(1003.0, 200, 30.0, {"det": 8.0, "rec": 2.0})
    h.record(1004.9, 401, 1.0)
    h.record(1006.0, 503, 5.0)
    snap = h.snapshot(1007.0)
    assert len(snap) == 6 and [b["t"] for b in snap] == [980, 985, 990, 995, 1000, 1005]
    first, second = snap[-2], snap[-1]
    assert (first["requests"], first["client_errors"], first["errors"]) == (3, 1, 0)
    assert first["p50_ms"] == 10.0 and first["p99_ms"] == 30.0
    assert first["steps_ms"] == {"det": 6.0, "rec": 4.0}
    assert (second["requests"], second["errors"], second["p50_ms"]) == (1, 1, 5.0)
    assert snap[0] == {"t": 980, "requests": 0, "client_errors": 0, "errors": 0, "p50_ms": None, "p99_ms": None,
                       "steps_ms": {}}
    # 30 s later the first bucket has rolled off; the 1005 one is the oldest kept.
    later = h.snapshot(1034.0)
    assert [b["t"] for b in later][0] == 1005 and later[0]["requests"] == 1
    assert sum(b["requests"] for b in h.snapshot(1100.0)) == 0
    assert h._buckets == {}  # memory follows the span


def test_percentiles_by_nearest_rank():
    values = sorted(float(v) for v in range(1, 101))
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile(values, 100) == 100.0
    assert percentile([], 50) is None and percentile([7.0], 99) == 7.0


def test_a_busy_bucket_keeps_a_bounded_unbiased_sample():
    h = RollingHistory(bucket_s=5, span_s=60, max_samples=500, rng=random.Random(1))
    rng = random.Random(2)
    for _ in range(20000):
        h.record(1000.0, 200, rng.uniform(0, 1000))
    b = h.snapshot(1001.0)[-1]
    assert b["requests"] == 20000
    assert len(h._buckets[200].latencies) == 500
    assert 430 < b["p50_ms"] < 570 and b["p99_ms"] > 950


def test_bad_spans_are_refused():
    with pytest.raises(ValueError):
        RollingHistory(bucket_s=0)
    with pytest.raises(ValueError):
        RollingHistory(bucket_s=10, span_s=5)


def batch(t, items, requests=1, ms=10.0):
    return {"seq": 0, "t": t, "items": items, "requests": requests, "ms": ms}


def test_batch_sizes_of_the_last_minute():
    got = batch_summary([batch(10, 9), batch(70, 4, 2, 20.0), batch(100, 4), batch(110, 12, 3, 30.0)], now=120,
                        window_s=60)
    assert got == {"window_s": 60, "batches": 3, "items": 20, "mean_items": 6.67, "max_items": 12,
                   "mean_requests": 2.0, "mean_ms": 20.0, "sizes": {"4": 2, "12": 1}}
    assert batch_summary([], 120, 60)["mean_items"] is None


def test_a_stage_sums_its_replicas_queues_and_pools_their_batches():
    replicas = [
        {"pid": 1, "queue_depth": 3, "pending_crops": 40, "max_batch_size": 24, "batch_wait_timeout_s": 0.0,
         "rss_mb": 512.34, "device": "cpu", "recent_batches": [batch(100, 24)]},
        {"pid": 2, "queue_depth": 1, "pending_crops": 2, "max_batch_size": 24, "batch_wait_timeout_s": 0.0,
         "rss_mb": 500.0, "device": "cpu", "recent_batches": [batch(101, 8), batch(10, 1)]},
    ]
    s = stage_summary(replicas, now=110)
    assert (s["replicas_answered"], s["queue_depth"], s["pending_crops"], s["max_batch_size"]) == (2, 4, 42, 24)
    assert s["rss_mb"] == [512.3, 500.0] and s["device"] == ["cpu"]
    assert s["recent"]["batches"] == 2 and s["recent"]["sizes"] == {"8": 1, "24": 1}
    assert stage_summary([{"queue_depth": 0}], 0)["pending_crops"] is None  # det and cls have no scheduler
    assert stage_summary([], 0)["replicas_answered"] == 0
    assert stage_summary([{"deferred_shapes": {"left": 3}}, {"deferred_shapes": {"left": 0}}], 0)["shapes_left"] == 3
    assert stage_summary([{"deferred_shapes": None}], 0)["shapes_left"] is None  # every shape warmed before ready


def test_serve_status_becomes_replica_counts():
    class ReplicaState(str):  # as Serve's enum: hashable, with a value
        value = "RUNNING"

    state = ReplicaState("RUNNING")
    deps = {"TextRecognizer": types.SimpleNamespace(status=types.SimpleNamespace(value="UPSCALING"),
                                                    replica_states={state: 2, "STARTING": 1}, message="")}
    assert deployment_summary(deps) == {"TextRecognizer": {
        "status": "UPSCALING", "running": 2, "replica_states": {"RUNNING": 2, "STARTING": 1}, "message": ""}}
