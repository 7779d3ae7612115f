"""Benchmark: identical work done once (serve_app/http/policies/result_cache.py). One
service (deployments.yaml, result cache and in-flight sharing on), measured
in one run:

1. a duplicate's server time: the same image sent again and again (cache
   hits) against the same image sent with `Cache-Control: no-cache` (computed
   each time), and a no-op route (/healthz) for the client-side floor. Server
   time is the ingress's own (its `Server-Timing: ingress;dur=` header: from
   the request reaching the ingress to the response, body read included);
2. a burst of N identical uploads at once, with the cache (one computation
   shared) and then the same burst with `Cache-Control: no-cache` (cache off
   for those requests: each computed), counting the pipeline's runs as the
   images the detector replicas ran (their batch stats).

    .venv/bin/python -m load_tests hostile dedupe [--burst 32] [--repeats 50] [--image paddleocr_00018069.jpg]

Prints two tables (medians, p99, throughput, lines read)."""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Barrier


from harness import service  # noqa: E402
import sys  # noqa: E402
from harness.peer import PEER  # noqa: E402
from load_tests.stats import percentile  # noqa: E402
from load_tests.cli import standalone  # noqa: E402

FRESH = {"Cache-Control": "no-cache"}


def post(session, url: str, data: bytes, headers: dict | None = None) -> dict:
    t0 = time.perf_counter()
    r = session.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "application/octet-stream",
                                                          **(headers or {})}, timeout=600)
    client_ms = (time.perf_counter() - t0) * 1000
    timing = r.headers.get("Server-Timing", "")
    server_ms = float(timing.split("dur=")[1]) if "dur=" in timing else float("nan")
    body = r.json()
    return {"status": r.status_code, "client_ms": client_ms, "server_ms": server_ms,
            "cache": r.headers.get("X-Cache"), "lines": len(body.get("results", []))}


def detector_images(seqs: dict) -> int:
    """Images the detector ran since the last call (pid -> last batch seq)."""
    from ray import serve

    h = serve.get_deployment_handle("TextDetector", app_name="ocr")
    n = serve.status().applications["ocr"].deployments["TextDetector"].replica_states.get("RUNNING", 1)
    total = 0
    for pid, st in service.replica_stats(h, n).items():
        last = seqs.get(pid, 0)
        total += sum(b["items"] for b in st["recent_batches"] if b["seq"] > last)
        seqs[pid] = max([last] + [b["seq"] for b in st["recent_batches"]])
    return total


def burst(url: str, data: bytes, n: int, headers: dict | None) -> tuple[list[dict], float]:
    import requests

    gate = Barrier(n)

    def one(_):
        with requests.Session() as s:
            gate.wait()
            return post(s, url, data, headers)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        out = list(pool.map(one, range(n)))
    return out, time.perf_counter() - t0


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config", type=Path, default=service.DEFAULT_CONFIG)
    ap.add_argument("--image", default="paddleocr_00018069.jpg", help="a peer image (tests/data/peer)")
    ap.add_argument("--burst", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=50, help="duplicates (and no-op calls) in part 1")
    ap.add_argument("--fresh-repeats", type=int, default=8, help="computed calls in part 1")
    ap.add_argument("--port", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    import requests


    data = (PEER / args.image).read_bytes()
    other = (PEER / "rapidocr_en.jpg").read_bytes()  # part 1's image, so that part 2's is new to the cache
    service.start_ray()
    try:
        url = service.deploy_config(service.load_config(args.config, cache=True), args.port or service.free_port())
        with requests.Session() as s:
            for _ in range(3):  # warm the routes
                s.get(f"{url}/healthz", timeout=60)
                post(s, url, other, FRESH)
            noop = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                s.get(f"{url}/healthz", timeout=60)
                noop.append((time.perf_counter() - t0) * 1000)
            fresh = [post(s, url, other, FRESH) for _ in range(args.fresh_repeats)]
            hits = [post(s, url, other) for _ in range(args.repeats)]
        assert all(h["status"] == 200 and h["cache"] == "hit" for h in hits), {h["cache"] for h in hits}
        assert all(f["status"] == 200 and f["cache"] == "bypass" for f in fresh)

        seqs: dict = {}
        detector_images(seqs)
        shared, shared_s = burst(url, data, args.burst, None)
        time.sleep(1.0)
        shared_runs = detector_images(seqs)
        alone, alone_s = burst(url, data, args.burst, FRESH)
        time.sleep(1.0)
        alone_runs = detector_images(seqs)
    finally:
        service.stop_all(graceful=False)

    print(f"\n## 1. A duplicate's time ({args.repeats} duplicates, {args.fresh_repeats} computed; "
          f"image {len(other)} bytes, rapidocr_en.jpg)\n")
    print("| request | server ms p50 | server ms p99 | client ms p50 | client ms p99 |")
    print("|---|---|---|---|---|")
    for name, rows in (("computed (no-cache)", fresh), ("duplicate (cache hit)", hits)):
        sv = [r["server_ms"] for r in rows]
        cl = [r["client_ms"] for r in rows]
        print(f"| {name} | {statistics.median(sv):.2f} | {percentile(sv, 99):.2f} | {statistics.median(cl):.2f} | {percentile(cl, 99):.2f} |")
    print(f"| no-op route (/healthz) | - | - | {statistics.median(noop):.2f} | {percentile(noop, 99):.2f} |")
    hit_ms = statistics.median(r["server_ms"] for r in hits)
    print(f"\nduplicate server time p50 {hit_ms:.2f} ms ({'under' if hit_ms < 5 else 'NOT under'} 5 ms); "
          f"client time over the no-op route "
          f"{statistics.median(r['client_ms'] for r in hits) - statistics.median(noop):.2f} ms; computed / hit "
          f"server time {statistics.median(r['server_ms'] for r in fresh) / hit_ms:.0f}x")

    print(f"\n## 2. A burst of {args.burst} identical uploads ({args.image}, {len(data)} bytes)\n")
    print("| burst | pipeline runs | statuses | X-Cache | lines read | wall s | img/s | client ms p50 | client ms p99 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rows, wall, runs in (("cache on (shared)", shared, shared_s, shared_runs),
                                   ("cache off (no-cache)", alone, alone_s, alone_runs)):
        cl = [r["client_ms"] for r in rows]
        statuses = ",".join(f"{k}x{v}" for k, v in sorted(_count(r["status"] for r in rows).items()))
        marks = ",".join(f"{k}x{v}" for k, v in sorted(_count(r["cache"] for r in rows).items()))
        lines = ",".join(str(k) for k in sorted({r["lines"] for r in rows}))
        print(f"| {name} | {runs} | {statuses} | {marks} | {lines} | {wall:.2f} | {len(rows) / wall:.2f} | "
              f"{statistics.median(cl):.0f} | {percentile(cl, 99):.0f} |")
    print(f"\nwall time off / on: {alone_s / shared_s:.1f}x; pipeline runs {shared_runs} vs {alone_runs}")


def _count(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


if __name__ == "__main__":
    sys.exit(standalone(__name__))
