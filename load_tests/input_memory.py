"""Memory against the image sizes a service meets: the in-process engine
(default config: the detector's closed input ladder; every model's input
shapes warmed first, as the replicas do) reads N images of random sizes (100-4000 px a
side, aspect ratios up to 1:20, made by resizing the peer images), and the
process's RSS is printed after the warm-up, after the first 50 images and
at the end. Paddle's OpenVINO engine keeps memory for every input shape it
meets, so with an open set of shapes RSS grows with every new size; with
the closed set it must stay flat (goal: under 10% growth from image 50 to
the end).

    .venv/bin/python -m load_tests memory input [--images 300] [--seed 0] [--open]

--open runs the old open policy ("max", long side 1280, nothing warmed)
for comparison. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
from harness.peer import PEER  # noqa: E402

from harness.procfs import rss_mb  # noqa: E402
from load_tests.cli import standalone  # noqa: E402


def random_sizes(n: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        long = int(rng.integers(100, 4001))
        aspect = float(np.exp(rng.uniform(0, np.log(20))))  # 1:1 .. 1:20, log-uniform
        short = max(100, int(long / aspect))
        out.append((long, short) if rng.random() < 0.5 else (short, long))
    return out


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--open", action="store_true", help="the old open detector sizing (limit_type max 1280)")


def main(args: argparse.Namespace) -> int:

    from serve_app.core.engine_config import DetOptions
    from serve_app.engine import OcrEngine, default_engine_config
    from serve_app.ocr.det_preprocess import det_input_shapes

    det = DetOptions(limit_type="max", limit_side_len=1280) if args.open else DetOptions()
    sources = [cv2.imread(str(p)) for p in sorted(PEER.glob("*.jpg"))]
    sources = [s for s in sources if s is not None and min(s.shape[:2]) >= 200]
    rows = []
    with OcrEngine(default_engine_config().model_copy(update={"det": det})) as engine:
        t0 = time.perf_counter()
        engine.warm()  # every input shape of every model, as the replicas do before they are ready
        rows.append(("warmed", len(det_input_shapes(det)), time.perf_counter() - t0, rss_mb()))
        lines = 0
        for i, (h, w) in enumerate(random_sizes(args.images, args.seed), 1):
            img = cv2.resize(sources[i % len(sources)], (w, h))
            lines += len(engine.read(img).lines)
            if i in (50, 100, 200) or i == args.images:
                rows.append((f"after {i} images", i, time.perf_counter() - t0, rss_mb()))
    base = next(r[3] for r in rows if r[0] == "after 50 images")
    print(f"\ndetector sizing: {'open (max 1280)' if args.open else 'closed ladder ' + str(det.side_ladder)}; "
          f"{args.images} random sizes, seed {args.seed}, {lines} lines read\n")
    print("| point | images (warmed: detector shapes) | seconds | RSS MB | vs after 50 |")
    print("|---|---:|---:|---:|---:|")
    for name, n, sec, rss in rows:
        print(f"| {name} | {n} | {sec:.1f} | {rss:.0f} | {100 * (rss / base - 1):+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(standalone(__name__))
