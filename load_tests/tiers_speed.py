"""Per-call speed of each model set's detector and recogniser on the CPU
engine the service builds (Paddle Inference + its OpenVINO engine, one
pinned thread), beside PP-OCRv4 in the same run, with the GFLOP/s each
reaches and the floor: the GFLOP/s of one plain 3x3 convolution on the same
engine (what the CPU gives a dense op here).

    python -m load_tests engine tiers-speed [--repeat 7] [--sets ppocrv4_mobile,ppocrv6_small,ppocrv6_tiny]
    python -m load_tests engine tiers-speed --smoke     # one repeat, 640 px only, v4 + v6 tiny

Inputs: the first peer image resized to 640x640 and 960x960 (det), the
first 8 peer crops resized to 48x320 (rec, 1 and 8 crops). Each set runs at
the OpenVINO precisions asked (`--precisions`; `auto` is the service's:
bf16 where the CPU has it). The models are the files the service loads
(serve_app.inference.weights.set_files), so a v6 set reads whatever `make
models` made: a legacy .pdmodel runs on OpenVINO, a Paddle 3 .json on oneDNN
fp32 (Paddle 3.3.1 ignores enable_openvino_engine for it); the table's
`program` column says which. The floor's convolution is a legacy program
saved by the export env (.venv-export or $OCR_SERVE_EXPORT_PYTHON); without
one the floor row is left out. Medians of --repeat calls after two warm-ups.
Heavy: run it under the shared lock.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# Counted GFLOP (2 x MAC) of each set's models: det at 960x960 (scales with
# the pixels), rec per 48x320 crop (load_tests/model_flops.py counts them
# from the ONNX files; v4's from its ONNX export).
GFLOP = {"ppocrv4_mobile": (10.36, 1.40), "ppocrv6_small": (19.50, 2.18), "ppocrv6_tiny": (5.96, 0.37)}
CONV = (256, 128)  # the floor: 3x3 conv C->C on an HxH map
CONV_SAVE = """import paddle, sys
paddle.disable_static()
m = paddle.nn.Conv2D({c}, {c}, 3, padding=1); m.eval()
spec = [paddle.static.InputSpec(shape=[-1, {c}, -1, -1], dtype="float32", name="x")]
paddle.jit.save(paddle.jit.to_static(m, input_spec=spec), sys.argv[1] + "/inference")
"""


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sets", default="ppocrv4_mobile,ppocrv6_small,ppocrv6_tiny")
    parser.add_argument("--precisions", default="auto,fp32,onednn", help="OpenVINO precisions, comma separated (auto = "
                        "bf16 where the CPU has it, else fp32), or onednn: Paddle's oneDNN kernels, no OpenVINO (what "
                        "the engine does without it: the comparison that shows OpenVINO ran)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--core", type=int, default=None, help="the CPU to pin to (default: the last one)")


def smoke(args: argparse.Namespace) -> int:
    """v4 and v6 tiny, auto precision, 640 px and 1 crop, one repeat (measures nothing)."""
    args.smoke = True
    return main(args)


def _median_ms(run, x, repeat: int) -> float:
    run(x)
    run(x)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _inputs(smoke: bool):
    import cv2

    from serve_app.tools.conversion_check import det_input, peer_crops, peer_images, rec_input

    img = peer_images(1)[0][1]
    sides = (640,) if smoke else (640, 960)
    det = {s: det_input(cv2.resize(img, (s, s)), limit=s) for s in sides}
    crops = np.concatenate([rec_input(cv2.resize(c, (320, 48))) for _, c in peer_crops(8)])
    rec = {1: crops[:1]} if smoke else {1: crops[:1], 8: crops}
    return det, rec


def _floor(options, repeat: int):
    """GFLOP/s of one 3x3 conv (legacy program, so OpenVINO runs it), or None without an export env."""
    from serve_app.inference.predictor import PaddlePredictor
    from serve_app.inference.weights import ModelFiles

    env = os.environ.get("OCR_SERVE_EXPORT_PYTHON")
    python = Path(env) if env else REPO / ".venv-export" / "bin" / "python"
    if not python.is_file():
        return None
    c, h = CONV
    with tempfile.TemporaryDirectory(prefix="conv-floor-") as d:
        subprocess.run([str(python), "-c", CONV_SAVE.format(c=c), d], check=True, capture_output=True)
        p = PaddlePredictor(ModelFiles("conv", Path(d) / "inference.pdmodel", Path(d) / "inference.pdiparams"),
                            options, "conv-floor")
        try:
            x = np.random.default_rng(0).standard_normal((1, c, h, h)).astype(np.float32)
            ms = _median_ms(p.run, x, repeat)
        finally:
            p.close()
    return 2 * c * c * 9 * h * h / (ms / 1e3) / 1e9


def main(args: argparse.Namespace) -> int:
    from serve_app.core.engine_config import PredictorOptions
    from serve_app.inference.predictor import PaddlePredictor, cpu_has_bf16, pin_process
    from serve_app.inference.weights import set_files

    quick = getattr(args, "smoke", False)
    sets = ["ppocrv4_mobile", "ppocrv6_tiny"] if quick else args.sets.split(",")
    precisions = ["auto"] if quick else args.precisions.split(",")
    repeat = 1 if quick else args.repeat
    core = args.core if args.core is not None else (os.cpu_count() or 1) - 1
    pin_process([core])
    det_x, rec_x = _inputs(quick)
    auto = "bf16" if cpu_has_bf16() else "fp32"
    print(f"# tiers_speed: Paddle Inference + OpenVINO engine, 1 thread pinned to CPU {core}; auto = {auto}; "
          f"medians of {repeat} calls; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    cols = [f"det {s}px ms" for s in det_x] + [f"rec {n} ms" for n in rec_x]
    print(f"| set | precision | det program | rec program | {' | '.join(cols)} | det GFLOP/s | rec GFLOP/s | x v4 det | x v4 rec |")
    print("|" + "---|" * (8 + len(cols)))
    base: dict[str, tuple[float, float]] = {}
    for prec in dict.fromkeys(auto if p == "auto" else p for p in precisions):
        opts = PredictorOptions(enable_openvino_engine=prec != "onednn", enable_mkldnn=prec == "onednn",
                                openvino_precision="fp32" if prec == "onednn" else prec,
                                cpu_math_library_num_threads=1, cache_dir=None)
        floor = _floor(opts, repeat)
        for name in sets:
            files = set_files(name)
            row, det_ms, rec_ms = [], {}, {}
            try:
                for stage, stage_files, xs, out in (("det", files.det, det_x, det_ms), ("rec", files.rec, rec_x, rec_ms)):
                    p = PaddlePredictor(stage_files, opts, f"{name}-{stage}")
                    try:
                        for k, x in xs.items():
                            out[k] = _median_ms(p.run, x, repeat)
                    finally:
                        p.close()
            except Exception as e:  # e.g. a converted detector on oneDNN: say so, measure the rest
                print(f"| {name} | {prec} | {files.det.program.name} | {files.rec.program.name} | fails: "
                      f"{' '.join(str(e).split())[:160]} |", flush=True)
                continue
            d_side, r_n = max(det_ms), max(rec_ms)
            det_gf = GFLOP[name][0] * (d_side / 960) ** 2 / (det_ms[d_side] / 1e3)
            rec_gf = GFLOP[name][1] * r_n / (rec_ms[r_n] / 1e3)
            if name == "ppocrv4_mobile":
                base[prec] = (det_ms[d_side], rec_ms[r_n])
            ratio = base.get(prec)
            row = [f"{v:.1f}" for v in det_ms.values()] + [f"{v:.1f}" for v in rec_ms.values()]
            print(f"| {name} | {prec} | {files.det.program.name} | {files.rec.program.name} | {' | '.join(row)} | "
                  f"{det_gf:.0f} | {rec_gf:.0f} | "
                  + (f"{ratio[0] / det_ms[d_side]:.2f} | {ratio[1] / rec_ms[r_n]:.2f} |" if ratio else "- | - |"),
                  flush=True)
        cells = [f"floor: 3x3 conv {CONV[0]}->{CONV[0]} at {CONV[1]}x{CONV[1]}", prec, "", ""] + [""] * len(cols)
        cells += [f"{floor:.0f}", f"{floor:.0f}", "", ""] if floor else ["no export env", "", "", ""]
        print("| " + " | ".join(cells) + " |", flush=True)
    print("x v4: v4's ms / this set's ms at the largest input (det "
          f"{max(det_x)} px, rec {max(rec_x)} crops), same precision; GFLOP/s from the counted FLOPs (GFLOP above).")
    return 0


if __name__ == "__main__":
    from load_tests.cli import standalone

    sys.exit(standalone("load_tests.tiers_speed"))
