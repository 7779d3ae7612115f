"""int8 on the CPU, a candidate measured: a model set's recogniser
quantized by Paddle's own post-training quantization and run by Paddle's
OpenVINO engine, against the same recogniser as served (fp32, bf16), for
speed and for what it reads. Not a serving option: what it shows decides
whether one can be.

    python -m load_tests engine int8                                 # ppocrv6_small's recogniser
    python -m load_tests engine int8 --set ppocrv6_tiny --sample 40
    python -m load_tests engine int8 --smoke                         # v6 tiny, one calibration batch (seconds)

Steps, all in this run:

1. Quantize (in a child process: Paddle's static API on the legacy
   program): `paddle.static.quantization.PostTrainingQuantization` on the
   set's converted program, calibrated on the project's real crops
   (serve_app/inference/calibration, through
   serve_app.inference.int8_calibration.stage_inputs) at one input shape,
   `--ops` quantized, per-channel weights, QDQ ops (`onnx_format`). Paddle
   3.3 writes per-tensor scales as 0-D tensors, which OpenVINO 2025.0's
   Paddle frontend refuses ("dims of scale should not be greater than 2");
   they are rewritten as shape [1] in the parameter file (`scalars_as_1d`).
2. Per call, on the calibration crops at batch 1 and `--batch`, at each
   of `--widths`: each variant's ms (median of `--repeats`, variants
   interleaved) and its agreement with Paddle's own fp32 kernels (no
   OpenVINO) on the output steps where those read a character (the argmax
   is not the CTC blank; most steps are blanks): the original program
   under OpenVINO fp32 and bf16, and the int8 program under Paddle's
   kernels (its quantization simulated: what the quantization itself
   changes) and under OpenVINO (int8 kernels).
3. What users read: the in-process engine with the set as served and with
   the int8 recogniser (the rest of the set unchanged) under OpenVINO, on
   `--eval` sets of harness/eval_sets.py: exact lines, CER and img/s; on
   `--paddle-kernels-sets` also with the int8 recogniser on Paddle's own
   kernels (every stage there: its img/s is not comparable).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from load_tests.cli import check, standalone  # noqa: E402


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", default="ppocrv6_small", help="a built-in model set whose recogniser is quantized")
    p.add_argument("--ops", default="conv2d,depthwise_conv2d,matmul_v2", help="Paddle op types quantized")
    p.add_argument("--algo", default="avg", help="PostTrainingQuantization's activation algorithm")
    p.add_argument("--batch", type=int, default=8, help="the calibration batch size (and the larger timed shape)")
    p.add_argument("--width", type=int, default=320, help="the recogniser input width calibrated at")
    p.add_argument("--widths", default="320,960", help="input widths timed and compared (comma separated)")
    p.add_argument("--calibration-batches", type=int, default=0, help="at most this many (0: all)")
    p.add_argument("--repeats", type=int, default=15, help="timed calls per variant and shape")
    p.add_argument("--eval", nargs="*", default=["latin", "english", "peer"], help="harness/eval_sets.py sets")
    p.add_argument("--sample", type=int, default=20, help="images per eval set (0: all)")
    p.add_argument("--paddle-kernels-sets", default="latin,english",
                   help="eval sets also read with the int8 recogniser on Paddle's own kernels (its quantization "
                   "simulated; every stage then runs there, and its memory grows: 18 GB with v6 small on the two line sets, past "
                   "19 GB with the peer photos too)")
    p.add_argument("--quantize-child", nargs=2, metavar=("SRC", "OUT"), help=argparse.SUPPRESS)


# --- step 1: quantize ---------------------------------------------------------------------


def quantize_child(src: str, out: str, args: argparse.Namespace) -> None:
    """In a child with FLAGS_enable_pir_api=0: the legacy program quantized into `out`."""
    import numpy as np
    import paddle
    from paddle.static.quantization import PostTrainingQuantization

    from serve_app.core.engine_config import for_model
    from serve_app.engine import default_engine_config
    from serve_app.inference.int8_calibration import stage_inputs

    paddle.enable_static()
    batches = calibration(stage_inputs, for_model(default_engine_config(), args.set), args)
    exe = paddle.static.Executor(paddle.CPUPlace())
    _, feeds, _ = paddle.static.load_inference_model(src, exe, model_filename="inference.pdmodel",
                                                     params_filename="inference.pdiparams")

    def loader():
        for b in batches:
            yield {feeds[0]: b.astype(np.float32)}

    ptq = PostTrainingQuantization(executor=exe, model_dir=src, model_filename="inference.pdmodel",
                                   params_filename="inference.pdiparams", data_loader=loader,
                                   batch_nums=len(batches), algo=args.algo, onnx_format=True,
                                   quantizable_op_type=args.ops.split(","))
    ptq.quantize()
    ptq.save_quantized_model(out, model_filename="inference.pdmodel", params_filename="inference.pdiparams")
    print(json.dumps({"calibration_batches": len(batches), "scalars_rewritten": scalars_as_1d(Path(out))}))


def calibration(stage_inputs, engine, args: argparse.Namespace) -> list:
    batches = stage_inputs("rec", engine)((args.batch, 3, engine.rec.image_height, args.width))
    return batches[:args.calibration_batches] if args.calibration_batches else batches


def scalars_as_1d(folder: Path) -> int:
    """Every 0-D tensor of the combined parameter file rewritten as shape
    [1] (the same bytes: one element); how many. The format: per tensor a
    uint32 version, uint64 LoD level and its levels, a uint32 tensor
    version, an int32-sized TensorDesc, then the raw data."""
    from paddle.base.proto import framework_pb2 as fp

    sizes = {fp.VarType.FP32: 4, fp.VarType.INT32: 4, fp.VarType.INT64: 8, fp.VarType.FP64: 8, fp.VarType.INT8: 1,
             fp.VarType.UINT8: 1, fp.VarType.FP16: 2, fp.VarType.BF16: 2, fp.VarType.BOOL: 1}
    path = folder / "inference.pdiparams"
    buf, out, i, changed = path.read_bytes(), bytearray(), 0, 0
    while i < len(buf):
        head = buf[i:i + 12]
        (levels,) = struct.unpack_from("<Q", buf, i + 4)
        i += 12
        for _ in range(levels):
            (n,) = struct.unpack_from("<Q", buf, i)
            head += buf[i:i + 8 + n]
            i += 8 + n
        tver = buf[i:i + 4]
        (dsz,) = struct.unpack_from("<i", buf, i + 4)
        desc = fp.VarType.TensorDesc()
        desc.ParseFromString(buf[i + 8:i + 8 + dsz])
        i += 8 + dsz
        numel = 1
        for d in desc.dims:
            numel *= d
        data = buf[i:i + numel * sizes[desc.data_type]]
        i += len(data)
        if not desc.dims:
            desc.dims.append(1)
            changed += 1
        raw = desc.SerializeToString()
        out += head + tver + struct.pack("<i", len(raw)) + raw + data
    path.write_bytes(bytes(out))
    return changed


def quantize(src: str, out: str, args: argparse.Namespace) -> dict:
    argv = [sys.executable, "-m", "load_tests.int8_probe", "--quantize-child", src, out, "--set", args.set,
            "--ops", args.ops, "--algo", args.algo, "--batch", str(args.batch), "--width", str(args.width),
            "--calibration-batches", str(args.calibration_batches)]
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "FLAGS_enable_pir_api": "0"},
                          timeout=1800)
    if proc.returncode:
        raise SystemExit(f"quantization failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "seconds": time.perf_counter() - t}


# --- step 2: per call ---------------------------------------------------------------------


def predictor(folder: str, precision: str, model: str):
    """Paddle Inference on one thread, configured as the service configures
    it (serve_app.inference.predictor.build_paddle_config): "paddle" =
    Paddle's own CPU kernels, else OpenVINO at that precision."""
    from paddle import inference

    from serve_app.core.engine_config import PredictorOptions
    from serve_app.inference.predictor import build_paddle_config
    from serve_app.inference.weights import model_files

    opts = PredictorOptions(cpu_math_library_num_threads=1, enable_memory_optim=False,
                            enable_openvino_engine=precision != "paddle", enable_mkldnn=False,
                            openvino_precision="fp32" if precision == "paddle" else precision)
    return inference.create_predictor(build_paddle_config(model_files("rec", folder, model), opts))


def call(p, x):
    h = p.get_input_handle(p.get_input_names()[0])
    h.reshape(x.shape)
    h.copy_from_cpu(x)
    p.run()
    return p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()


def per_call(src: str, q: str, args: argparse.Namespace) -> list[dict]:
    import numpy as np

    from serve_app.core.engine_config import for_model
    from serve_app.engine import default_engine_config
    from serve_app.inference.int8_calibration import stage_inputs
    from serve_app.inference.predictor import cpu_has_bf16

    engine = for_model(default_engine_config(), args.set)
    variants = [("fp32, Paddle's kernels (reference)", src, "paddle"), ("fp32, OpenVINO", src, "fp32")]
    if cpu_has_bf16():
        variants.append(("bf16, OpenVINO", src, "bf16"))
    variants += [("int8 program, Paddle's kernels", q, "paddle"), ("int8 program, OpenVINO", q, "fp32")]
    preds = [predictor(d, prec, args.set) for _, d, prec in variants]
    rows = []
    crops = {w: stage_inputs("rec", engine)((args.batch, 3, engine.rec.image_height, w))  # read once per width
             for w in map(int, args.widths.split(","))}
    for n, width in [(n, w) for w in crops for n in sorted({1, args.batch})]:
        full = crops[width]
        items = [b[k:k + 1] for b in full for k in range(len(b))] if n == 1 else full
        items = items[:max(1, 48 // n)]
        outs = [[call(p, x).argmax(-1) for x in items] for p in preds]
        ms: list[list[float]] = [[] for _ in preds]
        for r in range(args.repeats):
            for k in list(range(len(preds)))[r % len(preds):] + list(range(len(preds)))[:r % len(preds)]:
                t = time.perf_counter()
                call(preds[k], items[0])
                ms[k].append((time.perf_counter() - t) * 1000)
        ref_ms = float(np.median(ms[1]))
        for (label, _, _), o, m in zip(variants, outs, ms):
            # on the steps where the reference reads a character (most steps are CTC blanks, index 0)
            agree = float(np.mean([np.mean(a[b != 0] == b[b != 0]) for a, b in zip(o, outs[0]) if (b != 0).any()]))
            rows.append({"shape": f"{n}x3x{engine.rec.image_height}x{width}", "variant": label,
                         "ms": float(np.median(m)), "x_ov_fp32": ref_ms / float(np.median(m)), "agree": agree,
                         "inputs": len(items)})
    return rows


# --- step 3: what users read ---------------------------------------------------------------


def reading(q: str, args: argparse.Namespace) -> list[dict]:
    from harness.eval_sets import build, score_item
    from load_tests.tiers import _sampled
    from serve_app.core.engine_config import for_model
    from serve_app.engine import OcrEngine, default_engine_config

    base = for_model(default_engine_config(), args.set)
    int8 = base.model_copy(update={"rec_model": q})
    paddle_kernels = int8.model_copy(update={"predictor": int8.predictor.model_copy(
        update={"enable_openvino_engine": False, "enable_mkldnn": False})})
    engines = {"as served": OcrEngine(base), "int8, OpenVINO": OcrEngine(int8),
               "int8, Paddle's kernels": OcrEngine(paddle_kernels)}
    rows = []
    try:
        for name in args.eval:
            items = _sampled(build(name), args.sample)
            for label, eng in engines.items():
                if "Paddle" in label and name not in args.paddle_kernels_sets.split(","):
                    continue
                tot = [0, 0, 0, 0, 0]
                for it in items:
                    res = eng.read(it.image)
                    s = score_item(name, it.truth, it.boxes, [(ln.text, [list(p) for p in ln.box]) for ln in res.lines])
                    tot = [a + b for a, b in zip(tot, s)]
                walls = []
                for it in items:
                    t = time.perf_counter()
                    eng.read(it.image)
                    walls.append(time.perf_counter() - t)
                rows.append({"set": name, "variant": label, "images": len(items), "truth": tot[0], "exact": tot[2],
                             "cer": tot[3] / max(tot[4], 1), "ips": len(walls) / max(sum(walls), 1e-9)})
    finally:
        for eng in engines.values():
            eng.close()
    return rows


def render(args, quant: dict, calls: list[dict], reads: list[dict], started: str, wall_s: float) -> str:
    from load_tests.tiers import machine

    out = [f"# engine int8: {args.set}'s recogniser, ops {args.ops}, algo {args.algo}, "
           f"{quant['calibration_batches']} calibration batches of {args.batch} at width {args.width} "
           f"({quant['scalars_rewritten']} 0-D scales rewritten, quantized in {quant['seconds']:.0f} s); "
           f"{started}; {machine()}; {wall_s:.0f} s",
           "", "| input | variant | ms per call | x OpenVINO fp32 | agreement with the reference where it reads a character |",
           "|---|---|---:|---:|---:|"]
    out += [f"| {r['shape']} ({r['inputs']} inputs) | {r['variant']} | {r['ms']:.1f} | {r['x_ov_fp32']:.2f} | "
            f"{r['agree'] * 100:.1f}% |" for r in calls]
    if reads:
        out += ["", "| set | recogniser | images | truth | exact | CER | img/s |", "|---|---|---:|---:|---:|---:|---:|"]
        out += [f"| {r['set']} | {r['variant']} | {r['images']} | {r['truth']} | {r['exact']} | {r['cer']:.3f} | "
                f"{r['ips']:.2f} |" for r in reads]
    return "\n".join(out)


def run(args: argparse.Namespace) -> tuple[dict, list, list]:
    from serve_app.core.engine_config import for_model
    from serve_app.engine import default_engine_config
    from serve_app.inference.weights import model_files

    engine = for_model(default_engine_config(), args.set)
    src = str(Path(model_files("rec", None, engine.model).program).parent)
    tmp = tempfile.mkdtemp(prefix="ocr-int8-")
    try:
        quant = quantize(src, tmp, args)
        calls = per_call(src, tmp, args)
        reads = reading(tmp, args) if args.eval else []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return quant, calls, reads


def main(args: argparse.Namespace) -> int:
    import datetime as dt

    if args.quantize_child:
        quantize_child(*args.quantize_child, args)
        return 0
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t = time.perf_counter()
    quant, calls, reads = run(args)
    print(render(args, quant, calls, reads, started, time.perf_counter() - t))
    return 0


def smoke(args: argparse.Namespace) -> int:
    """v6 tiny's recogniser, one calibration batch of 2, a few calls, no eval sets."""
    args.set, args.batch, args.calibration_batches, args.repeats, args.eval = "ppocrv6_tiny", 2, 1, 2, []
    args.widths = "320"
    quant, calls, _ = run(args)
    check(quant["calibration_batches"] == 1 and quant["scalars_rewritten"] > 0, f"quantized: {quant}")
    check(len(calls) == 2 * 5 - (0 if any("bf16" in c["variant"] for c in calls) else 2), f"rows: {calls}")
    check(all(c["agree"] == 1.0 for c in calls if c["variant"].startswith("fp32, Paddle")), "the reference itself")
    print(render(args, quant, calls, [], "smoke", 0))
    return 0


if __name__ == "__main__":
    sys.exit(standalone(__name__))
