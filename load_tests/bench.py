"""Load tests of the OCR service, with its baselines measured in the same
run: one process, one phase at a time, the same images and cores.

1. ``engine``: the in-process ``OcrEngine`` in a loop, one image at a time.
2. ``rapidocr``: RapidOCR on onnxruntime in-process, likewise (skipped with
   a note if not installed).
3. ``simple``: ``load_tests/simple_server.py`` (one process, one engine, a
   lock around ``engine.read``; FastAPI + uvicorn) on ``--simple-port``,
   loaded over HTTP like the service.
4. The service: this process's own local Ray, Serve on ``--port``, the
   applications of ``--config`` (default ``deployments.yaml``) deployed as
   ``serve deploy`` does. ``cold``: Ray start, Serve start, deploy to
   ``/readyz`` 200, each model replica's load and warm-up, the first
   request. ``http``: ``POST /v1/ocr`` closed loop at ``--clients``
   (saturation). ``open``: Poisson arrivals at ``--open-fraction`` (0.7) of
   that saturation (or ``--open-rate``). ``handle``:
   ``serve.get_app_handle("ocr").ocr.remote(bytes)``, closed loop. ``jobs``:
   ``POST /v1/ocr/jobs`` then polling; skipped with a note if the endpoint
   is not deployed (``--jobs-force``: run anyway). ``nobatch``: the closed
   loop again with ``max_batch_size: 1`` on the three model deployments.

Every point: ``--warmup`` s unrecorded, then ``--duration`` s measured;
latency over the requests *sent* in the window, throughput over the
answers *received* in it; open-loop latency from the scheduled arrival (no
coordinated omission). Each target first reads every image once, untimed.
Mean batch size per model stage: each deployment's ``stats()``, sampled
every 2 s and diffed per replica pid. Each point records the load average
and others' CPU (/proc); the report warns when they, or an engine point
slower than the simple server, make the comparison untrustworthy.

Outputs: ``<out>/benchmarks.md``, ``<out>/img/*.png``, the raw records as
JSON (``--raw``) and a summary line on stdout (progress on stderr). The
report is rendered from the raw JSON alone, so ``--from-raw FILE`` rewrites
a recorded run's report and plots, measuring nothing.

    .venv/bin/python -m load_tests serve load --quick               # < 2 min, proves the harness works
    .venv/bin/python -m load_tests serve load --n-images 20 --duration 30 --out DIR   # a full run
    .venv/bin/python -m load_tests serve load --targets handle --clients 1,8   # only the handle sweep
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from harness.service import REPO
from load_tests.images import DEFAULT_IMAGES, pick_images
from load_tests.loadgen import log
from load_tests.phases import run_in_process, run_service, run_simple
from load_tests.report import summary_line, write_raw, write_report
from load_tests.runs import ALL_TARGETS, SERVICE_TARGETS, Run


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
    ap.add_argument("--quick", action="store_true", help="everything at a tiny scale, < 2 min (asserts no speed)")
    ap.add_argument("--out", type=Path, help="report folder: benchmarks.md and img/ (default "
                                             "load_tests/out/serve-load, or load_tests/out/quick)")
    ap.add_argument("--raw", type=Path, help="raw JSON (default load_tests/out/bench_results[_quick].json)")
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES, help="image folder (default %(default)s)")
    ap.add_argument("--n-images", type=int, default=20, help="evenly spaced subset of the sorted images (0 = all)")
    ap.add_argument("--image", action="append", dest="image_names", help="use this image (repeatable)")
    ap.add_argument("--targets", "--target", dest="targets", default=",".join(ALL_TARGETS),
                    help="comma-separated subset of " + ",".join(ALL_TARGETS))
    ap.add_argument("--clients", type=ints, help="closed-loop clients for engine-vs-service sweeps (default 1,2,4,8,16)")
    ap.add_argument("--handle-clients", type=ints, help="default 1,8")
    ap.add_argument("--jobs-clients", type=ints, help="default 8")
    ap.add_argument("--nobatch-clients", type=ints, help="default 1,4,16")
    ap.add_argument("--open-fraction", type=float, default=0.7, help="open-loop rate as a fraction of saturation")
    ap.add_argument("--open-rate", type=float, help="open-loop rate (img/s), instead of the fraction")
    ap.add_argument("--warmup", type=float, help="seconds per point before measuring (default 5; quick 0.5)")
    ap.add_argument("--duration", type=float, help="measured seconds per point (default 30; quick 2)")
    ap.add_argument("--timeout", type=float, default=120.0, help="client timeout per request, seconds")
    ap.add_argument("--body", choices=("raw", "multipart"), default="raw", help="how HTTP requests carry the image")
    ap.add_argument("--config", type=Path, default=REPO / "deployments.yaml", help="Serve config to deploy")
    ap.add_argument("--port", type=int, default=8711, help="the service's HTTP port")
    ap.add_argument("--simple-port", type=int, default=8712, help="the simple server's port")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--jobs-force", action="store_true", help="run the jobs phase even if the probe fails")
    ap.add_argument("--deadline", type=float, help="skip the remaining points after this many seconds "
                                                   "(default 1500; quick 240)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--from-raw", type=Path, help="measure nothing: rewrite the report and plots of the run "
                                                  "recorded in this raw JSON (into --out, default its own)")


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that depend on --quick, and the paths made absolute."""
    q = args.quick
    args.clients = args.clients or ([1, 4] if q else [1, 2, 4, 8, 16])
    args.handle_clients = args.handle_clients or ([2] if q else [1, 8])
    args.jobs_clients = args.jobs_clients or ([2] if q else [8])
    args.nobatch_clients = args.nobatch_clients or ([4] if q else [1, 4, 16])
    args.warmup = args.warmup if args.warmup is not None else (0.5 if q else 5.0)
    args.duration = args.duration if args.duration is not None else (2.0 if q else 30.0)
    args.deadline = args.deadline or (240.0 if q else 1500.0)
    args.out = args.out or REPO / "load_tests/out" / ("quick" if q else "serve-load")
    args.raw = args.raw or REPO / f"load_tests/out/bench_results{'_quick' if q else ''}.json"
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in args.targets if t not in ALL_TARGETS]
    if bad:
        raise SystemExit(f"unknown targets {bad}; choose from {ALL_TARGETS}")
    if args.open_fraction <= 0 or args.duration <= 0:
        raise SystemExit("--open-fraction and --duration must be positive")
    args.config, args.images, args.out, args.raw = (p.resolve() for p in (args.config, args.images, args.out, args.raw))
    return args


def parse_args(argv: list[str]) -> argparse.Namespace:
    """A recorded run's argv (its raw JSON keeps it) read back."""
    ap = argparse.ArgumentParser()
    add_cli_args(ap)
    args = ap.parse_args(argv)
    args.argv = list(argv)
    return resolve(args)


def rerender(args) -> int:
    """--from-raw: the report and plots of a recorded run, nothing measured."""
    raw = json.loads(args.from_raw.read_text(encoding="utf-8"))
    orig = parse_args(raw["argv"])
    if "--out" in (args.argv or []):
        orig.out = args.out
    orig.raw = args.from_raw.resolve()
    run, _ = write_report(raw, orig)
    print(summary_line(run))
    return 0


async def main_async(args) -> int:
    images = pick_images(args.images, args.quick, None if args.n_images == 0 else args.n_images, args.image_names)
    run = Run(args)
    run.images = [i.name for i in images]
    log(f"{len(images)} images, targets {','.join(args.targets)}, {args.warmup:g}+{args.duration:g} s per point")
    try:
        run_in_process(run, images)
        if "simple" in args.targets:
            await run_simple(run, images)
        if SERVICE_TARGETS & set(args.targets):
            await run_service(run, images)
    finally:
        # the report is rendered from the raw JSON just written, as --from-raw does
        run, _ = write_report(write_raw(run, args.raw), args)
    print(summary_line(run))
    log(f"total {run.wall_s:.0f}s")
    return 1 if run.failures else 0


def main(args: argparse.Namespace) -> int:
    args = resolve(args)
    args.argv = list(getattr(args, "argv", None) or [])
    if args.from_raw:
        return rerender(args)
    return asyncio.run(main_async(args))


def _tiny_raw() -> dict:
    """A recorded run of four points, made here: what --smoke renders."""
    from load_tests.stats import Record, summarize

    def point(target, mode, load, latencies, window_s=2.0, images=("a.jpg", "b.jpg")):
        recs = [Record(0.1 * i, 0.1 * i + ms / 1000.0, 200, True, None, images[i % len(images)],
                       {"total": ms * 0.8}) for i, ms in enumerate(latencies)]
        return {"target": target, "label": target, "mode": mode, "load": load, "window_s": window_s,
                "summary": summarize(recs, (0.0, window_s)), "batches": None, "loadavg": [0.5, 0.5, 0.5],
                "cpu": {"machine": 1.0, "ours": 1.0, "others": 0.0}, "records": [r.to_json() for r in recs]}

    return {"argv": ["--quick"], "started": "2026-12-01 05:00:00 UTC", "wall_s": 10.0,
            "loadavg_start": [0.1] * 3, "loadavg_end": [0.2] * 3, "git": ["abc123", []], "machine": "smoke",
            "versions": "python 3", "cold": {"deploy_to_ready_s": 5.0}, "probes": {}, "notes": ["a note"],
            "failures": [], "images": ["a.jpg", "b.jpg"],
            "points": [point("engine", "loop", 1, [100, 200] * 5), point("simple", "closed", 1, [110, 210] * 5),
                       point("http", "closed", 1, [115, 215] * 5), point("http", "closed", 4, [300, 500] * 10)]}


def smoke(args: argparse.Namespace) -> int:
    """The statistics and the report of a tiny recorded run, rendered twice
    from its raw JSON (as --from-raw does): no Ray, no models."""
    import math
    import tempfile

    from load_tests.cli import check
    from load_tests.stats import Record, percentile, percentiles, summarize

    check(percentile([1, 2, 3, 4], 50) == 2.5 and abs(percentile(range(1, 101), 99) - 99.01) < 1e-9,
          "percentile: linear interpolation between closest ranks")
    check(math.isnan(percentile([], 50)) and percentiles([1, 2, 3, 4])["p50"] == 2.5, "percentile of nothing: NaN")
    recs = [Record(0.5, 0.6, 200, True, None, "a", None), Record(1.0, 1.1, 200, True, None, "a", {"total": 80.0}),
            Record(1.5, 1.8, 200, True, None, "a", {"total": 200.0}),
            Record(2.0, 2.05, 503, False, "HTTP 503: overloaded", "a", None), Record(2.9, 3.3, 200, True, None, "a", None)]
    s = summarize(recs, (1.0, 3.0))
    check((s["requests"], s["ok"], s["errors"], s["throughput"]) == (4, 3, 1, 1.0),
          f"summary counts what was sent in the window and answered in it: {s}")
    raw = json.loads(json.dumps(_tiny_raw()))
    with tempfile.TemporaryDirectory() as tmp:
        args = parse_args(["--quick", "--out", f"{tmp}/a"])
        run, path = write_report(raw, args)
        md = path.read_text()
        check("| service, HTTP | 4 clients | 20 |" in md, "the report's table has the 4-client HTTP point")
        check(md.rstrip().splitlines()[-1] == summary_line(run), "the report ends in its summary line")
        args.out = Path(tmp) / "b"
        _, again = write_report(json.loads(json.dumps(raw)), args)
        check(again.read_text() == md, "the same raw JSON renders the same report")
    print(summary_line(run))
    return 0
