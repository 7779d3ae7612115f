"""The in-process OCR engine: the pipeline (serve_app.flow.pipeline) over three
local Paddle predictors loaded once. It is the library API, the CLI's
engine, and the reference the service must agree with (same pipeline code,
local predictors instead of deployment handles)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, Coroutine, Optional

from serve_app.core.engine_config import EngineConfig, PipelineOptions, for_model
from serve_app.core.errors import BadImage
from serve_app.core.request_options import OcrOptions, parse_options
from serve_app.flow.pipeline import ImageInput, Pipeline, Stages, load_image, round_box
from serve_app.inference.predictor import PaddlePredictor
from serve_app.core.results import Direction, DocumentResult, OcrResult
from serve_app.inference.runners import (DirectionClassifier, LayoutDetector, TableRecognizer, TextDetector,
                                         TextRecognizer)
from serve_app.ocr.det_preprocess import boxes_to_original, prepare_image
from serve_app.ocr.reading_order import reading_order
from serve_app.ocr.recognition import load_charset
from serve_app.inference.weights import dictionary_path, model_files, structure_files


class OcrEngine:
    """Loads the det, cls and rec predictors once. `read` is thread-safe:
    each predictor runs on its own thread, the pipeline on the engine's
    event loop thread; `aread` runs it on the caller's loop."""

    def __init__(self, config: Optional[EngineConfig] = None, model: Optional[str] = None):
        """`model`: a model set's name (serve_app.core.model_sets; default:
        the config's, ppocrv6_small unless it says otherwise)."""
        config = config or default_engine_config()
        self.config = config = for_model(config, model) if model is not None else config
        t0 = time.perf_counter()
        popts = config.predictor
        self._predictors: list[PaddlePredictor] = []

        def load(stage: str, model_dir: Optional[str]) -> PaddlePredictor:
            self._predictors.append(PaddlePredictor(model_files(stage, model_dir, config.model), popts, stage))
            return self._predictors[-1]

        try:
            det = load("det", config.det_model)
            self.detector = TextDetector(det, config.det)
            self.classifier = None
            if config.cls.enabled:
                cls = load("cls", config.cls_model)
                self.classifier = DirectionClassifier(cls, config.cls)
            rec = load("rec", config.rec_model)
            charset = load_charset(dictionary_path(config.rec_dict, config.model), config.rec.use_space_char)
            self.recognizer = TextRecognizer(rec, config.rec, charset)
        except BaseException:
            self.close()
            raise
        self.load_seconds = time.perf_counter() - t0

        async def detect(work, params, ctx=None):  # in process: nothing queued to drop
            return (await det.call_async(self.detector.detect, [work], [params]))[0]

        classify = None
        if self.classifier is not None:
            async def classify(crops, ctx=None):
                return await cls.call_async(self.classifier.classify, crops)

        async def recognize(crops, ctx=None):
            return await rec.call_async(self.recognizer.recognize, crops)

        # Document structure: its two predictors are loaded on the first read that asks (structure_runners).
        self._structure: Optional[tuple[LayoutDetector, TableRecognizer]] = None
        self._structure_lock = threading.Lock()

        async def layout(page, ctx=None):
            detector, _ = await asyncio.to_thread(self.structure_runners)
            return (await detector.predictor.call_async(detector.detect, [page]))[0]

        async def table(crop, ctx=None):
            _, recognizer = await asyncio.to_thread(self.structure_runners)
            return (await recognizer.predictor.call_async(recognizer.recognize, [crop]))[0]

        self.pipeline = Pipeline(Stages(detect, classify, recognize, layout, table), config)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_lock = threading.Lock()

    def structure_runners(self) -> tuple[LayoutDetector, TableRecognizer]:
        """The layout detector and table recogniser, loaded on first use
        (once, whichever thread asks first): an engine that never reads
        structure never loads them."""
        with self._structure_lock:
            if self._structure is None:
                opts, popts = self.config.structure, self.config.predictor
                layout = PaddlePredictor(structure_files("layout", opts.layout_model), popts, "layout")
                try:
                    table = PaddlePredictor(structure_files("table", opts.table_model), popts, "table")
                except BaseException:
                    layout.close()
                    raise
                self._predictors += [layout, table]
                self._structure = (LayoutDetector(layout, opts), TableRecognizer(table, opts))
            return self._structure

    def warm(self) -> float:
        """Run every input shape each predictor can be given once, as a
        service replica does before it is ready (then memory stays flat and
        no request pays a first-shape cost); seconds taken. Optional for
        library use."""
        t0 = time.perf_counter()
        calls = self.detector.warm_calls([]) + self.recognizer.warm_calls([])
        calls += self.classifier.warm_calls() if self.classifier is not None else []
        for fn, arg in calls:
            fn(arg)
        return time.perf_counter() - t0

    def read(
        self, image: ImageInput, *, det: bool = True, cls: Optional[bool] = None, return_chars: bool = False,
        **options: Any,
    ) -> OcrResult:
        """OCR one image. det=False reads the whole image as one line (a crop
        already cut out); cls=None uses the configured classifier setting;
        return_chars adds each character's box to every line. Any other
        OcrOptions field by name (return_words, box_thresh, ...), checked
        as the service checks it (BadRequest naming the field)."""
        opts = parse_options({"det": det, "cls": cls, "return_chars": return_chars, **options})
        return self._run(self.aread(image, opts))

    async def aread(self, image: ImageInput, options: OcrOptions = OcrOptions()) -> OcrResult:
        """`read` for async callers, on their own event loop."""
        return await self.pipeline.read(image, options.with_model((self.config.model,)))

    def read_document(self, pdf, *, det: bool = True, cls: Optional[bool] = None, return_chars: bool = False,
                      **options: Any) -> DocumentResult:
        """OCR every page of a PDF (bytes or a path), pages in order; with
        pdf_text_layer=True, a page that has a text layer takes its lines
        from it. Any other OcrOptions field by name, as in `read`."""
        opts = parse_options({"det": det, "cls": cls, "return_chars": return_chars, **options})
        return self._run(self.pipeline.read_document(pdf, opts.with_model((self.config.model,))))

    async def aread_any(self, data: ImageInput, options: OcrOptions = OcrOptions()):
        """An image -> OcrResult, a PDF (by its magic bytes) -> DocumentResult."""
        return await self.pipeline.read_any(data, options.with_model((self.config.model,)))

    def detect(self, image: ImageInput) -> list[list[list[float]]]:
        """Text boxes only (det only), in reading order, original coordinates."""
        cfg = self.config
        img = load_image(image, cfg.limits, cfg.pipeline.exif_transpose)
        work, geometry = prepare_image(img, cfg.pipeline)
        boxes = self.detector.detect([work])[0]
        if len(boxes):
            boxes = boxes[reading_order(boxes)]
        return [round_box(b) for b in boxes_to_original(boxes, geometry)]

    def classify(self, image: ImageInput) -> Direction:
        """Direction of a single text-line image (cls only)."""
        if self.classifier is None:
            raise BadImage("the direction classifier is disabled in this engine's config")
        img = load_image(image, self.config.limits, self.config.pipeline.exif_transpose)
        return self.classifier.classify([img])[0]

    def _run(self, coro: Coroutine[Any, Any, OcrResult]) -> OcrResult:
        """Run a coroutine on the engine's own loop thread (started on first
        use), from any thread, also one that runs an event loop itself."""
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="ocr-engine-loop", daemon=True).start()
                self._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        for p in self._predictors:
            p.close()
        loop, self._loop = getattr(self, "_loop", None), None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    def __enter__(self) -> "OcrEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def default_engine_config(**overrides) -> EngineConfig:
    """In-process defaults: Paddle's bundled OpenVINO engine on every core this
    process may use, threads pinned there (OpenVINO would otherwise bind them
    all to CPU 0)."""
    from serve_app.core.engine_config import PredictorOptions

    cores = sorted(os.sched_getaffinity(0))
    predictor = PredictorOptions(
        cpu_math_library_num_threads=len(cores), enable_openvino_engine=True, cpu_affinity=cores
    )
    return EngineConfig(predictor=predictor).model_copy(update=overrides)


__all__ = ["OcrEngine", "default_engine_config", "EngineConfig", "PipelineOptions", "OcrOptions"]
