"""Children for tests/integration/test_predictor_keys.py: several Paddle
predictors (or engines) of one program in one process, each answering with
its own model (serve_app/inference/ov_slots.py). Run in a child process: a
predictor that ran on a replaced OpenVINO engine ends its process with a
segfault, which the test sees as a broken pool, not as its own crash."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from harness.peer import PEER


def tuned_copy(dest: Path) -> tuple:
    """(base, tuned): the default classifier's files, and its program with other weights: the same
    architecture and variable names (what fine-tuning keeps), its last
    parameter's values changed (what fine-tuning changes)."""
    from serve_app.engine import default_engine_config
    from serve_app.inference.weights import ModelFiles, model_files

    cfg = default_engine_config()
    base = model_files("cls", cfg.cls_model, cfg.model)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(base.program, dest / "inference.pdmodel")
    data = bytearray(Path(base.params).read_bytes())
    tail = np.frombuffer(bytes(data[-64:]), np.float32).copy()
    data[-64:] = (tail * -4.0 + 0.5).astype(np.float32).tobytes()
    (dest / "inference.pdiparams").write_bytes(bytes(data))
    return base, ModelFiles("cls", dest / "inference.pdmodel", dest / "inference.pdiparams")


def classifier_beside_its_fine_tuned_copy(folder: str) -> dict:
    from serve_app.engine import default_engine_config
    from serve_app.inference.predictor import PaddlePredictor, resolve_device

    opts = resolve_device(default_engine_config().predictor)
    base, tuned = tuned_copy(Path(folder))
    x = np.random.default_rng(7).random((6, 3, 48, 192), dtype=np.float32)
    out: dict = {}
    a = PaddlePredictor(base, opts, "cls")
    out["base"] = a.run(x)
    b = PaddlePredictor(tuned, opts, "cls")
    out["tuned"] = b.run(x)
    out["base after tuned loaded"] = a.run(x)
    b.close()
    c = PaddlePredictor(tuned, opts, "cls")  # takes the closed one's place
    out["tuned again"] = c.run(x)
    out["base after tuned reloaded"] = a.run(x)
    a.close()
    c.close()
    d = PaddlePredictor(tuned, opts, "cls")  # alone now: the files as they are
    out["tuned alone"] = d.run(x)
    d.close()
    return out


def engines_one_after_another(image: str) -> dict:
    """What a test session or the CLI does: an engine, another engine of
    the same set beside it, the second closed and a third made; the first
    reads all along."""
    from serve_app.engine import OcrEngine

    path = str(PEER / image)

    def texts(engine):
        return [line.text for line in engine.read(path).lines]

    out: dict = {}
    first = OcrEngine()
    out["first"] = texts(first)
    second = OcrEngine()
    out["second"] = texts(second)
    out["first beside the second"] = texts(first)
    second.close()
    third = OcrEngine()
    out["third"] = texts(third)
    out["first beside the third"] = texts(first)
    third.close()
    first.close()
    return out
