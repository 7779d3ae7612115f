"""One record per request and the one percentile definition, shared by
bench.py, bench_engine.py and soak.py (pure: numpy only, no Ray).

Percentile: linear interpolation between closest ranks (numpy's default,
Hyndman & Fan type 7): p50 of [1, 2, 3, 4] is 2.5, p99 of 1..100 is 99.01."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

import numpy as np

PCTS = (50, 90, 99)


@dataclass
class Record:
    """One request's outcome. `ok` is True only for a complete answer."""

    t_start: float  # perf_counter at the (scheduled) send
    t_done: float
    status: int  # HTTP status (200 for a handle call or a loop call that returned), 0 if none
    ok: bool
    error: Optional[str] = None
    image: str = ""
    timings: Optional[dict] = None  # the answer's timings_ms (or a system's stage seconds)
    polls: int = 0  # jobs: GETs until the job finished

    @property
    def latency_s(self) -> float:
        return self.t_done - self.t_start

    @property
    def latency_ms(self) -> float:
        return self.latency_s * 1000.0

    def to_json(self, t0: float = 0.0) -> dict:
        """Times relative to t0 (a window's start). The key `t_send` is kept
        from the first raw files, so old runs still re-render."""
        return {"t_send": round(self.t_start - t0, 6), "t_done": round(self.t_done - t0, 6),
                "latency_ms": round(self.latency_ms, 2), "status": self.status, "ok": self.ok,
                "error": self.error, "image": self.image, "polls": self.polls, "timings": self.timings}

    @classmethod
    def from_json(cls, r: dict) -> "Record":
        t0 = r.get("t_start", r.get("t_send"))
        t1 = r.get("t_done", t0 + r.get("latency_ms", 0.0) / 1000.0)
        return cls(t0, t1, r.get("status", 0), r["ok"], r.get("error"), r.get("image", ""), r.get("timings"),
                   r.get("polls", 0))


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between closest
    ranks; NaN if there are no values. Every percentile of load_tests is
    this one."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        return float("nan")
    return float(np.percentile(arr, q))


def median(values: Iterable[Optional[float]]) -> float:
    """The 50th `percentile` of the values that are not None; NaN if none are."""
    return percentile((v for v in values if v is not None), 50)


def percentiles(values: Iterable[float], qs=PCTS) -> dict[str, float]:
    """{"p50": ..., "p90": ..., "p99": ...} by `percentile`."""
    vals = list(values)
    return {f"p{q}": percentile(vals, q) for q in qs}


def mean(values: Iterable[float]) -> float:
    vals = list(values)
    return float(np.mean(vals)) if vals else float("nan")


def error_kinds(records: Iterable[Record], top: int = 5) -> dict[str, int]:
    """The most frequent failure messages (or `status N`), most frequent first."""
    errs: dict[str, int] = {}
    for r in records:
        if not r.ok:
            key = (r.error or f"status {r.status}")[:160]
            errs[key] = errs.get(key, 0) + 1
    return dict(sorted(errs.items(), key=lambda kv: -kv[1])[:top])


def summarize(recs: list[Record], window: tuple[float, float]) -> dict[str, Any]:
    """Latency over the requests sent in the window; throughput = successful
    answers received in the window per second."""
    ws, we = window
    sent = [r for r in recs if ws <= r.t_start < we]
    ok = [r for r in sent if r.ok]
    done_in_window = sum(1 for r in recs if r.ok and ws <= r.t_done < we)
    lat = [r.latency_ms for r in ok]
    out: dict[str, Any] = {
        "requests": len(sent),
        "ok": len(ok),
        "errors": len(sent) - len(ok),
        "error_rate": (len(sent) - len(ok)) / len(sent) if sent else float("nan"),
        "throughput": done_in_window / (we - ws) if we > ws else float("nan"),
        "mean_ms": mean(lat),
        "max_ms": float(np.max(lat)) if lat else float("nan"),
        **{k + "_ms": v for k, v in percentiles(lat).items()},
    }
    out["error_kinds"] = error_kinds(sent)
    timed = [r.timings for r in ok if r.timings]
    if timed:
        keys = sorted({k for t in timed for k in t})
        out["stage_ms"] = {k: mean(t.get(k, 0.0) for t in timed) for k in keys}
    polls = [r.polls for r in ok if r.polls]
    if polls:
        out["mean_polls"] = mean(polls)
    return out


def image_medians(recs: Iterable[Record], window: tuple[float, float]) -> dict[str, float]:
    """Median latency (ms) per image over the successful requests sent in the window."""
    ws, we = window
    by: dict[str, list[float]] = {}
    for r in recs:
        if r.ok and ws <= r.t_start < we:
            by.setdefault(r.image, []).append(r.latency_ms)
    return {k: percentile(v, 50) for k, v in by.items()}


def fmt(x, nd: int = 0) -> str:
    """A number for a table; n/a for None, NaN and inf."""
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a"
    return f"{x:.{nd}f}"


def md_table(head: list[str], rows: Iterable[Iterable], align: str = "") -> list[str]:
    """A markdown table's lines: `align` one letter a column, l or r (by
    default the first column left, the rest right)."""
    align = align or "l" + "r" * (len(head) - 1)
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|",
            *("| " + " | ".join(map(str, r)) + " |" for r in rows)]
