"""The application builder: `import_path: serve_app.app:build_app` in the
Serve config. Typed args in, a bound application out.

It runs wherever Serve builds the app (on a cluster: the head, which may have
no GPU and no CPU for replicas), so it checks no device: each replica checks
its own GPU when it builds its predictor (serve_app.predictor.resolve_device)
and fails its own start with a message saying what to do."""

from __future__ import annotations

from typing import Optional

from .config import EngineConfig, PredictorOptions
from .settings import AppArgs, ModelArgs


def with_shape_ranges(stage: str, args: ModelArgs, engine: EngineConfig) -> ModelArgs:
    """A stage's args with TensorRT told every input shape the stage can be
    given (its closed set; serve_app.shape_ranges) and a max batch size equal
    to that set's largest batch. Unchanged without TensorRT."""
    from .shape_ranges import stage_shapes

    opts: PredictorOptions = args.predictor or engine.predictor
    if opts.tensorrt is None:
        return args
    shapes = stage_shapes(stage, engine.det, engine.cls, engine.rec)
    trt = opts.tensorrt.model_copy(update={"input_shapes": shapes, "max_batch_size": max(s[0] for s in shapes)})
    return args.model_copy(update={"predictor": opts.model_copy(update={"tensorrt": trt})})


def build_app(args: Optional[dict] = None):
    from .deployments import (
        DirectionClassifierDeployment,
        OcrPipeline,
        TextDetectorDeployment,
        TextRecognizerDeployment,
    )
    from .ingress import OcrIngress
    from .jobs import JobStore
    from .paddlex import PaddleXDefaults

    a = AppArgs.model_validate(args or {})
    det_args = with_shape_ranges("det", a.detector, a.engine)
    cls_args = with_shape_ranges("cls", a.classifier, a.engine)
    rec_args = with_shape_ranges("rec", a.recognizer, a.engine)
    detector = TextDetectorDeployment.bind(a.engine, det_args, a.lanes)
    classifier = DirectionClassifierDeployment.bind(a.engine, cls_args, a.lanes) if a.engine.cls.enabled else None
    recognizer = TextRecognizerDeployment.bind(a.engine, rec_args, a.lanes)
    pipeline = OcrPipeline.bind(detector, classifier, recognizer, a.engine, a.recognizer, a.lanes)
    jobs = JobStore.bind(pipeline, a.jobs, a.lanes)
    from .result_cache import model_identity

    # One pipeline placement: the OcrPipeline deployment serves sync reads
    # and jobs alike (docs/request-path.md, "Where the pipeline runs").
    return OcrIngress.bind(pipeline, jobs, a.engine.limits, a.ingress, a.engine.documents,
                           PaddleXDefaults.of(a.engine), a.cache, model_identity(a.engine), a.lanes)
