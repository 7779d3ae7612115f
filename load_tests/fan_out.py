"""Where the parts of a fanned-out page are read: the share of pages whose
two recogniser calls ran on distinct replicas, and the page's latency at one
client, with Serve's default request router and with the recogniser's
part-spreading router (serve_app/serving/routing.py), in one run.

    flock /tmp/ray-tests.lock timeout 600 .venv/bin/python -m load_tests fan_out

Each mode deploys deployments.yaml (the router set or removed in the
TextRecognizer's `request_router_config`), then sends each image `--pages`
times, one at a time over HTTP. Around every page it reads both recogniser
replicas' batch counters (stats(): the last batch's sequence number); a page
whose parts ran on distinct replicas moved both counters.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]

from harness.service import deploy_config, free_port, load_config, replica_stats, start_ray, stop_all  # noqa: E402
from load_tests.stats import percentile  # noqa: E402
from harness.peer import PEER  # noqa: E402

REC = "TextRecognizer"
ROUTER = "serve_app.serving.routing:PartSpreadingRouter"
IMAGES = ("mmocr_demo_densetext_det.jpg", "rapidocr_en.jpg")


def with_router(config: dict, router: bool) -> dict:
    cfg = copy.deepcopy(config)
    rec = next(d for d in cfg["applications"][0]["deployments"] if d["name"] == REC)
    if router:
        rec["request_router_config"] = {"request_router_class": ROUTER}
    else:
        rec.pop("request_router_config", None)
    return cfg


def seqs(handle) -> dict[int, int]:
    """pid -> the number of predictor batches it has run."""
    return {pid: max((b["seq"] for b in st["recent_batches"]), default=0)
            for pid, st in replica_stats(handle, 2).items()}


def measure(url: str, handle, pages: int) -> dict[str, dict]:
    out = {}
    for name in IMAGES:
        data = (PEER / name).read_bytes()
        for _ in range(2):  # first requests after deploy are not counted
            requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/jpeg"}, timeout=120)
        lat, distinct, lines = [], 0, 0
        for _ in range(pages):
            before = seqs(handle)
            t0 = time.perf_counter()
            r = requests.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": "image/jpeg"}, timeout=120)
            lat.append((time.perf_counter() - t0) * 1000)
            r.raise_for_status()
            lines = len(r.json()["results"])
            after = seqs(handle)
            moved = [p for p in after if after[p] > before.get(p, 0)]
            distinct += len(moved) >= 2
        out[name] = {"pages": pages, "distinct": distinct, "p50": statistics.median(lat),
                     "p90": percentile(lat, 90), "lines": lines}
    return out


MODES = {"default": ("Serve's default router", False), "spread": ("part-spreading router", True)}


def one_mode(mode: str, pages: int) -> dict:
    """In a child process: deploy with or without the router, measure."""
    from ray import serve

    start_ray()
    try:
        url = deploy_config(with_router(load_config(), MODES[mode][1]), free_port())
        return measure(url, serve.get_deployment_handle(REC, "ocr"), pages)
    finally:
        stop_all(graceful=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=20, help="requests per image and mode")
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mode:
        print("RESULT " + json.dumps(one_mode(a.mode, a.pages)))
        return
    results = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    for mode, (label, _) in MODES.items():
        out = subprocess.run([sys.executable, "-m", "load_tests.fan_out", "--mode", mode, "--pages", str(a.pages)],
                             cwd=ROOT, capture_output=True, text=True, timeout=900)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            sys.exit(f"{label} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
        results[label] = json.loads(line[-1][7:])
        print(f"{label}: {results[label]}", flush=True)
    print()
    print(f"Run {started}; {a.pages} pages per image and mode, one at a time over HTTP; load average at start "
          f"{tuple(round(x, 2) for x in load0)}, at end {tuple(round(x, 2) for x in os.getloadavg())}")
    print()
    print("| router | image | lines | pages | parts on distinct replicas | p50 ms | p90 ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, per in results.items():
        for name, r in per.items():
            print(f"| {label} | {name} | {r['lines']} | {r['pages']} | {r['distinct']} "
                  f"({r['distinct'] / r['pages']:.0%}) | {r['p50']:.0f} | {r['p90']:.0f} |")


if __name__ == "__main__":
    main()
