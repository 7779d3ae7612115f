"""Where each model set's time per image goes, stage by stage (pre- and
post-processing, graphs, crops, classifier, the rest of the pipeline),
beside PP-OCRv4 in the same process, read interleaved as `engine tiers`
does: the ratios are the figures to trust on a shared machine.

    python -m load_tests engine tiers-breakdown                        # peer labels + dense pages, 3 passes
    python -m load_tests engine tiers-breakdown --sets peer --sample 20 --repeats 5

The engines are tiers' (`engine_config`: the in-process defaults with
`--threads` inference threads per predictor). `--shapes` adds each graph's
ms per input shape. Stage times are wall times of the functions the
pipeline calls (wrapped for the run); `pipeline rest` is what runs between
them (the event loop, thread hand-offs, assembling lines)."""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
from typing import Callable

from harness.procfs import load_line
from load_tests.stats import md_table

BASE = "ppocrv4_mobile"
# (label, module, function name): the pure stages the pipeline calls, wrapped to time them.
STAGES = (
    ("prepare image", "serve_app.flow.pipeline", "prepare_image"),
    ("det preprocess", "serve_app.inference.runners", "det_preprocess"),
    ("det postprocess", "serve_app.inference.runners", "db_boxes"),
    ("crops", "serve_app.flow.pipeline", "crop_lines"),
    ("cls preprocess", "serve_app.inference.runners", "cls_preprocess"),
    ("rec preprocess", "serve_app.inference.runners", "rec_preprocess"),
    ("rec CTC decode", "serve_app.inference.runners", "ctc_decode"),
)
ORDER = ("prepare image", "det preprocess", "det graph", "det postprocess", "crops", "cls preprocess", "cls graph",
         "rec preprocess", "rec graph", "rec CTC decode", "pipeline rest")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    from harness.eval_sets import SETS as EVAL_SETS
    from serve_app.core.model_sets import SETS

    parser.add_argument("--models", default=",".join(SETS), help="model sets, comma separated (the first one "
                        f"listed is not special: ratios are against {BASE}, which is always run)")
    parser.add_argument("--sets", nargs="+", default=["peer", "chinese"], choices=list(EVAL_SETS),
                        help="evaluation sets (harness/eval_sets.py) whose images are read")
    parser.add_argument("--sample", type=int, default=20, help="at most this many images of each set (0: all)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes after one untimed pass")
    parser.add_argument("--threads", type=int, default=1, help="inference threads per predictor")
    parser.add_argument("--shapes", action="store_true", help="also each graph's ms per input shape")


def smoke(args: argparse.Namespace) -> int:
    """v4 and v6 tiny on two English lines, one pass (measures nothing):
    every stage of both sets was timed and both read the two lines."""
    from load_tests.cli import check

    args.models, args.sets, args.sample, args.repeats, args.shapes = f"{BASE},ppocrv6_tiny", ["english"], 2, 1, True
    models, clock, wall, lines = report(args)
    for m in models:
        check(lines[m] == 2, f"{m} read {lines[m]} lines of 2 English line images")
        for stage in ("det preprocess", "det graph", "det postprocess", "crops", "rec graph", "rec CTC decode"):
            check(clock.ms[(m, stage)] > 0, f"{m}: no time recorded for {stage!r}")
    return 0


class Clock:
    """Wall time per (set, stage) and per (set, graph, input shape), for
    the set being read now (one image at a time, so one set at a time)."""

    def __init__(self) -> None:
        self.current = ""
        self.on = False
        self.ms: dict[tuple[str, str], float] = collections.defaultdict(float)
        self.calls: dict[tuple[str, str, tuple], list[float]] = collections.defaultdict(list)

    def wrap(self, label: str, fn: Callable, by_shape: bool = False) -> Callable:
        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                if self.on:
                    ms = (time.perf_counter() - t) * 1e3
                    self.ms[(self.current, label)] += ms
                    if by_shape:
                        self.calls[(self.current, label, tuple(a[0].shape))].append(ms)
        return timed


def instrument(clock: Clock, engines: dict) -> Callable[[], None]:
    """Wrap the stage functions and each engine's predictors; returns the undo."""
    import importlib

    undo = []
    for label, module_name, fn_name in STAGES:
        module = importlib.import_module(module_name)
        orig = getattr(module, fn_name)
        setattr(module, fn_name, clock.wrap(label, orig))
        undo.append((module, fn_name, orig))
    for eng in engines.values():
        for stage in ("detector", "classifier", "recognizer"):
            runner = getattr(eng, stage)
            if runner is not None:
                p = runner.predictor
                p.run = clock.wrap(f"{stage[:3].replace('cla', 'cls')} graph", p.run, by_shape=True)

    def restore() -> None:
        for module, fn_name, orig in undo:
            setattr(module, fn_name, orig)
    return restore


def measure(models: list[str], set_names: list[str], sample: int, repeats: int,
            threads: int) -> tuple[Clock, dict, dict, int]:
    """Load every set's engine, read the images once untimed, then `repeats`
    timed passes interleaved (tiers' loop); (clock, wall ms per set, lines
    per set, images)."""
    from harness.eval_sets import build
    from load_tests.tiers import engine_config, interleaved_walls, sampled
    from serve_app.engine import OcrEngine

    sets = {n: sampled(build(n), sample) for n in set_names}
    imgs = [it.image for items in sets.values() for it in items]
    engines = {m: OcrEngine(engine_config(m, threads), model=m) for m in models}
    clock = Clock()
    restore = instrument(clock, engines)
    try:
        lines = {m: sum(len(eng.read(img).lines) for img in imgs) for m, eng in engines.items()}  # untimed
        clock.on = True
        walls = interleaved_walls(engines, sets, repeats, reading=lambda m: setattr(clock, "current", m))
    finally:
        restore()
        for eng in engines.values():
            eng.close()
    wall = {m: 1e3 * sum(sum(w) for w in per_set.values()) for m, per_set in walls.items()}
    return clock, wall, lines, len(imgs)


def render(models: list[str], clock: Clock, wall: dict, lines: dict, n_reads: int, shapes: bool) -> str:
    per = {m: {s: clock.ms[(m, s)] / n_reads for s in ORDER if s != "pipeline rest"} for m in models}
    for m in models:
        per[m]["pipeline rest"] = wall[m] / n_reads - sum(per[m].values())
    ratios = [m for m in models if m != BASE]
    graphs = ("det graph", "cls graph", "rec graph")

    def row(label: str, vals: dict[str, float]) -> list[str]:
        return [label, *(f"{vals[m]:.1f}" for m in models),
                *(f"{vals[BASE] / vals[m]:.2f}" if vals[m] > 0.05 else "-" for m in ratios)]

    out = md_table(["stage (ms per image)", *(f"{m} ms" for m in models), *(f"{m} x v4" for m in ratios)], [
        *(row(s, {m: per[m][s] for m in models}) for s in ORDER),
        row("**graphs**", {m: sum(per[m][g] for g in graphs) for m in models}),
        row("**outside the graphs**", {m: wall[m] / n_reads - sum(per[m][g] for g in graphs) for m in models}),
        row("**total**", {m: wall[m] / n_reads for m in models}),
        ["lines per pass", *(lines[m] for m in models), *([""] * len(ratios))]])
    if shapes:
        out += ["", *md_table(["set", "graph", "input shape", "calls", "median ms"], (
            [m, label, "x".join(map(str, shape)), len(ms), f"{statistics.median(ms):.2f}"]
            for (m, label, shape), ms in sorted(clock.calls.items(), key=lambda kv: (kv[0][0], kv[0][1], -len(kv[1])))),
            "lllrr")]
    return "\n".join(out)


def main(args: argparse.Namespace) -> int:
    report(args)
    return 0


def report(args: argparse.Namespace) -> tuple[list[str], Clock, dict, dict]:
    """Measure, print the table; what was measured."""
    from load_tests.tiers import machine

    models = list(dict.fromkeys([BASE, *args.models.split(",")]))
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    clock, wall, lines, n_images = measure(models, args.sets, args.sample, args.repeats, args.threads)
    print(f"# tiers-breakdown: {n_images} images ({', '.join(args.sets)}), {args.repeats} timed passes, sets "
          f"interleaved in one process; {args.threads} inference thread(s) per predictor; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine()}; {load_line(load0)}; "
          f"{time.perf_counter() - t0:.0f} s")
    print(render(models, clock, wall, lines, n_images * args.repeats, args.shapes))
    return models, clock, wall, lines
