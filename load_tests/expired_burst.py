"""Benchmark: does work for requests that are gone stop? A burst of dense
pages whose deadline (X-Request-Timeout) passes almost at once, then one
small image: its latency against its unloaded latency, and against the same
burst sent without a deadline (all of it worked through), measured in the
same run.

    .venv/bin/python -m load_tests expired_burst [--burst 12] [--rounds 5] [--deadline 0.3]

Prints a table: the small image's median latency unloaded, right after an
expired burst, and right after a live burst, with the ratios to unloaded,
and how many of the burst's pages the detector ran."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from harness import service  # noqa: E402
from load_tests.images import DEFAULT_IMAGES  # noqa: E402

SMALL = "mmocr_word_1036169.jpg"
DENSE = "paddleocr_00018069.jpg"


def post(url: str, data: bytes, timeout: str | None = None) -> tuple[int, float]:
    import requests

    headers = {"Content-Type": "image/jpeg", **({"X-Request-Timeout": timeout} if timeout else {})}
    t0 = time.perf_counter()
    r = requests.post(f"{url}/v1/ocr", data=data, headers=headers, timeout=600)
    return r.status_code, (time.perf_counter() - t0) * 1000


def detected_images() -> int:
    from ray import serve

    h = serve.get_deployment_handle("TextDetector", app_name="ocr")
    return sum(b["items"] for st in service.replica_stats(h, 1, tries=10).values() for b in st["recent_batches"])


def after_burst(url: str, small: bytes, dense: bytes, n: int, deadline: str | None) -> tuple[float, list[int], int]:
    """Send n dense pages at once, then (0.1 s later) the small image; its
    latency, the burst's statuses, and the images the detector ran."""
    before = detected_images()
    with ThreadPoolExecutor(n) as pool:
        burst = [pool.submit(post, url, dense, deadline) for _ in range(n)]
        time.sleep(0.1)
        status, ms = post(url, small)
        codes = [b.result()[0] for b in burst]
    assert status == 200, status
    time.sleep(1.0)
    return ms, codes, detected_images() - before - 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--burst", type=int, default=12)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--deadline", default="0.3", help="X-Request-Timeout of the burst's pages (s)")
    p.add_argument("--port", type=int, default=8731)
    p.add_argument("--config", type=Path, default=service.DEFAULT_CONFIG)
    args = p.parse_args(argv)
    small, dense = (DEFAULT_IMAGES / SMALL).read_bytes(), (DEFAULT_IMAGES / DENSE).read_bytes()
    service.start_ray()
    try:
        url = service.deploy_config(service.load_config(args.config), args.port)
        for _ in range(3):
            post(url, small), post(url, dense)
        unloaded = statistics.median(post(url, small)[1] for _ in range(10))
        expired, live = [], []
        for _ in range(args.rounds):
            expired.append(after_burst(url, small, dense, args.burst, args.deadline))
            live.append(after_burst(url, small, dense, args.burst, None))
    finally:
        service.stop_all()
    print(f"\nsmall image ({SMALL}) after a burst of {args.burst} dense pages ({DENSE}), "
          f"median of {args.rounds} rounds\n")
    print("| case | small image ms | x unloaded | burst answers | burst pages the detector ran |")
    print("|---|---|---|---|---|")
    print(f"| unloaded | {unloaded:.0f} | 1.00 | - | - |")
    for label, rows in ((f"after an expired burst (deadline {args.deadline} s)", expired),
                        ("after a live burst (no deadline)", live)):
        ms = statistics.median(r[0] for r in rows)
        codes = sorted({c for r in rows for c in r[1]})
        ran = statistics.median(r[2] for r in rows)
        print(f"| {label} | {ms:.0f} | {ms / unloaded:.2f} | {codes} | {ran:.0f} of {args.burst} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
