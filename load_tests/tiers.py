"""The model tiers side by side in one run: each evaluation set
(harness/eval_sets.py) read by each model set with the in-process engine:
lines read, exact lines, CER, img/s, memory, and each set's FLOP floor
(GFLOP per image over the GFLOP/s this engine reaches on one large
convolution here) beside its img/s; ratios against ppocrv4_mobile.

Each model reads in its own child process (its peak RSS its own), one
untimed pass whose texts are scored; the img/s come from one more child
with every model loaded, `--repeats` timed passes interleaved image by
image (the order rotated each pass), so other work's load falls on every
model alike: read the `x v4` ratios.

    python -m load_tests engine tiers          # every set, every model (~8 min on 2 cores)"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Callable

from harness.procfs import load_line

MODELS = ("ppocrv4_mobile", "ppocrv6_small", "ppocrv6_tiny")
BASE = "ppocrv4_mobile"
# GFLOP per detector input of 960x960 and per recogniser crop of 48x320
# (counted from the models: see `gflop_figures`); cls is left out (every
# set runs the same classifier).
CONV = (1, 128, 128, 128, 3)  # the GFLOP/s probe (n, c, h, w, k): n x c x h x w in, c -> c channels, k x k


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    from harness.eval_sets import SETS

    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--sample", type=int, default=0,
                        help="at most this many images of each set, evenly spread (0: all)")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes (all models interleaved) after the untimed one")
    parser.add_argument("--threads", type=int, default=1, help="inference threads per predictor")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown here")


# --------------------------------------------------------------------------
# FLOPs


def gflop_figures() -> dict[str, tuple[float, float] | None]:
    """model -> (det GFLOP at 960x960, rec GFLOP per 48x320 crop), from the
    model sets' cost (serve_app.core.model_sets: the issue's counts), None
    where the set has none."""
    from serve_app.core.model_sets import SETS

    return {name: (c.det_gflop_960, c.rec_gflop_crop) if c.det_gflop_960 and c.rec_gflop_crop else None
            for name, c in ((name, s.cost) for name, s in SETS.items())}


def image_gflop(figures: tuple[float, float] | None, det_hw: tuple[int, int], crops_wh: list[tuple[float, float]],
                rec_h: int = 48, rec_w: int = 320) -> float | None:
    """GFLOP of one image: the detector at its input size (convolutions
    scale with the area) plus each crop at its recogniser width (48 high,
    at least 320 wide: the figure scales with the width)."""
    if figures is None:
        return None
    det, rec = figures
    g = det * det_hw[0] * det_hw[1] / (960 * 960)
    for w, h in crops_wh:
        g += rec * max(rec_w, rec_h * w / max(h, 1)) / rec_w
    return g


# --------------------------------------------------------------------------
# the children


def engine_config(model: str, threads: int):
    """The in-process defaults (OpenVINO, bf16 where the CPU has it, the
    process pinned) with `threads` inference threads per predictor; Paddle's
    memory_optim on for ppocrv4_mobile only (the PP-OCRv6 sets' converted PIR
    files fail to build with it on for now)."""
    from serve_app.engine import default_engine_config

    cfg = default_engine_config()
    return cfg.model_copy(update={"predictor": cfg.predictor.model_copy(
        update={"cpu_math_library_num_threads": threads, "enable_memory_optim": model == BASE})})


def measure(model: str, set_names: list[str], sample: int, threads: int) -> dict:
    """In a child: read every set with `model` once; texts, boxes, memory."""
    from harness.eval_sets import build, score_item
    from harness.procfs import rss_mb
    from serve_app.engine import OcrEngine
    from serve_app.flow.pipeline import load_image
    from serve_app.ocr.det_preprocess import det_layout, prepare_image

    sets = {n: sampled(build(n), sample) for n in set_names}
    rss0 = rss_mb()
    t0 = time.perf_counter()
    eng = OcrEngine(engine_config(model, threads), model=model)
    load_s = time.perf_counter() - t0
    rss_loaded = rss_mb()
    cfg = eng.config
    out: dict = {"model": model, "load_s": load_s, "rss_before_mb": rss0, "rss_loaded_mb": rss_loaded,
                 "options": cfg.predictor.model_dump(include={"enable_openvino_engine", "openvino_precision",
                                                             "cpu_math_library_num_threads", "enable_memory_optim"}),
                 "sets": {}}
    try:
        for name, items in sets.items():
            per = []
            for it in items:
                res = eng.read(it.image)
                work, _ = prepare_image(load_image(it.image, cfg.limits, cfg.pipeline.exif_transpose), cfg.pipeline)
                det_hw = det_layout(work.shape[0], work.shape[1], cfg.det)[1]
                lines = [(ln.text, [list(p) for p in ln.box]) for ln in res.lines]
                crops = [(_side(ln.box, 0), _side(ln.box, 1)) for ln in res.lines]
                per.append({"name": it.name, "score": score_item(name, it.truth, it.boxes, lines),
                            "det_hw": det_hw, "crops_wh": crops, "texts": [t for t, _ in lines][:8]})
            out["sets"][name] = {"items": per, "walls": []}  # filled by timed_interleaved
        out["rss_end_mb"] = rss_mb()
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    finally:
        eng.close()
    return out


def timed_interleaved(models: list[str], set_names: list[str], sample: int, repeats: int,
                      threads: int) -> dict[str, dict[str, list[float]]]:
    """In a child: every model's engine loaded, one untimed pass (builds the
    shapes), then `repeats` timed passes, image by image, each image read by
    every model in turn (the order rotated each pass); model -> set -> the
    wall seconds of each read."""
    from harness.eval_sets import build
    from serve_app.engine import OcrEngine

    sets = {n: sampled(build(n), sample) for n in set_names}
    engines = {m: OcrEngine(engine_config(m, threads), model=m) for m in models}
    try:
        for eng in engines.values():
            for items in sets.values():
                for it in items:
                    eng.read(it.image)
        return interleaved_walls(engines, sets, repeats)
    finally:
        for eng in engines.values():
            eng.close()


def interleaved_walls(engines: dict, sets: dict[str, list], repeats: int,
                      reading: Callable[[str], None] = lambda key: None) -> dict[str, dict[str, list[float]]]:
    """`repeats` timed passes, image by image, each image read by every
    engine in turn (the order rotated each pass; `reading(key)` told before
    each read); engine key -> set -> the wall seconds of each read."""
    keys = list(engines)
    walls: dict[str, dict[str, list[float]]] = {k: {n: [] for n in sets} for k in keys}
    for r in range(repeats):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for name, items in sets.items():
            for it in items:
                for k in order:
                    reading(k)
                    t = time.perf_counter()
                    engines[k].read(it.image)
                    walls[k][name].append(time.perf_counter() - t)
    return walls


def _side(box, axis: int) -> float:
    """A quadrilateral's mean width (axis 0) or height (axis 1)."""
    a, b, c, d = box
    return (math.dist(a, b) + math.dist(d, c)) / 2 if axis == 0 else (math.dist(a, d) + math.dist(b, c)) / 2


def sampled(items: list, n: int) -> list:
    """At most n of items, evenly spread (n <= 0: all)."""
    if n <= 0 or len(items) <= n:
        return items
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def conv_gflops(threads: int, runs: int = 20) -> dict:
    """In a child: GFLOP/s of one large convolution (CONV) through Paddle
    Inference with the engine's predictor settings (serve_app's one seam,
    PaddlePredictor): the best this engine does on this CPU."""
    import tempfile

    import numpy as np
    import paddle

    from serve_app.inference.predictor import PaddlePredictor
    from serve_app.inference.weights import ModelFiles

    n, c, h, w, k = CONV
    paddle.enable_static()
    with tempfile.TemporaryDirectory() as tmp:
        main, start = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, start):
            x = paddle.static.data("x", [-1, c, -1, -1], "float32")
            y = paddle.nn.Conv2D(c, c, k, padding=k // 2, bias_attr=False)(x)
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(start)
            paddle.static.save_inference_model(f"{tmp}/inference", [x], [y], exe, program=main)
        paddle.disable_static()
        program = next(p for p in (Path(f"{tmp}/inference.json"), Path(f"{tmp}/inference.pdmodel")) if p.is_file())
        # memory_optim off: Paddle 3.3 cannot build a PIR program (what it saves now) with it on
        opts = engine_config(BASE, threads).predictor.model_copy(update={"cache_dir": None,
                                                                         "enable_memory_optim": False})
        pred = PaddlePredictor(ModelFiles("conv", program, Path(f"{tmp}/inference.pdiparams")), opts, "conv")
        try:
            xin = np.random.default_rng(0).standard_normal((n, c, h, w)).astype("float32")
            for _ in range(3):
                pred.run(xin)
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                pred.run(xin)
                times.append(time.perf_counter() - t)
        finally:
            pred.close()
    gflop = 2 * n * c * c * k * k * h * w / 1e9
    best = sorted(times)[len(times) // 2]
    return {"gflop": gflop, "median_s": best, "gflops": gflop / best, "shape": f"{n}x{c}x{h}x{w}, {k}x{k}, {c}->{c}"}


# --------------------------------------------------------------------------
# the report


def machine() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            info = fh.read()
    except OSError:
        info = ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    bf16 = "avx512_bf16" in info or "amx_bf16" in info
    return (f"{model}, {len(os.sched_getaffinity(0))} cores usable, "
            f"{'bf16 (avx512_bf16/AMX)' if bf16 else 'no native bf16'}")


def summarise(run: dict, figures) -> dict:
    out = {}
    for name, s in run["sets"].items():
        tot = [sum(x["score"][i] for x in s["items"]) for i in range(5)]
        walls = s["walls"]
        g = [image_gflop(figures, tuple(x["det_hw"]), x["crops_wh"]) for x in s["items"]]
        out[name] = {"images": len(s["items"]), "truth": tot[0], "read": tot[1], "exact": tot[2],
                     "cer": tot[3] / max(tot[4], 1),
                     "ips": len(walls) / sum(walls) if walls and sum(walls) > 0 else float("nan"),
                     "gflop": sum(g) / len(g) if g and None not in g else None}
    return out


def render(args, runs: dict[str, dict], conv: dict | None, figures, started: str, wall_s: float,
           loads: str = "") -> str:
    from harness.eval_sets import SETS
    from load_tests.stats import fmt, md_table

    sums = {m: summarise(r, figures.get(m)) for m, r in runs.items()}
    cmd = "python -m load_tests " + " ".join(sys.argv[1:])
    w = [f"# Model tiers: accuracy and speed ({'smoke' if getattr(args, 'smoke', False) else 'one run'})", "",
         f"- `{cmd.strip()}`; started {started} UTC, wall {wall_s:.0f} s", f"- {machine()}"]
    opts = "; ".join(f"{m} {r['options']}" for m, r in runs.items())
    w.append(f"- engine in process, one image at a time, one predictor thread per stage; predictor options: {opts}; "
             f"texts scored from an untimed pass, one child per model; img/s from {args.repeats} timed pass(es) in one "
             f"child with every model loaded, interleaved image by image" + (f"; {loads}" if loads else ""))
    if args.sample:
        w.append(f"- sampled: at most {args.sample} images per set, evenly spread")
    if conv:
        w.append(f"- GFLOP/s probe: one {conv['shape']} convolution, {conv['gflop']:.2f} GFLOP, median "
                 f"{1000 * conv['median_s']:.1f} ms: **{conv['gflops']:.1f} GFLOP/s**")
    w.append("- GFLOP per image: det at its input size (960x960 figure x area) + rec per crop "
             "(48x320 figure x width / 320); figures (det, rec) "
             + ", ".join(f"{m} {f}" for m, f in figures.items() if m in runs) + " (serve_app/core/model_sets.py); cls not counted")
    w.append("")
    w.append("| set | model | images | truth | read | exact | CER | img/s | x v4 | GFLOP/img | floor img/s | of floor |")
    w.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.sets:
        base = sums.get(BASE, {}).get(name)
        for m in runs:
            s = sums[m].get(name)
            if s is None:
                continue
            ratio = s["ips"] / base["ips"] if base and base["ips"] > 0 else float("nan")
            floor = conv["gflops"] / s["gflop"] if conv and s["gflop"] else None
            w.append(f"| {name} ({SETS[name][1]}) | {m} | {s['images']} | {s['truth']} | {s['read']} | "
                     f"{s['exact']} ({100 * s['exact'] / max(s['truth'], 1):.0f}%) | {s['cer']:.3f} | "
                     f"{s['ips']:.2f} | {ratio:.2f} | {fmt(s['gflop'], 2)} | {fmt(floor, 2)} | "
                     f"{'n/a' if floor is None else format(100 * s['ips'] / floor, '.0f') + '%'} |")
    w.append("")
    w += md_table(["model", "load s", "RSS before MB", "after load MB", "end MB", "peak MB", "added MB"], (
        [m, f"{r['load_s']:.1f}", *(f"{r[k]:.0f}" for k in ("rss_before_mb", "rss_loaded_mb", "rss_end_mb", "peak_rss_mb")),
         f"{r['peak_rss_mb'] - r['rss_before_mb']:.0f}"] for m, r in runs.items()))
    return "\n".join(w) + "\n"


def smoke(args: argparse.Namespace) -> int:
    """Two English lines with ppocrv4_mobile, the GFLOP/s probe included:
    that the program runs and reads (seconds; measures nothing)."""
    from load_tests.cli import check

    args.models, args.sets, args.sample, args.repeats = [BASE], ["english"], 2, 1
    runs = run(args)
    check(BASE in runs, f"{BASE} did not run")
    s = summarise(runs[BASE], None)["english"]
    check(s["images"] == 2 and s["read"] == 2 and s["ips"] > 0, f"{BASE} read {s['read']} of 2 English lines")
    return 0


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0


def run(args: argparse.Namespace) -> dict:
    """Read, print the report (and write it to --out); the runs, per model."""
    from harness.in_child import call_in_child

    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    figures = gflop_figures()
    conv = call_in_child(conv_gflops, args.threads)
    runs: dict[str, dict] = {}
    failed: dict[str, str] = {}
    for m in args.models:
        print(f"{m}: reading {', '.join(args.sets)} ...", file=sys.stderr, flush=True)
        try:
            runs[m] = call_in_child(measure, m, args.sets, args.sample, args.threads)
        except Exception as e:  # noqa: BLE001 (one model failing leaves the others' table)
            failed[m] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"{m} failed: {failed[m]}", file=sys.stderr, flush=True)
        if args.out:  # what is measured so far survives a later model's failure
            args.out.write_text(render(args, runs, conv, figures, started, time.perf_counter() - t0))
    if runs and args.repeats > 0:
        print(f"timing {', '.join(runs)} interleaved, {args.repeats} pass(es) ...", file=sys.stderr, flush=True)
        walls = call_in_child(timed_interleaved, list(runs), args.sets, args.sample, args.repeats, args.threads,
                              timeout_s=3600)
        for m, per_set in walls.items():
            for name, w in per_set.items():
                runs[m]["sets"][name]["walls"] = w
    report = render(args, runs, conv, figures, started, time.perf_counter() - t0, load_line(load0))
    report += "".join(f"\n- {m} FAILED: {err}\n" for m, err in failed.items())
    print(report)
    if args.out:
        args.out.write_text(report)
    return runs
