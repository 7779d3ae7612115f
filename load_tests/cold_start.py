"""Replica cold start, stage by stage: from a new process to warmed and
ready, without a compiled-engine cache, with a cold one and with a warm
one, in one run.

Each replica is started as a fresh Python process doing what a Serve model
replica does before it is ready (serve_app/serving/deployments.py): import Ray
Serve and the deployments module, build the predictor where
deployments.yaml places replica 0 of the stage (cores, threads), and run
every warm-up call (ModelReplica.warm). The Ray actor's own start (worker
process, actor creation) is not in it: load_tests/scale_up.py measures a
whole autoscaled replica in Ray.

    flock /tmp/ray-tests.lock timeout 600 .venv/bin/python -m load_tests startup cold --repeats 3

Modes: `none` (predictor.cache_dir null: the compiled model goes to a
throwaway folder), `cold` (an empty cache folder: the replica compiles and
publishes), `warm` (the same folder again: the replica loads what was
published). After it is ready each child runs its warm-up calls a second
time: that pass is pure compute, so first pass minus second pass is what
the engine spends preparing each new input shape (OpenVINO's CPU plugin
keeps those kernels in memory only; no disk cache holds them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from load_tests.cli import standalone  # noqa: E402

T_START = time.time()  # first statement of the child's script (after the interpreter started)

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("det", "cls", "rec")
MODES = ("none", "cold", "warm")


def child(stage: str, cache_dir: str | None) -> dict:
    """In the child: a replica's steps, timed; one JSON line out."""
    marks = {"start": T_START}
    import ray  # noqa: F401  (a replica process has Ray and Serve loaded)
    from ray import serve  # noqa: F401

    import serve_app.serving.deployments  # noqa: F401
    import yaml
    marks["imports"] = time.time()
    import paddle.inference  # noqa: F401
    marks["paddle"] = time.time()

    from serve_app.core.engine_config import EngineConfig
    from serve_app.inference.predictor import PaddlePredictor
    from serve_app.serving.replica import ModelReplica, placed_options, replica_cores
    from serve_app.inference.runners import DirectionClassifier, TextDetector, TextRecognizer
    from serve_app.core.app_args import BATCH_DEFAULTS, AppArgs
    from serve_app.ocr.recognition import load_charset
    from serve_app.inference.weights import dictionary_path, model_files

    cfg = yaml.safe_load((ROOT / "deployments.yaml").read_text())
    args = AppArgs.model_validate(cfg["applications"][0]["args"])
    engine: EngineConfig = args.engine
    stage_args = {"det": args.detector, "cls": args.classifier, "rec": args.recognizer}[stage]
    opts = placed_options(stage_args.predictor or engine.predictor, replica_cores(stage_args, 0), None)
    opts = opts.model_copy(update={"cache_dir": cache_dir})
    model_dir = {"det": engine.det_model, "cls": engine.cls_model, "rec": engine.rec_model}[stage]
    predictor = PaddlePredictor(model_files(stage, model_dir), opts, stage)
    marks["loaded"] = time.time()
    replica = ModelReplica(stage, predictor, BATCH_DEFAULTS[stage])
    if stage == "det":
        calls = TextDetector(predictor, engine.det).warm_calls(args.detector.warm_shapes)
    elif stage == "cls":
        calls = DirectionClassifier(predictor, engine.cls).warm_calls()
    else:
        charset = load_charset(dictionary_path(engine.rec_dict), engine.rec.use_space_char)
        rec = TextRecognizer(predictor, engine.rec, charset)
        shapes = rec.warm_shapes(args.recognizer.warm_widths)
        warm = os.environ.get("COLD_START_REC_WARM") or args.recognizer.warm  # --rec-warm, else the config's
        if warm == "core" and engine.rec.batch_padding == "bucket":  # what a replica runs before ready
            from serve_app.serving.shapes_after_ready import core_shapes

            shapes = core_shapes(shapes)[0]
        calls = [rec.warm_call(s) for s in shapes]
        if os.environ.get("COLD_START_REC_BATCH_SIZES"):  # --rec-batch-sizes: a what-if, not what replicas warm
            keep = {int(x) for x in os.environ["COLD_START_REC_BATCH_SIZES"].split(",")}
            widths: dict[int, int] = {}
            for _, arg in calls:
                widths[arg[0].shape[1]] = max(widths.get(arg[0].shape[1], 0), len(arg))
            calls = [(fn, arg) for fn, arg in calls if len(arg) in keep or len(arg) == widths[arg[0].shape[1]]]
    replica.warm(calls)
    marks["ready"] = time.time()
    t0 = time.perf_counter()
    for fn, arg in calls:
        fn(arg)
    compute = time.perf_counter() - t0
    predictor.close()
    return {"stage": stage, "marks": marks, "shapes": len(calls), "cache": predictor.cache,
            "cores": opts.cpu_affinity, "threads": opts.cpu_math_library_num_threads, "repeat_warm_s": compute}


def run_child(stage: str, cache_dir: str | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "load_tests.cold_start", "--child", stage, "--cache-dir", cache_dir or ""]
    t0 = time.time()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise RuntimeError(f"{stage} child failed:\n{out.stderr[-3000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    m = row["marks"]
    row.update(spawn=t0, interpreter_s=m["start"] - t0, imports_s=m["imports"] - m["start"],
               paddle_s=m["paddle"] - m["imports"], load_s=m["loaded"] - m["paddle"],
               warm_s=m["ready"] - m["loaded"], total_s=m["ready"] - t0)
    return row


COLUMNS = ("interpreter_s", "imports_s", "paddle_s", "load_s", "warm_s", "total_s", "repeat_warm_s")


def table(rows: list[dict]) -> str:
    out = ["| stage | cache | runs | process start | Ray/Serve/app imports | paddle import | predictor load "
           "(compile / cache read) | warm-up (first pass) | **start -> ready** | warm-up again (compute only) "
           "| shapes | cores x threads | cache entry |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for stage in STAGES:
        for mode in MODES:
            rs = [r for r in rows if r["stage"] == stage and r["mode"] == mode]
            if not rs:
                continue
            med = {c: statistics.median(r[c] for r in rs) for c in COLUMNS}
            c = rs[-1]["cache"] or {}
            entry = "none" if not c.get("dir") else ("hit" if c.get("hit") else
                                                     "published" if c.get("published") else "built")
            out.append(f"| {stage} | {mode} | {len(rs)} | " + " | ".join(
                (f"**{med[k]:.2f}**" if k == "total_s" else f"{med[k]:.2f}") for k in COLUMNS[:6])
                + f" | {med['repeat_warm_s']:.2f} | {rs[-1]['shapes']} | {rs[-1]['cores']} x {rs[-1]['threads']} "
                f"| {entry} |")
    return "\n".join(out)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--child", choices=STAGES)
    ap.add_argument("--cache-dir", default="")
    ap.add_argument("--repeats", type=int, default=3, help="runs per (stage, mode); medians are printed")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--rec-batch-sizes", help="what-if: the recogniser warms only these batch sizes (and each "
                    "width's largest), e.g. 1,2,4; replicas do not do this")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rec-warm", choices=("full", "core"),
                    help="the recogniser's shapes before ready (recognizer.warm; default: deployments.yaml's)")


def main(args: argparse.Namespace) -> int:
    a = args
    if a.rec_warm:
        os.environ["COLD_START_REC_WARM"] = a.rec_warm
    if a.rec_batch_sizes:
        os.environ["COLD_START_REC_BATCH_SIZES"] = a.rec_batch_sizes
    if a.child:
        print(json.dumps(child(a.child, a.cache_dir or None)))
        return
    rows = []
    started = time.time()
    load0 = os.getloadavg()
    for rep in range(a.repeats):
        for stage in a.stages.split(","):
            root = tempfile.mkdtemp(prefix="ocr-cold-start-")  # a fresh, empty cache per repeat
            try:
                for mode in a.modes.split(","):
                    row = run_child(stage, None if mode == "none" else root)
                    rows.append({**row, "mode": mode, "repeat": rep})
                    print(f"{stage:4s} {mode:5s} run {rep}: start->ready {row['total_s']:.2f}s "
                          f"(load {row['load_s']:.2f}, warm {row['warm_s']:.2f}) cache {row['cache']}", flush=True)
            finally:
                shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {time.time() - started:.0f} s; "
          f"load average at start {tuple(round(x, 2) for x in load0)}, at end "
          f"{tuple(round(x, 2) for x in os.getloadavg())}; one child at a time; seconds, medians of "
          f"{a.repeats} runs per row")
    print()
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(standalone(__name__))
