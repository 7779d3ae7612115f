"""Agreement of a lower-precision engine with fp32, per stage, as the start-up check measures it.

    python -m load_tests engine precision                # CPU: OpenVINO bf16 and oneDNN fp32 vs OpenVINO fp32
    python -m load_tests engine precision --device gpu   # GPU: TensorRT fp16 vs Paddle's fp32 GPU kernels

The measure a TensorRT fp16/int8 replica must pass before it is ready
(serve_app/inference/precision_check.py), on the packaged real images: the
detector's mean box IoU, identical angle decisions, the recogniser's CER,
each stage on its own inputs (crops cut at the recorded boxes). The
baseline row is the reference against itself (100%: the measure is
deterministic). On the CPU the low precision is OpenVINO's bf16 (where the
CPU has it). GPU mode: not run here; int8 needs the replica's calibration
and is not measured by this program."""

from __future__ import annotations

import argparse
import time

STAGES = ("det", "cls", "rec")


def readers(engine_config):
    """Per stage: predictor -> items -> outputs (the runners the replicas use)."""
    from serve_app.inference.runners import DirectionClassifier, TextDetector, TextRecognizer
    from serve_app.ocr.recognition import load_charset
    from serve_app.inference.weights import dictionary_path

    charset = load_charset(dictionary_path(engine_config.rec_dict), engine_config.rec.use_space_char)
    return {"det": lambda p: TextDetector(p, engine_config.det).detect,
            "cls": lambda p: DirectionClassifier(p, engine_config.cls).classify,
            "rec": lambda p: TextRecognizer(p, engine_config.rec, charset).recognize}


def variants(device: str, stage: str, engine):
    """(name, PredictorOptions): the reference, the reference again (a new
    predictor: the measure is deterministic), then the candidates."""
    from serve_app.core.engine_config import PredictorOptions
    from serve_app.inference.predictor import cpu_has_bf16
    from serve_app.inference.shape_ranges import stage_shapes

    if device == "gpu":
        ref = PredictorOptions(device="gpu")
        shapes = stage_shapes(stage, engine.det, engine.cls, engine.rec)
        trt = {"precision": "fp16", "use_static": False, "input_shapes": shapes,
               "max_batch_size": max(s[0] for s in shapes)}
        return [("Paddle GPU fp32", ref), ("Paddle GPU fp32 (again)", ref),
                ("TensorRT fp16", ref.model_copy(update={"tensorrt": trt}))]
    ref = PredictorOptions(enable_openvino_engine=True, openvino_precision="fp32", cpu_math_library_num_threads=2)
    out = [("OpenVINO fp32", ref), ("OpenVINO fp32 (again)", ref),
           ("oneDNN fp32", PredictorOptions(enable_mkldnn=True, cpu_math_library_num_threads=2))]
    if cpu_has_bf16():
        out.append(("OpenVINO bf16", ref.model_copy(update={"openvino_precision": "bf16"})))
    return out


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")


def main(args: argparse.Namespace) -> int:
    a = args
    import cv2

    from load_tests.stats import md_table
    from serve_app.core.engine_config import EngineConfig
    from serve_app.inference.precision_check import (UNITS, PrecisionMismatch, agreement, answers, box_agreement,
                                                     check_items, decide)
    from serve_app.inference.predictor import PaddlePredictor
    from serve_app.inference.weights import model_files

    engine = EngineConfig()
    make = readers(engine)
    rows = []
    for stage in STAGES:
        names, items = check_items(stage, lambda path: cv2.imread(path, cv2.IMREAD_COLOR))
        outs, times = {}, {}
        for name, opts in variants(a.device, stage, engine):
            pred = PaddlePredictor(model_files(stage), opts, f"{stage}-{name}")
            try:
                t0 = time.perf_counter()
                outs[name] = make[stage](pred)(list(items))
                times[name] = (time.perf_counter() - t0) * 1000
            finally:
                pred.close()
        ref_name = next(iter(outs))
        ref = answers(stage, outs[ref_name])
        for name in list(outs)[1:]:
            cand = answers(stage, outs[name])
            agreed = box_agreement(names, ref, cand) if stage == "det" else agreement(names, ref, cand, UNITS[stage])
            try:
                decide(stage, name, agreed)
                verdict = "passes"
            except PrecisionMismatch:
                verdict = "falls back to fp32"
            rows.append((stage, name, times[name], agreed, verdict))
    print(f"## Agreement with {variants(a.device, 'rec', engine)[0][0]} per stage (packaged real images; the start-up "
          "check's bounds: rec CER <= 1%, det mean box IoU >= 0.9, cls 98% identical)\n")
    print("\n".join(md_table(["stage", "engine", "agreement", "%", "CER", "mean IoU", "verdict", "ms (all items, sequential)"], (
        [stage, name, f"{agreed.identical}/{agreed.total} {agreed.unit}", f"{100 * agreed.fraction:.1f}",
         "" if agreed.cer is None else f"{100 * agreed.cer:.2f}%", "" if agreed.mean_iou is None else f"{agreed.mean_iou:.3f}",
         verdict, f"{ms:.0f}"] for stage, name, ms, agreed, verdict in rows), "lllrrrlr")))
    for stage, name, ms, agreed, verdict in rows:
        if agreed.differing:
            print(f"\n{stage}, {name}, first differences: " +
                  "; ".join(f"{n}: {r!r} vs {c!r}" for n, r, c in agreed.differing[:5]))
    return 0
