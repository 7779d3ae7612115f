"""Benchmark: the cheapest, costliest requests (issue 24), each sent alone
to the real service while a normal client keeps reading one word image,
one request after another.

    flock -w 1200 /tmp/ray-tests.lock timeout 900 .venv/bin/python -m load_tests hostile costs

The service is deployments.yaml (result cache off, as in every benchmark)
with engine.documents.page_timeout_s at --page-timeout (default 10, as
shipped). First the normal client alone (--baseline requests: its p50 and
max latency, the baseline of this run), then each case: what is sent (its
bytes), the status and error code the service answered, in what time, the
ingress's peak RSS growth while it ran, and the normal client's requests
meanwhile (how many, their statuses, p50 and max latency). Prints one table
(markdown).

`CASES` is also what tests/integration/test_hostile_costs.py and the soak's
hostile share (load_tests/soak.py) send."""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Optional


from harness.procfs import rss_mb  # noqa: E402  the one /proc reader
from harness.hostile import CASES, Case  # noqa: E402
from harness.peer import PEER  # noqa: E402
import sys  # noqa: E402
from load_tests.cli import standalone  # noqa: E402


# -- the run ------------------------------------------------------------------------------


class Normal:
    """A normal client reading one image again and again, one at a time."""

    def __init__(self, url: str, body: bytes, headers: dict):
        self.url, self.body, self.headers = url, body, headers
        self.seen: list[tuple[int, float]] = []
        self._stop = threading.Event()

    def one(self) -> tuple[int, float]:
        import requests

        t = time.perf_counter()
        try:
            r = requests.post(f"{self.url}/v1/ocr", data=self.body,
                              headers={"Content-Type": "image/jpeg", **self.headers}, timeout=120)
            status = r.status_code
        except Exception:
            status = 0
        return status, time.perf_counter() - t

    def __enter__(self):
        def loop():
            while not self._stop.is_set():
                self.seen.append(self.one())

        self._t = threading.Thread(target=loop, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def send_case(url: str, case: Case, headers: dict, ingress_pid: Optional[int]) -> dict:
    """Send one case; its status, code, seconds, bytes and the ingress's peak RSS growth."""
    import requests

    body, ctype = case.request()
    base = rss_mb(ingress_pid) if ingress_pid else 0.0
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set() and ingress_pid:
            peak[0] = max(peak[0], rss_mb(ingress_pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t = time.perf_counter()
    try:
        r = requests.post(f"{url}/v1/ocr", data=body, headers={"Content-Type": ctype, **headers}, timeout=600)
        status, text = r.status_code, r.text
    except Exception as e:
        status, text = 0, type(e).__name__
    seconds = time.perf_counter() - t
    stop.set()
    sampler.join()
    try:
        err = json.loads(text).get("error", {})
    except Exception:
        err = {}
    return {"status": status, "code": err.get("code", ""), "message": err.get("message", ""), "seconds": seconds,
            "bytes": len(body), "rss_mb": peak[0] - base}


def summary(seen: list[tuple[int, float]]) -> str:
    if not seen:
        return "none"
    codes = sorted({s for s, _ in seen})
    ms = [s * 1000 for _, s in seen]
    return (f"{len(seen)} x {'/'.join(map(str, codes))}, p50 {statistics.median(ms):.0f} ms, "
            f"max {max(ms):.0f} ms")


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--page-timeout", type=float, default=10.0)
    p.add_argument("--baseline", type=int, default=10)
    p.add_argument("--only", default="", help="cases whose name contains this")


def main(args: argparse.Namespace) -> int:

    from harness import service

    small = (PEER / "mmocr_word_1036169.jpg").read_bytes()
    service.start_ray()
    cfg = service.load_config()
    app = cfg["applications"][0]
    app["args"]["engine"]["documents"] = {**app["args"]["engine"].get("documents", {}),
                                          "page_timeout_s": args.page_timeout}
    rows = []
    try:
        url = service.deploy_config(cfg, service.free_port())
        pid = service.replica_pids(["OcrIngress"])["OcrIngress"][0]
        normal = Normal(url, small, {})
        for _ in range(3):
            normal.one()  # warm
        alone = [normal.one() for _ in range(args.baseline)]
        print(f"normal client alone: {summary(alone)}", flush=True)
        for case in CASES:
            if args.only and args.only not in case.name:
                continue
            with Normal(url, small, {}) as during:
                got = send_case(url, case, {}, pid)
            print(f"{case.name}: {got}; normal meanwhile: {summary(during.seen)}", flush=True)
            rows.append((case, got, during.seen))
    finally:
        service.stop_all()
    print(f"\nbaseline (normal client alone, same run): {summary(alone)}\n")
    print("| sent | bytes | answer | time | ingress RSS growth | normal request meanwhile |")
    print("|---|---:|---|---:|---:|---|")
    for case, got, seen in rows:
        print(f"| {case.name} | {got['bytes']:,} | {got['status']} {got['code']} | {got['seconds']:.2f} s | "
              f"{got['rss_mb']:.0f} MB | {summary(seen)} |")


def smoke(args: argparse.Namespace) -> int:
    """Every case's request built as it is sent (no service): each a few
    bytes to a few MiB, the cheapest, costliest requests it claims to be."""
    from load_tests.cli import check

    for case in CASES:
        body, ctype = case.request()
        check(0 < len(body) < 32 << 20 and ctype, f"{case.name}: {len(body)} bytes, {ctype!r}")
        print(f"{case.name}: {len(body):,} bytes ({ctype}) -> {case.status} {case.code}")
    return 0


if __name__ == "__main__":
    sys.exit(standalone(__name__))
