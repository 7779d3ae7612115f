"""TensorRT dynamic-shape ranges of a Serve profile's stages:

    python -m serve_app.tools.collect_shapes                       # print min/opt/max per stage
    python -m serve_app.tools.collect_shapes --out DIR [--stage rec]   # also collect tuned files
    python -m serve_app.tools.collect_shapes --model ppocrv4_mobile    # another catalogued set (default: the first)

Every input a stage can be given comes from a closed set (the detector's
ladder shapes x batch 1..det.batch_size, the classifier's crop x batch sizes,
the recogniser's width ladder x batch limits; serve_app/inference/shape_ranges.py), so
the ranges are known before serving and need no GPU to print. The replicas
do not need this tool: the app builder hands each TensorRT stage its shape
set and the first replica on a node collects the full tensor ranges itself
(serve_app/inference/predictor.py). `--out` runs that same collection here (without
TensorRT, on the GPU if paddle sees one, else on the CPU: the tensor shapes
are the same), e.g. to bake files into an image and point
`tensorrt.shape_range_info_path` at them."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def load_args(config: Path):
    from serve_app.core.app_args import AppArgs

    cfg = yaml.safe_load(config.read_text())
    return AppArgs.model_validate(cfg["applications"][0].get("args") or {})


def set_engine(a, name=None):
    """The engine config the app builder gives the replicas of the profile's
    set `name` (None: its default, the first of `models`): that set's files,
    pre-processing (hence shape set) and predictor options."""
    engines = a.engines()
    name = name or a.models[0]
    if name not in engines:
        raise SystemExit(f"--model {name}: the profile serves {', '.join(engines)}")
    return engines[name]


def stage_files(engine, stage: str):
    """The stage's model files for that set, as its replica resolves them."""
    from serve_app.inference.weights import model_files

    return model_files(stage, getattr(engine, f"{stage}_model"), engine.model)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m serve_app.tools.collect_shapes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=REPO / "deployments.gpu.yaml")
    p.add_argument("--stage", choices=["det", "cls", "rec"], action="append",
                   help="stage(s) to report (default: all)")
    p.add_argument("--out", type=Path, help="directory to write tuned shape-range files into")
    p.add_argument("--model", help="a model set of the profile's `models` (default: its first, the default set)")
    args = p.parse_args(argv)

    from serve_app.inference.shape_ranges import describe, stage_shapes

    engine = set_engine(load_args(args.config), args.model)
    stages = args.stage or ["det", "cls", "rec"]
    shapes = {s: stage_shapes(s, engine.det, engine.cls, engine.rec) for s in stages}
    for s in stages:
        print(f"{engine.model} {describe(s, shapes[s])}")
    if not args.out:
        return 0

    from serve_app.core.engine_config import PredictorOptions
    from serve_app.inference.predictor import collect_shape_ranges, gpu_available
    device = "gpu" if gpu_available() else "cpu"
    os.makedirs(args.out, exist_ok=True)
    options = PredictorOptions(device=device, enable_mkldnn=False,
                               enable_memory_optim=engine.predictor.enable_memory_optim)  # the set's own need
    for s in stages:
        out = args.out / f"{s}_shape_range.pbtxt"
        collect_shape_ranges(stage_files(engine, s), options, shapes[s], str(out))
        print(f"wrote {out} ({device}, {len(shapes[s])} shapes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
