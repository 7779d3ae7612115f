"""The detector's closed input ladder against the old open sizing ("max",
long side at most 1280), in one process: two engines, each warmed and shown
every image once, then the 60 peer images read alternately by each (the
order flipped every pass), so both see the same machine. Prints images/s,
median latency and lines read for each, and the throughput ratio.

    .venv/bin/python -m load_tests det_sizing [--passes 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args(argv)

    from harness.peer import PEER, reference
    from serve_app.core.engine_config import DetOptions
    from serve_app.engine import OcrEngine, default_engine_config

    names = sorted(reference())
    sizings = {"closed ladder (default)": DetOptions(), "open, long side <= 1280": DetOptions(limit_type="max")}
    engines = {k: OcrEngine(default_engine_config().model_copy(update={"det": v})) for k, v in sizings.items()}
    for e in engines.values():
        e.warm()
        for n in names:
            e.read(PEER / n)  # every image's shapes met once (the open sizing: its own)
    times = {k: [] for k in engines}
    lines = dict.fromkeys(engines, 0)
    for p in range(args.passes):
        order = list(engines.items()) if p % 2 == 0 else list(reversed(engines.items()))
        for n in names:
            data = (PEER / n).read_bytes()
            for k, e in order:
                t = time.perf_counter()
                r = e.read(data)
                times[k].append(time.perf_counter() - t)
                lines[k] += len(r.lines) if p == 0 else 0
    print("| detector sizing | images/s | median ms | lines read |")
    print("|---|---:|---:|---:|")
    for k in engines:
        print(f"| {k} | {len(times[k]) / sum(times[k]):.2f} | {statistics.median(times[k]) * 1000:.0f} | {lines[k]} |")
    a, b = (sum(v) for v in times.values())
    print(f"\nclosed / open throughput: {b / a:.2f}x")
    for e in engines.values():
        e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
