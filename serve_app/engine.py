"""The in-process OCR engine: decode -> detect -> crop -> classify ->
recognise, on three Paddle predictors loaded once. It is the library API, the
CLI's engine, and the reference the service must agree with."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional, Union

import numpy as np

from .config import EngineConfig, ImageLimits, PipelineOptions
from .errors import BadImage, TooLarge
from .weights import dictionary_path, model_files
from .runners import DirectionClassifier, TextDetector, TextRecognizer
from .predictor import PaddlePredictor
from .stages.crop import char_quad, crop_quad, is_vertical
from .stages.db_postprocess import order_clockwise
from .stages.decode import array_to_bgr, decode_image
from .stages.det_preprocess import Geometry, boxes_to_original, prepare_image
from .stages.direction import apply_direction, is_flipped
from .stages.reading_order import reading_order
from .stages.recognition import load_charset
from .results import CharBox, Direction, OcrResult, Recognition, TextLine

ImageInput = Union[bytes, bytearray, memoryview, np.ndarray, str, Path]


def load_image(image: ImageInput, limits: ImageLimits, exif_transpose: bool) -> np.ndarray:
    """Bytes (encoded image), a path, or an array (HxW or HxWxC, BGR order
    for colour, as OpenCV gives) -> BGR uint8."""
    if isinstance(image, np.ndarray):
        if image.size > limits.max_pixels * 4:
            raise BadImage(f"image array of shape {image.shape} is over the pixel limit")
        return array_to_bgr(image)
    if isinstance(image, (str, Path)):
        path = Path(image)
        if not path.is_file():
            raise BadImage(f"{path}: no such file")
        size = path.stat().st_size
        if size > limits.max_bytes:
            raise TooLarge(f"{path} is {size} bytes, over the limit of {limits.max_bytes}")
        image = path.read_bytes()
    return decode_image(bytes(image), limits, exif_transpose)


def crop_lines(work: np.ndarray, boxes: np.ndarray, limits: ImageLimits) -> tuple[np.ndarray, list[np.ndarray]]:
    """Boxes in reading order (at most max_crops of them) and their crops."""
    if len(boxes) == 0:
        return boxes, []
    order = reading_order(boxes)[: limits.max_crops]
    boxes = boxes[order]
    return boxes, [crop_quad(work, b) for b in boxes]


def assemble(
    boxes: np.ndarray,
    recs: list[Recognition],
    geometry: Geometry,
    drop_score: float,
    flipped: Optional[list[bool]] = None,
    return_chars: bool = False,
) -> tuple[TextLine, ...]:
    """Lines whose score reaches drop_score, boxes mapped to the original;
    with return_chars, each line also lists its characters' boxes."""
    mapped = boxes_to_original(boxes, geometry)
    flipped = flipped or [False] * len(recs)
    lines = []
    for b, r, flip in zip(mapped, recs, flipped):
        if r.score < drop_score or not r.text:
            continue
        chars = None
        if return_chars:
            vertical = is_vertical(b)
            chars = tuple(
                CharBox(ch, _round_box(order_clockwise(char_quad(b, s0, s1, vertical, flip))))
                for ch, (s0, s1) in zip(r.text, r.char_spans)
                if not ch.isspace()
            )
        lines.append(TextLine(r.text, r.score, _round_box(b), chars))
    return tuple(lines)


def _round_box(b: np.ndarray) -> list[list[float]]:
    return np.round(np.asarray(b, dtype=np.float64), 1).tolist()


def whole_image_box(w: int, h: int) -> list[list[float]]:
    return [[0.0, 0.0], [float(w), 0.0], [float(w), float(h)], [0.0, float(h)]]


class OcrEngine:
    """Loads the det, cls and rec predictors once; `read` is thread-safe (each
    predictor runs on its own thread) but one image at a time per model."""

    def __init__(self, config: Optional[EngineConfig] = None):
        self.config = config = config or default_engine_config()
        t0 = time.perf_counter()
        popts = config.predictor
        self._predictors = [PaddlePredictor(model_files("det", config.det_model), popts, "det")]
        self.detector = TextDetector(self._predictors[-1], config.det)
        self.classifier = None
        if config.cls.enabled:
            self._predictors.append(PaddlePredictor(model_files("cls", config.cls_model), popts, "cls"))
            self.classifier = DirectionClassifier(self._predictors[-1], config.cls)
        self._predictors.append(PaddlePredictor(model_files("rec", config.rec_model), popts, "rec"))
        charset = load_charset(dictionary_path(config.rec_dict), config.rec.use_space_char)
        self.recognizer = TextRecognizer(self._predictors[-1], config.rec, charset)
        self.load_seconds = time.perf_counter() - t0

    def read(
        self, image: ImageInput, *, det: bool = True, cls: Optional[bool] = None, return_chars: bool = False
    ) -> OcrResult:
        """OCR one image. det=False reads the whole image as one line (a crop
        already cut out); cls=None uses the configured classifier setting;
        return_chars adds each character's box to every line."""
        cfg = self.config
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        img = load_image(image, cfg.limits, cfg.pipeline.exif_transpose)
        h, w = img.shape[:2]
        timings["decode"] = _ms(t0)

        if det:
            t = time.perf_counter()
            work, geometry = prepare_image(img, cfg.pipeline)
            boxes = self.detector.detect([work])[0]
            boxes, crops = crop_lines(work, boxes, cfg.limits)
            timings["det"] = _ms(t)
        else:
            geometry = Geometry(1.0, 1.0, 0, w, h)
            boxes = np.array([whole_image_box(w, h)], dtype=np.float32)
            crops = [img]
            timings["det"] = 0.0

        t = time.perf_counter()
        use_cls = self.classifier is not None if cls is None else (cls and self.classifier is not None)
        flipped = [False] * len(crops)
        if use_cls and crops:
            dirs = self.classifier.classify(crops)
            flipped = [is_flipped(d, cfg.cls) for d in dirs]
            crops = [apply_direction(c, d, cfg.cls) for c, d in zip(crops, dirs)]
        timings["cls"] = _ms(t)

        t = time.perf_counter()
        recs = self.recognizer.recognize(crops) if crops else []
        timings["rec"] = _ms(t)
        lines = assemble(boxes, recs, geometry, cfg.pipeline.drop_score, flipped, return_chars)
        timings["total"] = _ms(t0)
        return OcrResult(w, h, lines, timings)

    def detect(self, image: ImageInput) -> list[list[list[float]]]:
        """Text boxes only (det only), in reading order, original coordinates."""
        cfg = self.config
        img = load_image(image, cfg.limits, cfg.pipeline.exif_transpose)
        work, geometry = prepare_image(img, cfg.pipeline)
        boxes = self.detector.detect([work])[0]
        if len(boxes):
            boxes = boxes[reading_order(boxes)]
        return [_round_box(b) for b in boxes_to_original(boxes, geometry)]

    def classify(self, image: ImageInput) -> Direction:
        """Direction of a single text-line image (cls only)."""
        if self.classifier is None:
            raise BadImage("the direction classifier is disabled in this engine's config")
        img = load_image(image, self.config.limits, self.config.pipeline.exif_transpose)
        return self.classifier.classify([img])[0]

    def close(self) -> None:
        for p in self._predictors:
            p.close()

    def __enter__(self) -> "OcrEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def default_engine_config(**overrides) -> EngineConfig:
    """In-process defaults: Paddle's bundled OpenVINO engine on every core this
    process may use, threads pinned there (OpenVINO would otherwise bind them
    all to CPU 0)."""
    from .config import PredictorOptions

    cores = sorted(os.sched_getaffinity(0))
    predictor = PredictorOptions(
        cpu_math_library_num_threads=len(cores), enable_openvino_engine=True, cpu_affinity=cores
    )
    return EngineConfig(predictor=predictor).model_copy(update=overrides)


__all__ = ["OcrEngine", "default_engine_config", "EngineConfig", "PipelineOptions"]
