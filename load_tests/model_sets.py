"""The model sets side by side in one process: each set's engine loaded and
warmed, then the peer images read in turns (the order flipped every pass) and
a few accented Latin lines; prints, per set, load and warm seconds, the memory
its engine added (RSS), the first read after warm, median and p99 ms per
image, images/s and its ratio to ppocrv4_mobile, lines read, and the accented
lines read exactly.

    OCR_V6_MODELS=DIR .venv/bin/python -m load_tests model_sets [--passes 2] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LATIN = ["Königstraße 5, Göttingen", "Muñoz y Peña, Señor", "Łódź, żółć gęślą", "Smørrebrød på Åland",
         "Ça coûte 12,50 € à Besançon", "Příliš žluťoučký kůň", "Fußgängerübergänge", "São João, Coração"]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main(argv=None) -> int:
    from serve_app.core.model_sets import SETS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(SETS), choices=list(SETS))
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="3 images, 2 lines: that it runs")
    ap.add_argument("--no-memory-optim", action="store_true",
                    help="predictor enable_memory_optim off (the converted v6 files need it off for now)")
    args = ap.parse_args(argv)

    from harness.latin import line_png
    from harness.peer import PEER, peer_names
    from serve_app.engine import OcrEngine, default_engine_config

    names = peer_names()[:3] if args.smoke else peer_names()
    latin = LATIN[:2] if args.smoke else LATIN
    latin_png = [line_png(t) for t in latin]
    cfg = default_engine_config()
    if args.no_memory_optim:
        cfg = cfg.model_copy(update={"predictor": cfg.predictor.model_copy(update={"enable_memory_optim": False})})
    rows, engines = {}, {}
    for model in args.models:
        before = rss_mb()
        print(f"loading {model}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            engines[model] = e = OcrEngine(cfg, model=model)
        except Exception as exc:  # a set that does not load is reported, the others still run
            print(f"{model}: not loaded: {exc}"[:400])
            continue
        load_s = time.perf_counter() - t0
        print(f"warming {model}", file=sys.stderr, flush=True)
        warm_s = e.warm()
        t0 = time.perf_counter()
        e.read(PEER / names[0])
        first_ms = (time.perf_counter() - t0) * 1000
        rows[model] = {"load_s": load_s, "warm_s": warm_s, "rss_mb": rss_mb() - before, "first_ms": first_ms,
                       "ms": [], "lines": 0, "exact": 0}
        for n in names:  # every image's shapes met once before timing
            e.read(PEER / n)
    models = [m for m in args.models if m in engines]
    for p in range(args.passes):
        order = models if p % 2 == 0 else list(reversed(models))
        for n in names:
            for model in order:
                t0 = time.perf_counter()
                res = engines[model].read(PEER / n)
                rows[model]["ms"].append((time.perf_counter() - t0) * 1000)
                if p == 0:
                    rows[model]["lines"] += len(res.lines)
    for model in models:
        for want, png in zip(latin, latin_png):
            got = " ".join(line.text for line in engines[model].read(png).lines)
            rows[model]["exact"] += got == want
    base = models[0]
    ips = {m: len(r["ms"]) / (sum(r["ms"]) / 1000) for m, r in rows.items()}
    print(f"{len(names)} peer images x {args.passes} pass(es), {len(latin)} accented lines; engine: "
          f"OpenVINO, {cfg.predictor.cpu_math_library_num_threads} threads")
    print(f"{'set':<16}{'load s':>8}{'warm s':>8}{'RSS MB':>8}{'1st ms':>8}{'med ms':>8}{'p99 ms':>8}"
          f"{'img/s':>7}{'x ' + base[:8]:>12}{'lines':>7}{'latin':>7}")
    for m, r in rows.items():
        ms = sorted(r["ms"])
        p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
        print(f"{m:<16}{r['load_s']:>8.1f}{r['warm_s']:>8.1f}{r['rss_mb']:>8.0f}{r['first_ms']:>8.0f}"
              f"{statistics.median(ms):>8.0f}{p99:>8.0f}{ips[m]:>7.2f}{ips[m] / ips[base]:>12.2f}{r['lines']:>7}"
              f"{r['exact']:>4}/{len(latin)}")
    for e in engines.values():
        e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
