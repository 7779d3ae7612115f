"""Benchmark: priority lanes (serve_app/core/lanes.py, docs/operations.md "Priority lanes").
One service from deployments.yaml (result cache off), measured twice in one
run: with lanes on (as configured) and with `lanes.enabled: false` (one lane,
the service as before lanes), each a fresh Ray cluster:

1. interactive alone: 1 client, sync POST /v1/ocr (interactive by default),
   over a mix of peer images: the unloaded latency of each image;
2. bulk saturating + interactive: N clients sending sync requests with
   `X-Priority: bulk` (closed loop, under lanes.bulk_max_in_flight so none is
   refused) and 1 interactive client, both over the same mix;
3. bulk alone: the same N bulk clients: throughput (images and lines read
   per second).

Interactive latency under load is given raw (p50, p99) and as a slowdown:
each request's latency over the unloaded median of its own image in the
same configuration (so the mix of images does not move the figure).
Targets (issue #16): loaded interactive p50 <= 1.5x unloaded, p99 <= 3x;
bulk alone with lanes on >= 0.95x the throughput with lanes off.

    .venv/bin/python -m load_tests hostile priority [--unloaded-s 25] [--load-s 40] [--warmup-s 8] [--bulk-clients 12]

Prints one table; --json FILE writes the raw summaries."""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import time
from pathlib import Path
from typing import Any, Optional


from harness import service  # noqa: E402
from load_tests.images import DEFAULT_IMAGES, SOAK_IMAGES, Img, load  # noqa: E402
from load_tests.loadgen import closed_loop, log, now  # noqa: E402
from load_tests.stats import Record, fmt, percentile, summarize  # noqa: E402
import sys  # noqa: E402
from load_tests.cli import standalone  # noqa: E402


async def post(session, base: str, img: Img, lane: Optional[str], timeout_s: float = 300) -> Record:
    """POST /v1/ocr (raw body), X-Priority: lane if given; never raises. The
    record's timings carry the answer's timings_ms and `lines` read."""
    import aiohttp

    t0 = now()
    status, err, timings = 0, None, None
    headers = {"Content-Type": img.ctype, **({"X-Priority": lane} if lane else {})}
    try:
        async with session.post(f"{base}/v1/ocr", data=img.data, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            status = r.status
            payload = await r.read()
        if status == 200:
            doc = json.loads(payload)
            timings = {**doc.get("timings_ms", {}), "lines": len(doc.get("results", []))}
        else:
            err = f"HTTP {status}: {payload[:200].decode('utf-8', 'replace')}"
    except asyncio.TimeoutError:
        err = f"timeout after {timeout_s:g}s"
    except Exception as e:
        err = f"{type(e).__name__}: {e}"[:300]
    return Record(t0, now(), status, err is None and status == 200, err, img.name, timings)


def lines_per_s(recs: list[Record], window: tuple[float, float]) -> float:
    ws, we = window
    return sum((r.timings or {}).get("lines", 0) for r in recs if r.ok and ws <= r.t_done < we) / (we - ws)


def slowdowns(recs: list[Record], window: tuple[float, float], unloaded: dict[str, float]) -> list[float]:
    ws, we = window
    return [r.latency_ms / unloaded[r.image] for r in recs if r.ok and ws <= r.t_start < we and r.image in unloaded]


async def measure(url: str, images: list[Img], args) -> dict[str, Any]:
    import aiohttp

    out: dict[str, Any] = {}
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        def sender(lane):
            return lambda img, _t: post(session, url, img, lane)

        for img in images:  # every image once: shapes met, nothing cold in the windows
            await post(session, url, img, None)
        recs, win, _ = await closed_loop(sender(None), images, 1, 2.0, args.unloaded_s, "interactive alone")
        unloaded = {}
        for r in recs:
            if r.ok and win[0] <= r.t_start < win[1]:
                unloaded.setdefault(r.image, []).append(r.latency_ms)
        unloaded = {k: percentile(v, 50) for k, v in unloaded.items()}
        out["alone"] = {**summarize(recs, win), "slowdown": slowdowns(recs, win, unloaded)}

        (brecs, bwin, _), (irecs, iwin, _) = await asyncio.gather(
            closed_loop(sender("bulk"), images, args.bulk_clients, args.warmup_s, args.load_s, "bulk (loaded)"),
            closed_loop(sender(None), images[3:] + images[:3], 1, args.warmup_s, args.load_s, "interactive (loaded)"))
        out["loaded_interactive"] = {**summarize(irecs, iwin), "slowdown": slowdowns(irecs, iwin, unloaded)}
        out["loaded_bulk"] = {**summarize(brecs, bwin), "lines_per_s": lines_per_s(brecs, bwin)}

        brecs, bwin, _ = await closed_loop(sender("bulk"), images, args.bulk_clients, args.warmup_s, args.load_s,
                                           "bulk alone")
        out["bulk_alone"] = {**summarize(brecs, bwin), "lines_per_s": lines_per_s(brecs, bwin)}
        out["unloaded_image_ms"] = unloaded
    return out


def run_config(cfg: dict, images: list[Img], args) -> dict[str, Any]:
    service.start_ray()
    try:
        t0 = time.monotonic()
        url = service.deploy_config(cfg, args.port or service.free_port())
        log(f"deployed in {time.monotonic() - t0:.0f}s")
        return asyncio.run(measure(url, images, args))
    finally:
        service.stop_all()  # graceful: Serve's client is reset for the next configuration's cluster


def config_with_lanes(path: Path, enabled: bool, overrides: Optional[dict] = None) -> dict:
    cfg = copy.deepcopy(service.load_config(path, cache=False))
    for app in cfg["applications"]:
        if app.get("import_path") == "serve_app.app:build_app":
            lanes = app.setdefault("args", {}).setdefault("lanes", {})
            lanes.update(overrides or {}, enabled=enabled)
    return cfg


def parse_variant(text: str) -> tuple[str, dict]:
    """`label:key=value,key=value` -> (label, lanes overrides), values as YAML."""
    import yaml

    label, _, rest = text.partition(":")
    pairs = [kv.split("=", 1) for kv in rest.split(",") if kv]
    return label, {k: yaml.safe_load(v) for k, v in pairs}


def table(res: dict[str, dict]) -> str:
    base = "off" if "off" in res else next(iter(res))
    off = res[base]
    rows = ["| phase | lanes | requests | errors | p50 ms | p99 ms | slowdown p50 | slowdown p99 | img/s | lines/s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    configs = list(res.items())
    for phase, label in (("alone", "interactive alone (1 client)"),
                         ("loaded_interactive", "interactive (1 client) + bulk saturating"),
                         ("loaded_bulk", "bulk, beside the interactive client"),
                         ("bulk_alone", "bulk alone")):
        for name, r in configs:
            s = r[phase]
            sd = s.get("slowdown")
            rows.append(f"| {label} | {name} | {s['requests']} | {s['errors']} | {fmt(s['p50_ms'])} | "
                        f"{fmt(s['p99_ms'])} | {fmt(percentile(sd, 50), 2) if sd else '-'} | "
                        f"{fmt(percentile(sd, 99), 2) if sd else '-'} | {fmt(s['throughput'], 2)} | "
                        f"{fmt(s.get('lines_per_s'), 1) if 'lines_per_s' in s else '-'} |")
    ratios = []
    for name, r in configs:
        a, b = r["alone"], r["loaded_interactive"]
        ratios.append(f"| interactive loaded / alone, lanes {name} | p50 {fmt(b['p50_ms'] / a['p50_ms'], 2)}x | "
                      f"p99 {fmt(b['p99_ms'] / a['p99_ms'], 2)}x | slowdown p50 "
                      f"{fmt(percentile(b['slowdown'], 50), 2)}x, p99 {fmt(percentile(b['slowdown'], 99), 2)}x |")
    for name, r in configs:
        if name != base:
            ratios.append(f"| bulk alone throughput, lanes {name} / {base} | "
                          f"{fmt(r['bulk_alone']['throughput'] / off['bulk_alone']['throughput'], 3)}x img/s | "
                          f"{fmt(r['bulk_alone']['lines_per_s'] / off['bulk_alone']['lines_per_s'], 3)}x lines/s | "
                          f"targets: interactive p50 <= 1.5x, p99 <= 3x; bulk >= 0.95x |")
    return "\n".join(rows) + "\n\n| ratio | | | |\n|---|---|---|---|\n" + "\n".join(ratios)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config", type=Path, default=service.DEFAULT_CONFIG)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--unloaded-s", type=float, default=25.0)
    ap.add_argument("--load-s", type=float, default=40.0)
    ap.add_argument("--warmup-s", type=float, default=8.0)
    ap.add_argument("--bulk-clients", type=int, default=12)
    ap.add_argument("--images", nargs="*", default=list(SOAK_IMAGES))
    ap.add_argument("--variant", action="append", default=[],
                    help="another lanes-on configuration, LABEL:key=value,... (lanes overrides), measured too")
    ap.add_argument("--no-off", action="store_true",
                    help="skip the lanes-off configuration (variants are then compared with lanes on)")
    ap.add_argument("--json", type=Path)


def main(args: argparse.Namespace) -> int:
    images = load(DEFAULT_IMAGES, args.images)
    res = {}
    for name, enabled, overrides in [("on", True, {}), *([] if args.no_off else [("off", False, {})]),
                                     *((*parse_variant(v)[:1], True, parse_variant(v)[1]) for v in args.variant)]:
        log(f"lanes {name} {overrides or ''}")
        res[name] = run_config(config_with_lanes(args.config, enabled, overrides), images, args)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, default=str))
    print(f"images: {', '.join(i.name for i in images)}; bulk clients {args.bulk_clients} (X-Priority: bulk); "
          f"windows: {args.unloaded_s:g}s alone, {args.load_s:g}s loaded after {args.warmup_s:g}s warm-up")
    print(table(res))


if __name__ == "__main__":
    sys.exit(standalone(__name__))
