"""The check a converted model passes before it is cached
(serve_app/tools/convert_models.py): Paddle configured as the service's CPU
engine (enable_openvino_engine, fp32: a legacy `.pdmodel` runs on OpenVINO;
Paddle 3.3.1 runs a Paddle 3 `.json` program on its oneDNN kernels even so)
against onnxruntime on the original ONNX file, on fixed inputs and on real
images. Build environment only (onnxruntime, paddle)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[2]
PEER = REPO / "tests" / "data" / "peer"
PROGRAM, LEGACY, PARAMS = "inference.json", "inference.pdmodel", "inference.pdiparams"


class ConversionError(RuntimeError):
    """A conversion or its check failed; the message names the file."""



def program_of(model_dir: Path) -> Path:
    """The converted program in model_dir: the legacy inference.pdmodel
    (run on OpenVINO) if there is one, else the Paddle 3 inference.json."""
    return model_dir / LEGACY if (model_dir / LEGACY).is_file() else model_dir / PROGRAM


def paddle_runner(model_dir: Path, engine: str = "openvino", precision: str = "fp32") -> Callable[[np.ndarray], np.ndarray]:
    """The converted model on one CPU thread, configured as the service's
    CPU engine (`openvino` at `precision`: Paddle 3.3.1 runs a legacy
    .pdmodel on OpenVINO, a .json program on its oneDNN kernels fp32), or
    `native` (no oneDNN)."""
    from paddle import inference

    program = program_of(model_dir)
    cfg = inference.Config(str(program), str(model_dir / PARAMS))
    cfg.disable_gpu()
    cfg.set_cpu_math_library_num_threads(1)
    if engine == "openvino":
        cfg.enable_openvino_engine(inference.PrecisionType.Bfloat16 if precision == "bf16"
                                   else inference.PrecisionType.Float32)
        cfg.set_optim_cache_dir(tempfile.mkdtemp(prefix="ov-check-"))
    else:
        cfg.disable_mkldnn()
    cfg.disable_glog_info()
    cfg.switch_use_feed_fetch_ops(False)
    try:
        predictor = inference.create_predictor(cfg)
    except Exception as e:
        raise ConversionError(f"Paddle ({engine}) could not load {program}: {e}") from e
    inp = predictor.get_input_handle(predictor.get_input_names()[0])
    out = predictor.get_output_handle(predictor.get_output_names()[0])

    def run(x: np.ndarray) -> np.ndarray:
        inp.reshape(list(x.shape))
        inp.copy_from_cpu(np.ascontiguousarray(x, dtype=np.float32))
        try:
            predictor.run()
        except Exception as e:
            raise ConversionError(f"Paddle ({engine}) could not run {program} on {x.shape}: {e}") from e
        return out.copy_to_cpu()

    return run


def onnx_runner(onnx_path: Path) -> Callable[[np.ndarray], np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda x: sess.run(None, {name: np.ascontiguousarray(x, dtype=np.float32)})[0]


# Bounds on |paddle - onnxruntime| (det: probabilities; rec: per-class
# probabilities). Measured here: det 1e-4 small / 2e-4 tiny, rec 2e-5; a
# broken weight moves them by orders of magnitude.
BOUNDS = {"det": 5e-3, "rec": 1e-3}
# Share of a detector's binarised map (p > 0.3, PP-OCR's DB threshold) that
# may flip between the two runtimes on a real image (pixels right at the threshold).
MASK_FLIP_BOUND = 1e-4
# Real images for the detectors' check: the densest few (seconds each at 960 px on one thread).
DET_IMAGES = 6


def fixed_inputs(stage: str) -> list[np.ndarray]:
    rng = np.random.default_rng(37)
    if stage == "det":
        return [((rng.random(s, dtype=np.float32) - 0.45) / 0.226) for s in [(1, 3, 640, 640), (1, 3, 320, 960)]]
    return [rng.uniform(-1, 1, s).astype(np.float32) for s in [(2, 3, 48, 320), (1, 3, 48, 640)]]


def det_input(img: np.ndarray, limit: int = 960) -> np.ndarray:
    """PP-OCR's det pre-processing: longest side at most `limit`, both sides
    multiples of 32, ImageNet normalisation, CHW."""
    import cv2

    h, w = img.shape[:2]
    r = min(1.0, limit / max(h, w))
    nh, nw = max(32, int(round(h * r / 32)) * 32), max(32, int(round(w * r / 32)) * 32)
    x = cv2.resize(img, (nw, nh)).astype(np.float32) / 255.0
    x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    return x.transpose(2, 0, 1)[None]


def rec_input(crop: np.ndarray, height: int = 48, max_width: int = 3200) -> np.ndarray:
    import cv2

    h, w = crop.shape[:2]
    nw = int(min(max_width, max(8, np.ceil(height * w / max(h, 1)))))
    x = cv2.resize(crop, (nw, height)).astype(np.float32) / 255.0
    return ((x - 0.5) / 0.5).transpose(2, 0, 1)[None]


def load_charset(path: Path) -> list[str]:
    """PP-OCR's CTC dictionaries (use_space_char): the file's lines, then " "."""
    return [line.rstrip("\r\n") for line in path.read_text(encoding="utf-8").splitlines()] + [" "]


def ctc_greedy(probs: np.ndarray, charset: list[str]) -> str:
    """Best path, repeats merged, blank (0) dropped; index i>0 is charset[i-1]."""
    idx = probs.argmax(-1)
    keep = np.ones_like(idx, dtype=bool)
    keep[1:] = idx[1:] != idx[:-1]
    keep &= idx != 0
    return "".join(charset[i - 1] if i - 1 < len(charset) else "?" for i in idx[keep])


def peer_images(limit: Optional[int] = None) -> list[tuple[str, np.ndarray]]:
    """The peer images, the ones with most text lines first (ties by name)."""
    import cv2

    ref = json.loads((PEER / "reference_rapidocr_paddle.json").read_text())
    out = []
    for name in sorted(ref, key=lambda n: (-len(ref[n]), n))[:limit]:
        img = cv2.imread(str(PEER / name), cv2.IMREAD_COLOR)
        if img is None:
            raise ConversionError(f"peer image {PEER / name} could not be read")
        out.append((name, img))
    return out


def peer_crops(limit: int = 60) -> list[tuple[str, np.ndarray]]:
    """Text lines of the peer images, cut at the boxes PP-OCRv4 found
    (reference_rapidocr_paddle.json): the first lines of each image in turn."""
    from serve_app.ocr.crop import crop_quad

    ref = json.loads((PEER / "reference_rapidocr_paddle.json").read_text())
    images = dict(peer_images())
    per_image = [[(f"{name}#{i}", crop_quad(images[name], np.array(line["box"], np.float32)))
                  for i, line in enumerate(lines)] for name, lines in sorted(ref.items())]
    crops: list[tuple[str, np.ndarray]] = []
    depth = 0
    while len(crops) < limit and any(depth < len(p) for p in per_image):
        crops += [p[depth] for p in per_image if depth < len(p)]
        depth += 1
    return crops[:limit]


def verify(stage: str, model_dir: Path, onnx_path: Path, charset: Optional[list[str]] = None,
           engine: str = "openvino") -> dict:
    """The converted model against onnxruntime on the original file: fixed
    inputs, then real images (det) or real crops (rec). Raises
    ConversionError naming the converted file on any difference over its bound."""
    ours, theirs = paddle_runner(model_dir, engine), onnx_runner(onnx_path)
    params = model_dir / PARAMS
    bound = BOUNDS[stage]
    report: dict = {"engine": f"paddle ({engine} config, fp32, {program_of(model_dir).name}) vs onnxruntime",
                    "bound": bound}
    fixed = 0.0
    for x in fixed_inputs(stage):
        a, b = ours(x), theirs(x)
        if a.shape != b.shape:
            raise ConversionError(f"{params}: output shape {a.shape} != onnxruntime's {b.shape} for input {x.shape}")
        fixed = max(fixed, float(np.abs(a - b).max()))
    report["fixed_max_abs_diff"] = fixed
    if not fixed <= bound:
        raise ConversionError(f"{params}: on fixed inputs the converted {stage} model differs from onnxruntime "
                              f"on {onnx_path.name} by {fixed:.3g} (bound {bound})")
    if stage == "det":
        real, flips, pixels = 0.0, 0, 0
        images = peer_images(DET_IMAGES)
        for name, img in images:
            x = det_input(img)
            a, b = ours(x), theirs(x)
            real = max(real, float(np.abs(a - b).max()))
            flips += int(((a > 0.3) != (b > 0.3)).sum())
            pixels += a.size
        report.update(images=len(images), real_max_abs_diff=real, mask_flips=flips, mask_pixels=pixels)
        if not real <= bound or flips > MASK_FLIP_BOUND * pixels:
            raise ConversionError(f"{params}: on the peer images the converted detector differs from onnxruntime "
                                  f"by {real:.3g} (bound {bound}), {flips} of {pixels} mask pixels flipped")
    else:
        assert charset is not None
        real, differ = 0.0, []
        crops = peer_crops()
        for name, crop in crops:
            x = rec_input(crop)
            a, b = ours(x), theirs(x)
            real = max(real, float(np.abs(a - b).max()))
            sa, sb = ctc_greedy(a[0], charset), ctc_greedy(b[0], charset)
            if sa != sb:
                differ.append((name, sa, sb))
        report.update(crops=len(crops), real_max_abs_diff=real, strings_differ=len(differ))
        if differ or not real <= bound:
            raise ConversionError(f"{params}: on {len(crops)} peer crops the converted recogniser reads "
                                  f"{len(differ)} differently from onnxruntime (first: {differ[:2]}), "
                                  f"max diff {real:.3g} (bound {bound})")
    if engine == "openvino" and program_of(model_dir).name == LEGACY and bf16_supported():
        report["bf16"] = bf16_drift(stage, model_dir, theirs, charset)
    return report


def bf16_supported() -> bool:
    """serve_app.inference.predictor.cpu_has_bf16's test (the service's `auto`)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def bf16_drift(stage: str, model_dir: Path, theirs: Callable, charset: Optional[list[str]]) -> dict:
    """Recorded, not enforced: what OpenVINO's bf16 (the CPU engine's `auto`
    on a CPU with bf16) changes against onnxruntime on the same real inputs.
    A set whose strings change here is served with openvino_precision fp32."""
    ours = paddle_runner(model_dir, "openvino", "bf16")
    if stage == "det":
        flips, pixels = 0, 0
        for _, img in peer_images(DET_IMAGES):
            x = det_input(img)
            a, b = ours(x), theirs(x)
            flips += int(((a > 0.3) != (b > 0.3)).sum())
            pixels += a.size
        return {"mask_flips": flips, "mask_pixels": pixels}
    differ = []
    for name, crop in peer_crops():
        x = rec_input(crop)
        sa, sb = ctc_greedy(ours(x)[0], charset), ctc_greedy(theirs(x)[0], charset)
        if sa != sb:
            differ.append([name, sa, sb])
    return {"strings_differ": len(differ), "first": differ[:3]}
