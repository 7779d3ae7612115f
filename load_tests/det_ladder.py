"""A model set read with another detector ladder (`engine.det.side_ladder`)
beside the set as served and PP-OCRv4, in one process: lines read exactly,
CER and images per second on the evaluation sets, interleaved.

    python -m load_tests engine ladder                                   # v6 tiny capped at 960 px
    python -m load_tests engine ladder --variants ppocrv4_mobile ppocrv6_small ppocrv6_small:640-960
    python -m load_tests engine ladder --smoke                           # two peer images, one pass

A variant is `SET` (as served) or `SET:R1-R2-...` (that set with the
ladder's rungs, long side in pixels, replaced); every variant is an
`OcrEngine` of the in-process defaults (Paddle's OpenVINO engine at
`auto`, one inference thread per predictor, the process pinned). The
texts are scored from one untimed pass; img/s from `--repeats` passes with
the variants interleaved image by image (the order rotated each pass), so
load from other work falls on every variant alike. `x first`: img/s over
the first variant's on the same set.
"""

from __future__ import annotations

import argparse
import time


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    from harness.eval_sets import SETS as EVAL_SETS

    parser.add_argument("--variants", nargs="+", default=["ppocrv4_mobile", "ppocrv6_tiny", "ppocrv6_tiny:640-960"],
                        help="SET or SET:R1-R2-... (the detector's ladder rungs)")
    parser.add_argument("--sets", nargs="+", default=["peer", "chinese", "latin", "english"],
                        choices=list(EVAL_SETS), help="evaluation sets (harness/eval_sets.py)")
    parser.add_argument("--sample", type=int, default=40, help="at most this many images of each set (0: all)")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes after the untimed, scored one")


def engine_for(variant: str):
    from load_tests.tiers import engine_config
    from serve_app.core.engine_config import EngineConfig
    from serve_app.engine import OcrEngine

    model, _, rungs = variant.partition(":")
    data = engine_config(model, 1).model_dump(exclude_unset=True)
    data["model"] = model
    data.pop("det", None)  # the set's own det values, as served
    if rungs:
        data["det"] = {"side_ladder": [int(r) for r in rungs.split("-")]}
    cfg = EngineConfig.model_validate(data)
    return OcrEngine(cfg, model=model)


def measure(args: argparse.Namespace) -> dict:
    from harness.eval_sets import build, score_item
    from load_tests.tiers import _sampled, interleaved_walls

    sets = {n: _sampled(build(n), args.sample) for n in args.sets}
    engines = {v: engine_for(v) for v in args.variants}
    res: dict = {}
    try:
        for v, eng in engines.items():
            for n, items in sets.items():
                tot = [0] * 5
                for it in items:
                    lines = [(ln.text, [list(p) for p in ln.box]) for ln in eng.read(it.image).lines]
                    tot = [a + b for a, b in zip(tot, score_item(n, it.truth, it.boxes, lines))]
                res[(v, n)] = {"images": len(items), "truth": tot[0], "exact": tot[2],
                               "cer": tot[3] / max(tot[4], 1)}
        for v, per_set in interleaved_walls(engines, sets, args.repeats).items():
            for n, walls in per_set.items():
                res[(v, n)]["walls"] = walls
    finally:
        for eng in engines.values():
            eng.close()
    return res


def render(res: dict, args: argparse.Namespace, started: str, wall_s: float) -> str:
    from load_tests.tiers import machine

    out = [f"Run {started} UTC, {wall_s:.0f} s; {machine()}; {args.repeats} timed pass(es)", "",
           "| set | variant | images | truth | exact | CER | img/s | x first |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for n in args.sets:
        first = None
        for v in args.variants:
            r = res[(v, n)]
            ips = len(r["walls"]) / sum(r["walls"]) if r["walls"] and sum(r["walls"]) > 0 else float("nan")
            first = first or ips
            out.append(f"| {n} | {v} | {r['images']} | {r['truth']} | {r['exact']} | {r['cer']:.4f} | {ips:.2f} | "
                       f"{ips / first:.2f} |")
    return "\n".join(out)


def main(args: argparse.Namespace) -> int:
    started, t0 = time.strftime("%Y-%m-%d %H:%M", time.gmtime()), time.time()
    res = measure(args)
    print(render(res, args, started, time.time() - t0))
    return 0


def smoke(args: argparse.Namespace) -> int:
    """v6 tiny as served and capped at 640 px on two English lines, one pass
    (measures nothing): both variants read and were timed."""
    from load_tests.cli import check

    args.variants, args.sets, args.sample, args.repeats = ["ppocrv6_tiny", "ppocrv6_tiny:640"], ["english"], 2, 1
    res = measure(args)
    print(render(res, args, time.strftime("%Y-%m-%d %H:%M", time.gmtime()), 0))
    for v in args.variants:
        r = res[(v, "english")]
        check(r["truth"] == 2 and len(r["walls"]) == 2, f"{v}: scored {r['truth']} lines, timed {len(r['walls'])}")
        check(r["exact"] >= 1, f"{v} read {r['exact']} of 2 plain English lines exactly")
    return 0
