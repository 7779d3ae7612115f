"""The application builder: `import_path: serve_app.app:build_app` in the
Serve config. Typed args in, a bound application out."""

from __future__ import annotations

from typing import Optional

from .settings import AppArgs


def build_app(args: Optional[dict] = None):
    from .deployments import (
        DirectionClassifierDeployment,
        OcrPipeline,
        TextDetectorDeployment,
        TextRecognizerDeployment,
    )
    from .ingress import OcrIngress
    from .jobs import JobStore
    from .predictor import resolve_device

    a = AppArgs.model_validate(args or {})
    # A GPU profile on a CPU-only build is refused here, at deploy time, with
    # the message saying how to proceed (rather than by a replica crash loop).
    for stage in (a.detector, a.classifier, a.recognizer):
        resolve_device(stage.predictor or a.engine.predictor)
    detector = TextDetectorDeployment.bind(a.engine, a.detector)
    classifier = DirectionClassifierDeployment.bind(a.engine, a.classifier) if a.engine.cls.enabled else None
    recognizer = TextRecognizerDeployment.bind(a.engine, a.recognizer)
    pipeline = OcrPipeline.bind(detector, classifier, recognizer, a.engine, a.recognizer)
    jobs = JobStore.bind(pipeline, a.jobs)
    return OcrIngress.bind(pipeline, jobs, a.engine.limits, a.ingress)
