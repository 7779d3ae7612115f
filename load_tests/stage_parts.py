"""One client's time, part by part, against a running service and the
in-process engine: per peer image the client's latency, the ingress's
(Server-Timing), the pipeline's total and its stages (decode, det, cls,
rec: `timings_ms`), medians over the set, and the same stage times of the
engine on the same images. Shows whether a gap is in the hops (client
minus pipeline total) or inside the stages (the same work slower in the
service's process).

    make serve   # or: serve run deployments.light.yaml (another shell)
    flock -w 600 /tmp/ray-tests.lock .venv/bin/python -m load_tests hops budget stages --url http://127.0.0.1:8000

Every request has `Cache-Control: no-cache`; one untimed pass first (the
service's shapes built after ready, the engine's warm-up), then
`--passes` timed ones; the engine runs in this process after the service's
passes, on the same cores, the service idle meanwhile."""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path
import sys  # noqa: E402
from load_tests.cli import standalone  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("decode", "det", "cls", "rec", "total")


def peer_images() -> dict[str, bytes]:
    from harness.peer import PEER, peer_names

    return {n: (PEER / n).read_bytes() for n in peer_names()}


def service_rows(url: str, data: dict[str, bytes], passes: int) -> list[dict]:
    import requests

    rows = []
    with requests.Session() as s:
        for rnd in range(passes + 1):
            for n, body in data.items():
                ctype = "image/png" if n.endswith(".png") else "image/jpeg"
                t = time.perf_counter()
                r = s.post(f"{url}/v1/ocr", data=body, timeout=120,
                           headers={"Content-Type": ctype, "Cache-Control": "no-cache"})
                ms = (time.perf_counter() - t) * 1000
                r.raise_for_status()
                if rnd == 0:
                    continue
                m = re.search(r"dur=([\d.]+)", r.headers.get("server-timing", ""))
                tm = r.json().get("timings_ms", {})
                rows.append({"client": ms, "ingress": float(m.group(1)) if m else float("nan"),
                             **{k: tm.get(k, 0.0) for k in PARTS}})
    return rows


def engine_rows(data: dict[str, bytes], passes: int) -> list[dict]:
    from serve_app.engine import OcrEngine

    rows = []
    with OcrEngine() as eng:
        eng.warm()
        for rnd in range(passes + 1):
            for body in data.values():
                t = time.perf_counter()
                res = eng.read(body)
                ms = (time.perf_counter() - t) * 1000
                if rnd:
                    rows.append({"client": ms, **{k: res.timings_ms.get(k, 0.0) for k in PARTS}})
    return rows


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--no-engine", action="store_true", help="the service only")


def main(args: argparse.Namespace) -> int:
    data = peer_images()
    t0 = time.time()
    svc = service_rows(args.url, data, args.passes)
    eng = [] if args.no_engine else engine_rows(data, args.passes)
    print(f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}, {time.time() - t0:.0f} s, "
          f"{len(data)} peer images x {args.passes} timed passes; medians per image, ms\n")
    print("| | client | ingress (Server-Timing) | pipeline total | decode | det | cls | rec |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("| service | " + " | ".join(f"{med(svc, k):.1f}" for k in ("client", "ingress", *PARTS[-1:], *PARTS[:-1]))
          + " |")
    if eng:
        print("| engine | " + f"{med(eng, 'client'):.1f} | - | " + " | ".join(
            f"{med(eng, k):.1f}" for k in (*PARTS[-1:], *PARTS[:-1])) + " |")
    print(f"\nhops (median of client - pipeline total per image): "
          f"{statistics.median(r['client'] - r['total'] for r in svc):.1f} ms, of which proxy to ingress "
          f"{statistics.median(r['client'] - r['ingress'] for r in svc):.1f} ms")


if __name__ == "__main__":
    sys.exit(standalone(__name__))
