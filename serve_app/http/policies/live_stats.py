"""What the live view (GET /v1/stats) shows, from the figures the service
already keeps: a summary of each model stage from its replicas' `stats()`
(queue depth, batch sizes formed) and of each deployment's replica states
from Serve's status; and a short rolling history of the requests one
ingress replica answered: per bucket of `bucket_s` seconds over the
last `span_s`, the requests, client errors (4xx), server errors (5xx), p50
and p99 latency and the mean time of each pipeline step.

Bounded by construction: at most span_s / bucket_s buckets, each keeping at
most `max_samples` latencies (a uniform reservoir sample beyond that, so
percentiles stay unbiased under any load). Pure; no Ray."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional


@dataclass
class _Bucket:
    start: float
    requests: int = 0
    client_errors: int = 0
    errors: int = 0
    latencies: list = field(default_factory=list)
    seen: int = 0  # latencies offered (the reservoir holds at most max_samples)
    step_sums: dict = field(default_factory=dict)
    step_counts: dict = field(default_factory=dict)


def percentile(sorted_values: list, q: float) -> Optional[float]:
    """The q-th percentile (0..100) by the nearest-rank method; None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class RollingHistory:
    def __init__(self, bucket_s: float = 5.0, span_s: float = 600.0, max_samples: int = 2000,
                 rng: Optional[random.Random] = None):
        if bucket_s <= 0 or span_s < bucket_s:
            raise ValueError("bucket_s must be > 0 and span_s >= bucket_s")
        self.bucket_s = bucket_s
        self.span_s = span_s
        self.max_samples = max_samples
        self._buckets: dict[int, _Bucket] = {}
        self._rng = rng or random.Random(0)

    def _key(self, t: float) -> int:
        return math.floor(t / self.bucket_s)

    def _drop_old(self, now: float) -> None:
        oldest = self._key(now) - self.n_buckets + 1
        for k in [k for k in self._buckets if k < oldest]:
            del self._buckets[k]

    @property
    def n_buckets(self) -> int:
        return max(1, int(round(self.span_s / self.bucket_s)))

    def record(self, t: float, status: int, latency_ms: float,
               steps_ms: Optional[Mapping[str, float]] = None) -> None:
        """One answered request at time t (seconds, e.g. time.time())."""
        key = self._key(t)
        b = self._buckets.get(key)
        if b is None:
            self._drop_old(t)
            b = self._buckets[key] = _Bucket(key * self.bucket_s)
        b.requests += 1
        if 400 <= status < 500:
            b.client_errors += 1
        elif status >= 500:
            b.errors += 1
        b.seen += 1
        if len(b.latencies) < self.max_samples:
            b.latencies.append(latency_ms)
        else:  # reservoir sampling (Algorithm R)
            j = self._rng.randrange(b.seen)
            if j < self.max_samples:
                b.latencies[j] = latency_ms
        for step, ms in (steps_ms or {}).items():
            b.step_sums[step] = b.step_sums.get(step, 0.0) + float(ms)
            b.step_counts[step] = b.step_counts.get(step, 0) + 1

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """Every bucket of the span ending at `now`, oldest first (empty
        buckets included, so a chart's x axis is time)."""
        self._drop_old(now)
        last = self._key(now)
        out = []
        for key in range(last - self.n_buckets + 1, last + 1):
            b = self._buckets.get(key)
            if b is None:
                out.append({"t": key * self.bucket_s, "requests": 0, "client_errors": 0, "errors": 0,
                            "p50_ms": None, "p99_ms": None, "steps_ms": {}})
                continue
            lat = sorted(b.latencies)
            out.append({
                "t": b.start, "requests": b.requests, "client_errors": b.client_errors, "errors": b.errors,
                "p50_ms": _round(percentile(lat, 50)), "p99_ms": _round(percentile(lat, 99)),
                "steps_ms": {s: round(b.step_sums[s] / b.step_counts[s], 2) for s in sorted(b.step_sums)},
            })
        return out


def _round(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 2)


# -- the stages, from their replicas' stats() -----------------------------------


def batch_summary(batches: list[dict], now: float, window_s: float) -> dict[str, Any]:
    """The batches (ModelReplica.recent_batches entries) formed in the last
    window_s seconds: how many, their sizes in items (images or crops) and
    requests, and how many batches had each size."""
    recent = [b for b in batches if b["t"] >= now - window_s]
    items = [b["items"] for b in recent]
    sizes: dict[int, int] = {}
    for n in items:
        sizes[n] = sizes.get(n, 0) + 1
    n = len(recent)
    return {
        "window_s": window_s,
        "batches": n,
        "items": sum(items),
        "mean_items": round(sum(items) / n, 2) if n else None,
        "max_items": max(items) if n else None,
        "mean_requests": round(sum(b["requests"] for b in recent) / n, 2) if n else None,
        "mean_ms": round(sum(b["ms"] for b in recent) / n, 2) if n else None,
        "sizes": {str(k): sizes[k] for k in sorted(sizes)},
    }


def stage_summary(replicas: list[dict], now: float, window_s: float = 60.0) -> dict[str, Any]:
    """One model stage from the stats() of the replicas that answered:
    queued calls (and, for the recogniser, crops waiting in its scheduler),
    the batch knobs, and the batches formed recently."""
    pending = [r.get("pending_crops") for r in replicas if r.get("pending_crops") is not None]
    deferred = [r["deferred_shapes"] for r in replicas if r.get("deferred_shapes")]
    return {
        "replicas_answered": len(replicas),
        "queue_depth": sum(int(r.get("queue_depth") or 0) for r in replicas),
        "pending_crops": sum(pending) if pending else None,
        "max_batch_size": max((r.get("max_batch_size") or 0 for r in replicas), default=None),
        "batch_wait_timeout_s": max((r.get("batch_wait_timeout_s") or 0 for r in replicas), default=None),
        "rss_mb": [round(r["rss_mb"], 1) for r in replicas if r.get("rss_mb") is not None],
        "device": sorted({r["device"] for r in replicas if r.get("device")}),
        # recognizer.warm core: input shapes still to build after ready (None: all built before).
        "shapes_left": sum(d["left"] for d in deferred) if deferred else None,
        "recent": batch_summary([b for r in replicas for b in r.get("recent_batches", ())], now, window_s),
    }


def deployment_summary(deployments: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Serve's status of each deployment (name -> an object with `status`,
    `replica_states` and `message`, as serve.status() gives) as plain JSON:
    replicas running, and every replica state counted."""
    out = {}
    for name, d in deployments.items():
        states = {str(getattr(k, "value", k)): int(v) for k, v in (getattr(d, "replica_states", None) or {}).items()}
        status = getattr(d, "status", "")
        out[name] = {"status": str(getattr(status, "value", status)), "running": states.get("RUNNING", 0),
                     "replica_states": states, "message": getattr(d, "message", "") or ""}
    return out
