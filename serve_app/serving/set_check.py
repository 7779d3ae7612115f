"""A user's own model set checked with Paddle before it is served
(serve_app.core.own_sets): each folder loads as a predictor, the detector
and the recogniser each run once on a blank input, the recogniser's
output classes equal its dictionary's characters plus the CTC blank (and
the space, with rec.use_space_char), and each passes the canary every
replica runs before it is ready (serve_app.serving.canary: one box on the
golden word, and its exact text). A set that fails here would read every
line wrongly or never have a ready replica; it is refused, naming the
files and the problem.

Run in a child process (`python -m serve_app.serving.set_check`) when the
application is built, so the predictors' memory (which Paddle keeps after a
predictor is closed) is not the builder's, and a crash inside Paddle is a
clear error, not a dead builder."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from serve_app.core.errors import ConfigError

CHECK_TIMEOUT_S = 300


def check_engine(config: Any) -> dict:
    """Load and run `config`'s det and rec once (in this process); ValueError naming the problem."""
    import numpy as np

    from serve_app.core.request_options import DetParams
    from serve_app.inference.predictor import PaddlePredictor
    from serve_app.inference.runners import TextDetector
    from serve_app.inference.weights import dictionary_path, model_files
    from serve_app.ocr.recognition import load_charset

    from serve_app.inference.runners import TextRecognizer
    from serve_app.serving.canary import GOLDEN_TEXT, detector_probe, recognizer_probe

    opts = config.predictor.model_copy(update={"enable_openvino_engine": False, "enable_mkldnn": False})
    out: dict[str, Any] = {}
    det = PaddlePredictor(model_files("det", config.det_model, config.model), opts, "det")
    try:
        TextDetector(det, config.det).detect([np.full((64, 64, 3), 255, np.uint8)], [DetParams()])
    except Exception as e:
        raise ValueError(f"det_model {config.det_model}: one inference on a blank 64x64 image failed: {e}") from None
    try:  # what each of its replicas runs before it is ready (serve_app.serving.canary)
        found = detector_probe(TextDetector(det, config.det), config.pipeline)()
    except Exception as e:
        found = type("Result", (), {"ok": False, "detail": f"{type(e).__name__}: {e}"})()
    finally:
        det.close()
    if not found.ok:
        raise ValueError(f"det_model {config.det_model} fails the check each replica runs before it is ready (the "
                         f"word {GOLDEN_TEXT!r} drawn black on white): {found.detail}; a replica of this set would "
                         "never be ready (are det.mean/std/thresh the values it was trained with?)")
    charset = load_charset(dictionary_path(config.rec_dict, config.model), config.rec.use_space_char)
    rec = PaddlePredictor(model_files("rec", config.rec_model, config.model), opts, "rec")
    try:
        h, w = config.rec.image_height, config.rec.image_width
        probs = np.asarray(rec.run(np.zeros((1, 3, h, w), np.float32)))
    except Exception as e:
        rec.close()
        raise ValueError(f"rec_model {config.rec_model}: one inference on a blank {w}x{h} crop failed: {e}") from None
    try:
        read = (recognizer_probe(TextRecognizer(rec, config.rec, charset), environ={})()
                if probs.ndim == 3 and probs.shape[-1] == len(charset) else None)
    except Exception as e:
        read = type("Result", (), {"ok": False, "detail": f"{type(e).__name__}: {e}"})()
    finally:
        rec.close()
    if probs.ndim != 3:
        raise ValueError(f"rec_model {config.rec_model}: its output has shape {list(probs.shape)}, not the "
                         "(batch, steps, classes) of a CTC recogniser")
    classes, expected = int(probs.shape[-1]), len(charset)
    if classes != expected:
        space = " + the space (rec.use_space_char)" if config.rec.use_space_char else ""
        raise ValueError(f"rec_dict {config.rec_dict} has {expected - 1 - bool(config.rec.use_space_char)} "
                         f"characters ({expected} classes with the CTC blank{space}), but rec_model "
                         f"{config.rec_model} outputs {classes} classes: the dictionary is not the one the "
                         "recogniser was trained with (or set rec.use_space_char to match it)")
    if read is not None and not read.ok:
        raise ValueError(f"rec_model {config.rec_model} with rec_dict {config.rec_dict} fails the check each replica "
                         f"runs before it is ready (the word {GOLDEN_TEXT!r} drawn black on white): {read.detail}; "
                         "a replica of this set would never be ready (is the dictionary's order the one it was "
                         "trained with? does it read Latin capitals?)")
    out.update(classes=classes, steps=int(probs.shape[1]))
    return out


def check_own_sets(args: Any) -> None:
    """Every own set of an application (AppArgs), each in a child process;
    ConfigError naming the set, the file and the problem."""
    engines = args.engines()
    for own in args.own_models:
        config = engines[own.name]
        try:
            done = subprocess.run([sys.executable, "-m", "serve_app.serving.set_check"],
                                  input=config.model_dump_json(), capture_output=True, text=True,
                                  timeout=CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"own model set {own.name!r}: checking it took over {CHECK_TIMEOUT_S} s") from None
        if done.returncode != 0:
            lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
            reason = next((ln.split("REFUSED: ", 1)[1] for ln in lines if ln.startswith("REFUSED: ")), None)
            if reason is None:  # Paddle itself failed (a file that is no model can abort the process)
                errors = [ln for ln in lines if "rror" in ln] or lines or [f"exit {done.returncode}"]
                reason = (f"Paddle could not load or run its models (det_model {own.det_model}, rec_model "
                          f"{own.rec_model}; the check exited with {done.returncode}): {errors[-1][:500]}")
            raise ConfigError(f"own model set {own.name!r} refused: {reason}")


def main() -> int:
    from serve_app.core.engine_config import EngineConfig

    config = EngineConfig.model_validate_json(sys.stdin.read())
    try:
        print(json.dumps(check_engine(config)))
    except Exception as e:  # ModelError (a missing or empty file) or the checks' ValueError
        print(f"REFUSED: {e}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
