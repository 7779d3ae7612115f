"""A small request's latency beside clients of tall images, per Serve config:
the cost of sharing one model process (deployments.light.yaml) measured
against a layout of separate ones, in one run.

    flock -w 900 /tmp/ray-tests.lock timeout 900 .venv/bin/python -m load_tests beside_tall \
        --configs /tmp/light_two_procs.yaml,deployments.light.yaml

For each config, `serve run` of a copy (load_tests.footprint.ServeRun); once
every recogniser shape is built (stats: shapes_left 0), one client reads a
word crop `--alone` times (the baseline); then `--tall-clients` clients each
send `--tall-each` tall images (a receipt stacked 6 high: the detector reads
it in tiles, each a call of its own) while the one client keeps reading the
word. Every request sends `Cache-Control: no-cache`. Printed: the word's
latency alone and beside (p50, max, answers by status), the tall images'
latency, and the lines each read (the word's text must not change)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]

from harness.peer import PEER  # noqa: E402
from load_tests.footprint import ServeRun, parse_config, shapes_left  # noqa: E402
from load_tests.stats import percentile  # noqa: E402

WORD = "mmocr_word_1036169.jpg"
TALL = "mmocr_wildreceipt_1.jpeg"


def post(url: str, data: bytes) -> tuple[int, float, list[str]]:
    t = time.perf_counter()
    try:
        r = requests.post(f"{url}/v1/ocr", data=data, timeout=120,
                          headers={"Content-Type": "image/jpeg", "Cache-Control": "no-cache"})
    except requests.RequestException:
        return 0, (time.perf_counter() - t) * 1000, []
    texts = [x["text"] for x in r.json().get("results", [])] if r.status_code == 200 else []
    return r.status_code, (time.perf_counter() - t) * 1000, texts


def wait_built(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while shapes_left(url) and time.monotonic() < deadline:
        time.sleep(1)


def measure(spec: str, args) -> dict:
    path, overrides = parse_config(spec)
    work = Path(tempfile.mkdtemp(prefix="beside-tall-"))
    run = ServeRun(ROOT / path, work, work / "cache", overrides)
    ready_s = run.start(240)
    try:
        wait_built(run.url)
        word = (PEER / WORD).read_bytes()
        tall = cv2.imencode(".jpg", np.vstack([cv2.imread(str(PEER / TALL))] * 6))[1].tobytes()
        alone = [post(run.url, word) for _ in range(args.alone)]
        talls: list = []

        def tall_client():
            for _ in range(args.tall_each):
                talls.append(post(run.url, tall))

        threads = [threading.Thread(target=tall_client) for _ in range(args.tall_clients)]
        for t in threads:
            t.start()
        beside: list = []
        while any(t.is_alive() for t in threads):
            beside.append(post(run.url, word))
            time.sleep(args.pause)
        for t in threads:
            t.join()
        return {"config": spec, "ready_s": ready_s, "alone": alone, "beside": beside, "tall": talls}
    finally:
        run.stop()


def row(name: str, answers: list) -> str:
    ok = [ms for code, ms, _ in answers if code == 200]
    codes: dict = {}
    for code, _, _ in answers:
        codes[code] = codes.get(code, 0) + 1
    p50 = f"{percentile(ok, 50):.0f}" if ok else "-"
    top = f"{max(ok):.0f}" if ok else "-"
    return f"{name}: {len(answers)} answers {dict(sorted(codes.items()))}, p50 {p50} ms, max {top} ms"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="deployments.light.yaml")
    ap.add_argument("--alone", type=int, default=10)
    ap.add_argument("--tall-clients", type=int, default=6)
    ap.add_argument("--tall-each", type=int, default=2)
    ap.add_argument("--pause", type=float, default=0.5, help="seconds between the word client's requests")
    args = ap.parse_args(argv)
    results = [measure(c.strip(), args) for c in args.configs.split(",") if c.strip()]
    print(f"\nRun {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; word {WORD}, tall {TALL} x6 stacked, "
          f"{args.tall_clients} tall clients x {args.tall_each}")
    for r in results:
        print(f"\n{r['config']} (ready {r['ready_s']:.1f} s)")
        for name in ("alone", "beside", "tall"):
            print("  " + row(f"{name:<6}", r[name]))
        words = {tuple(t) for code, _, t in r["alone"] + r["beside"] if code == 200}
        print(f"  the word read as: {sorted(words)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
