"""TensorRT int8 calibration tables made ahead of time, into the engine cache:

    python -m serve_app.tools.calibrate_int8 --plan                 # what would be fed (no GPU needed)
    python -m serve_app.tools.calibrate_int8 [--config deployments.gpu.yaml] [--stage rec] [--precision int8]
    python -m serve_app.tools.calibrate_int8 --model ppocrv4_mobile ...   # another catalogued set (default: the first)

A replica does not need this tool: the first replica of an int8 stage on a
node (or on the KubeRay engine-cache volume) calibrates on the packaged real
images before it builds its engines (serve_app/inference/int8_calibration.py). This
runs that same step on one GPU node beforehand, so that no replica start
pays for it: for each stage whose TensorRT precision is int8 (`--precision
int8` sets it for the stages named), it builds the stage's predictor as its
replica would (the app builder's shape set, the keyed entry under
tensorrt.cache_dir), which calibrates when the entry has no table and then
builds and serializes the int8 engines, and prints the table's manifest.
The check against fp32 still runs at every replica start. `--plan` prints,
per stage, the opt shape, the calibration batches and the cache folder's
parent, and builds nothing. Without --plan: **not run** (no GPU here).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
ARGS = {"det": "detector", "cls": "classifier", "rec": "recognizer"}


def stage_plan(app_args, stage: str, precision: Optional[str] = None, engine=None) -> dict:
    """What the stage's replica of the set `engine` (an EngineConfig; None:
    the profile's default set) would calibrate on, or why it calibrates nothing."""
    from serve_app.app import with_shape_ranges
    from serve_app.inference.int8_calibration import stage_inputs
    from serve_app.inference.shape_ranges import range_of
    from serve_app.tools.collect_shapes import set_engine

    engine = engine or set_engine(app_args)
    args = with_shape_ranges(stage, getattr(app_args, ARGS[stage]), engine)
    opts = args.predictor or engine.predictor
    if opts.tensorrt is None:
        return {"stage": stage, "skip": "no tensorrt in this stage's predictor"}
    if precision:
        opts = opts.model_copy(update={"tensorrt": opts.tensorrt.model_copy(update={"precision": precision})})
    if opts.tensorrt.precision != "int8":
        return {"stage": stage, "skip": f"tensorrt.precision {opts.tensorrt.precision}: nothing to calibrate"}
    opt = range_of(opts.tensorrt.input_shapes).opt
    batches = stage_inputs(stage, engine)(opt)
    return {"stage": stage, "opt": list(opt), "batches": len(batches), "inputs": len(batches) * opt[0],
            "cache_dir": opts.tensorrt.cache_dir or opts.cache_dir, "options": opts}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m serve_app.tools.calibrate_int8", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=REPO / "deployments.gpu.yaml")
    p.add_argument("--stage", choices=list(ARGS), action="append", help="stage(s) (default: all)")
    p.add_argument("--precision", choices=["int8"], help="set this precision for the stages named")
    p.add_argument("--plan", action="store_true", help="print what would be fed; build nothing")
    p.add_argument("--model", help="a model set of the profile's `models` (default: its first, the default set)")
    a = p.parse_args(argv)

    from serve_app.tools.collect_shapes import load_args, set_engine

    app_args = load_args(a.config)
    engine = set_engine(app_args, a.model)
    print(f"model set {engine.model}")
    plans = [stage_plan(app_args, s, a.precision, engine) for s in (a.stage or list(ARGS))]
    for plan in plans:
        if "skip" in plan:
            print(f"{plan['stage']}: skipped: {plan['skip']}")
        else:
            print(f"{plan['stage']}: {plan['batches']} batches of {plan['opt']} ({plan['inputs']} inputs from "
                  f"the packaged real images) -> an entry under {plan['cache_dir']}")
    if a.plan:
        return 0
    from serve_app.inference.int8_calibration import stage_inputs
    from serve_app.inference.predictor import PaddlePredictor
    from serve_app.tools.collect_shapes import stage_files

    for plan in plans:
        if "skip" in plan:
            continue
        stage = plan["stage"]
        pred = PaddlePredictor(stage_files(engine, stage), plan["options"], stage,
                               int8_inputs=stage_inputs(stage, engine))
        try:
            print(f"{stage}: {pred.int8_calibration} in {(pred.cache or {}).get('dir')}")
        finally:
            pred.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
