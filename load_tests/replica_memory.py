"""Where a model replica's memory goes: PSS (smaps_rollup) of a fresh
process doing a replica's steps, step by step, for the recogniser's shape
sets, thread counts and allocator settings, side by side in one run.

Each row is a new Python process (as a Serve replica is) that records its
PSS after: the interpreter; importing Ray, Serve and serve_app's
deployments (a Ray worker's Python floor, without the core worker's
threads); importing paddle.inference; building the predictor (weights,
compiled model); running every warm-up call of its closed shape set (the
kernels OpenVINO compiles per input shape); then reading a fixed set of
crops from the peer images (what service adds). The Ray actor's own
process start is not in it (load_tests/footprint.py measures whole
services).

    flock -w 1200 /tmp/ray-tests.lock timeout 900 .venv/bin/python -m load_tests memory replica
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from load_tests.cli import standalone  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# name -> (stage, threads, env, rec option overrides)
VARIANTS: dict[str, tuple[str, int, dict, dict]] = {
    "rec": ("rec", 1, {}, {}),
    "rec arena2": ("rec", 1, {"MALLOC_ARENA_MAX": "2"}, {}),
    "rec 2 threads": ("rec", 2, {}, {}),
    "rec batch<=4": ("rec", 1, {}, {"batch_size": 4}),
    "rec coarse ladder": ("rec", 1, {}, {"width_ladder": [320, 448, 640, 896, 1280, 1792, 2560, 3200]}),
    "det": ("det", 2, {}, {}),
    "det arena2": ("det", 2, {"MALLOC_ARENA_MAX": "2"}, {}),
    "cls": ("cls", 1, {}, {}),
}


def _pss() -> float:
    from harness.procfs import pss_mb

    m = pss_mb()
    return round(m["pss"], 1) if m else float("nan")


def child(stage: str, threads: int, rec_update: dict) -> dict:
    marks = {"python": _pss()}
    import ray  # noqa: F401
    from ray import serve  # noqa: F401

    import serve_app.serving.deployments  # noqa: F401
    marks["ray+serve+app"] = _pss()
    import paddle.inference  # noqa: F401
    marks["paddle"] = _pss()
    import numpy as np

    from serve_app.core.engine_config import RecOptions
    from serve_app.inference.predictor import PaddlePredictor
    from serve_app.inference.runners import DirectionClassifier, TextDetector, TextRecognizer
    from serve_app.core.app_args import AppArgs
    from serve_app.ocr.recognition import load_charset
    from serve_app.inference.weights import dictionary_path, model_files
    import yaml

    cfg = yaml.safe_load((ROOT / "deployments.yaml").read_text())
    args = AppArgs.model_validate(cfg["applications"][0]["args"])
    engine = args.engine
    cores = list(range(threads))
    opts = engine.predictor.model_copy(update={"cpu_affinity": cores, "cpu_math_library_num_threads": threads,
                                               "cache_dir": None})
    model_dir = {"det": engine.det_model, "cls": engine.cls_model, "rec": engine.rec_model}[stage]
    t0 = time.perf_counter()
    predictor = PaddlePredictor(model_files(stage, model_dir), opts, stage)
    marks["loaded"] = _pss()
    if stage == "det":
        runner = TextDetector(predictor, engine.det)
        calls = runner.warm_calls(args.detector.warm_shapes)
    elif stage == "cls":
        runner = DirectionClassifier(predictor, engine.cls)
        calls = runner.warm_calls()
    else:
        rec = RecOptions.model_validate({**engine.rec.model_dump(), **rec_update})
        runner = TextRecognizer(predictor, rec, load_charset(dictionary_path(engine.rec_dict),
                                                             rec.use_space_char))
        calls = runner.warm_calls(args.recognizer.warm_widths)
    t1 = time.perf_counter()
    for fn, arg in calls:
        fn(arg)
    warm_s = time.perf_counter() - t1
    marks["warmed"] = _pss()
    # what service adds: random crops of many widths (rec), images (det)
    rng = np.random.default_rng(5)
    if stage == "rec":
        for _ in range(60):
            crops = [rng.integers(0, 255, (int(rng.integers(20, 60)), int(rng.integers(10, 3000)), 3), np.uint8)
                     for _ in range(int(rng.integers(1, 13)))]
            runner.recognize(crops)
    elif stage == "det":
        for _ in range(30):
            h, w = int(rng.integers(100, 2000)), int(rng.integers(100, 2000))
            runner.detect([rng.integers(0, 255, (h, w, 3), np.uint8)])
    else:
        for _ in range(30):
            runner.classify([np.full((48, int(rng.integers(20, 800)), 3), 200, np.uint8)] * int(rng.integers(1, 20)))
    marks["in service"] = _pss()
    return {"marks": marks, "shapes": len(calls), "load_s": t1 - t0, "warm_s": warm_s}


def run_child(name: str) -> dict:
    stage, threads, env, rec_update = VARIANTS[name]
    cmd = [sys.executable, "-m", "load_tests.replica_memory", "--child", stage, "--threads", str(threads),
           "--rec", json.dumps(rec_update)]
    out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", **env},
                         capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    if out.returncode != 0:
        raise RuntimeError(f"{name} child failed:\n{out.stderr[-3000:]}")
    return {"variant": name, **json.loads(out.stdout.strip().splitlines()[-1])}


STEPS = ("python", "ray+serve+app", "paddle", "loaded", "warmed", "in service")


def table(rows: list[dict]) -> str:
    out = ["| variant | shapes | " + " | ".join(f"{s} MB" for s in STEPS) + " | warm-up s |",
           "|---|---:|" + "---:|" * len(STEPS) + "---:|"]
    for r in rows:
        out.append(f"| {r['variant']} (run {r['repeat']}) | {r['shapes']} | "
                   + " | ".join(f"{r['marks'][s]:.0f}" for s in STEPS) + f" | {r['warm_s']:.1f} |")
    return "\n".join(out)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--child", choices=("det", "cls", "rec"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rec", default="{}")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--repeats", type=int, default=1, help="rounds, variants interleaved in each")
    ap.add_argument("--json")


def main(args: argparse.Namespace) -> int:
    a = args
    if a.child:
        print(json.dumps(child(a.child, a.threads, json.loads(a.rec))))
        return
    names = [v.strip() for v in a.variants.split(",")]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    rows = []
    started = time.time()
    for rep in range(a.repeats):
        for name in names:
            row = {**run_child(name), "repeat": rep}
            rows.append(row)
            print(f"{name}: {row['marks']} shapes {row['shapes']} warm {row['warm_s']:.1f}s", flush=True)
    print(f"\nRun {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {time.time() - started:.0f} s, "
          f"load average {tuple(round(x, 2) for x in os.getloadavg())}; PSS of the process after each step\n")
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(standalone(__name__))
