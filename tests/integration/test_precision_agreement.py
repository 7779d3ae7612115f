"""#29 item 5: the fp16/int8 start-up check's measures on real model outputs.
The packaged calibration set records what the CPU engine (OpenVINO fp32)
reads on its pages (serve_app/inference/calibration/set.json: the reference the
unit tests perturb); here the three models run again on the same real
images, each stage on its own inputs as the check runs them, and the check
passes them against the record (a stale record, or a measure that does not
hold on real outputs, fails). The GPU side (TensorRT vs Paddle's fp32 GPU
kernels) is not run: no GPU here."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from serve_app.core.engine_config import EngineConfig, PredictorOptions
from serve_app.inference.int8_calibration import load_set
from serve_app.inference.precision_check import check, check_items
from serve_app.inference.predictor import PaddlePredictor
from serve_app.inference.runners import DirectionClassifier, TextDetector, TextRecognizer
from serve_app.ocr.recognition import load_charset
from serve_app.inference.weights import dictionary_path, model_files

V4 = "ppocrv4_mobile"  # the stages run here are the carrier's v4 files (model_files(stage)), with v4's values
FP32 = PredictorOptions(enable_openvino_engine=True, openvino_precision="fp32", cpu_math_library_num_threads=2)


def read(path):
    return cv2.imread(path, cv2.IMREAD_COLOR)


@pytest.fixture(scope="module")
def recorded():
    import json

    doc = json.loads((load_set().pages[0].parents[1] / "set.json").read_text())
    return {k: [x for p in doc["pages"] for x in p["cpu"][k]] for k in ("directions", "texts")} | {
        "boxes": [[np.asarray(b, np.float32) for b in p["cpu"]["boxes"]] for p in doc["pages"]]}


def run_stage(stage, make):
    p = PaddlePredictor(model_files(stage), FP32, f"{stage}-fp32")
    try:
        names, items = check_items(stage, read)
        return names, items, make(p)(list(items))
    finally:
        p.close()


def test_the_detector_finds_the_recorded_boxes(recorded):
    names, pages, boxes = run_stage("det", lambda p: TextDetector(p, EngineConfig(model=V4).det).detect)
    line, a, warning = check("det", "fp32", names, pages, lambda _: recorded["boxes"], lambda _: boxes)
    assert a.total == sum(len(b) for b in recorded["boxes"]) == 165 and a.fraction == 1.0, a.differing
    assert warning is None and a.mean_iou > 0.99 and "165/165 boxes matched to fp32's at IoU >= 0.9" in line


def test_the_classifier_and_recogniser_answer_the_recorded_angles_and_texts(recorded):
    names, crops, dirs = run_stage("cls", lambda p: DirectionClassifier(p, EngineConfig(model=V4).cls).classify)
    assert len(dirs) == 2 * 174  # upright (165 line crops, 9 words), then turned
    line, a, _ = check("cls", "fp32", names[:165], crops[:165], lambda _: recorded["directions"],
                       lambda _: dirs[:165])
    assert a.fraction == 1.0 and "165/165 angle decisions identical to fp32" in line, a.differing
    rec = EngineConfig(model=V4).rec
    charset = load_charset(dictionary_path(EngineConfig(model=V4).rec_dict), rec.use_space_char)
    names, crops, texts = run_stage("rec", lambda p: TextRecognizer(p, rec, charset).recognize)
    line, a, _ = check("rec", "fp32", names[:165], crops[:165], lambda _: recorded["texts"],
                       lambda _: [t.text for t in texts[:165]])
    assert a.fraction == 1.0 and a.cer == 0.0, a.differing
    assert line.startswith("rec: TensorRT fp32 agrees with fp32: CER 0.00%") and "165/165 lines identical" in line
