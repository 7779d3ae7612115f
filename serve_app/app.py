"""The application builder: `import_path: serve_app.app:build_app` in the
Serve config. Typed args in, a bound application out.

It runs wherever Serve builds the app (on a cluster: the head, which may have
no GPU and no CPU for replicas), so it checks no device: each replica checks
its own GPU when it builds its predictor (serve_app.inference.predictor.resolve_device)
and fails its own start with a message saying what to do."""

from __future__ import annotations

import hashlib
import os
from typing import Optional

from serve_app.core.engine_config import EngineConfig, PredictorOptions
from serve_app.core.errors import ConfigError
from serve_app.core.app_args import AppArgs, IngressArgs, ModelArgs
from serve_app.core.model_sets import SETS


def check_token_present(ingress: IngressArgs, environ=os.environ) -> None:
    """A profile that names a token variable (the network profiles: GPU,
    Docker image, KubeRay) is not built without it: the builder runs with the
    application's runtime_env and the node's environment, as the ingress
    replicas do, so a missing token is refused here, before any replica
    starts, with what to set."""
    name = ingress.auth_token_env
    if name and not environ.get(name):
        raise ConfigError(
            f"ingress.auth_token_env names {name!r}, but that environment variable is not set (or empty) where "
            f"the app is built: export {name}=\"$(openssl rand -hex 32)\" before `serve run` (docker run -e {name}=...; "
            f"on KubeRay from a Secret, deploy/kuberay), or put it in the application's runtime_env.env_vars; "
            "to serve without authentication on purpose, remove auth_token_env and set allow_anonymous: true")


def with_shape_ranges(stage: str, args: ModelArgs, engine: EngineConfig) -> ModelArgs:
    """A stage's args with TensorRT told every input shape the stage can be
    given (its closed set; serve_app.inference.shape_ranges) and a max batch size equal
    to that set's largest batch. Unchanged without TensorRT."""
    from serve_app.inference.shape_ranges import stage_shapes

    opts: PredictorOptions = args.predictor or engine.predictor
    if opts.tensorrt is None:
        return args
    if stage in ("layout", "table"):  # one input shape each (serve_app.inference.runners), every batch size of it
        from serve_app.structure.layout import INPUT_HW
        from serve_app.structure.table_structure import SIDE

        batch = 1 if stage == "layout" else engine.structure.table_batch_size  # the layout graph takes one page
        h, w = INPUT_HW if stage == "layout" else (SIDE, SIDE)
        shapes = [(n, 3, h, w) for n in range(1, batch + 1)]
    else:
        shapes = stage_shapes(stage, engine.det, engine.cls, engine.rec)
    trt = opts.tensorrt.model_copy(update={"input_shapes": shapes, "max_batch_size": max(s[0] for s in shapes)})
    return args.model_copy(update={"predictor": opts.model_copy(update={"tensorrt": trt})})


# A user's own further set in the per-stage profile: its stages at zero
# replicas until its first request, as deployments.yaml's blocks make the
# built-in further sets (the Serve config has no block for a name it cannot
# know; one written there for TextDetector_{set} / TextRecognizer_{set}
# replaces these).
ON_DEMAND = {
    "TextDetector": {"autoscaling_config": {"min_replicas": 0, "initial_replicas": 0, "max_replicas": 1,
                                            "upscale_delay_s": 0, "downscale_delay_s": 600},
                     "max_ongoing_requests": 64, "ray_actor_options": {"num_cpus": 0.1}},
    "TextRecognizer": {"autoscaling_config": {"min_replicas": 0, "initial_replicas": 0, "max_replicas": 1,
                                              "upscale_delay_s": 0, "downscale_delay_s": 600},
                       "max_ongoing_requests": 32, "ray_actor_options": {"num_cpus": 0.1}},
}


def build_app(args: Optional[dict] = None):
    from serve_app.serving.deployments import (
        DirectionClassifierDeployment, OcrPipeline, TextDetectorDeployment, TextRecognizerDeployment,
    )
    from serve_app.http.ingress import OcrIngress
    from serve_app.jobs.store import JobStore
    from serve_app.http.paddlex import PaddleXDefaults

    a = AppArgs.model_validate(args or {})
    check_token_present(a.ingress)
    if a.own_models:  # a user's own sets: each recogniser against its dictionary, one blank inference each
        from serve_app.serving.set_check import check_own_sets

        check_own_sets(a)
    engines = a.engines()  # each served model set's config, the default first
    engine = engines[a.models[0]]
    det_args = with_shape_ranges("det", a.detector, engine)
    cls_args = with_shape_ranges("cls", a.classifier, engine)
    rec_args = with_shape_ranges("rec", a.recognizer, engine)
    cls_beside = engine.cls.enabled and a.classifier.beside_recognizer
    if a.recognizer.with_pipeline:  # the pipeline and the models in one process (AppArgs checked the rest)
        from serve_app.serving.stages_in_one_process import PipelineWithModels

        pipeline = PipelineWithModels.bind(engine, rec_args, cls_args if cls_beside else None, det_args, a.lanes,
                                           engines, a.set_loading, with_shape_ranges("layout", a.layout, engine),
                                           with_shape_ranges("table", a.table, engine))
    else:
        def stage_deployments(eng: EngineConfig, with_cls: bool, suffix: str = "", options: Optional[dict] = None):
            """(detector, recogniser, classifier) of one model set; a further
            set's deployments are named with `_{set}` (their own block in
            the Serve config; `options`: per deployment, what an own set's
            get) and share the default set's classifier."""
            options = options or {}
            named = (lambda d, name: d.options(name=f"{name}{suffix}", **options.get(name, {}))) if suffix else (
                lambda d, name: d)
            # TensorRT's shape ranges from this set's own closed input shapes (its ladders).
            det_args = with_shape_ranges("det", a.detector, eng)
            rec_args = with_shape_ranges("rec", a.recognizer, eng)
            cls_here = with_cls and cls_beside
            if cls_here or a.detector.beside_recognizer:  # the models in one process
                from serve_app.serving.stages_in_one_process import RecognizerWithParts

                rec = named(RecognizerWithParts, "TextRecognizer").bind(
                    eng, rec_args, cls_args if cls_here else None,
                    det_args if a.detector.beside_recognizer else None, a.lanes)
            else:
                rec = named(TextRecognizerDeployment, "TextRecognizer").bind(eng, rec_args, a.lanes)
            det = rec if a.detector.beside_recognizer else named(TextDetectorDeployment, "TextDetector").bind(
                eng, det_args, a.lanes)
            cls = None
            if with_cls and eng.cls.enabled:
                cls = rec if cls_beside else DirectionClassifierDeployment.bind(eng, cls_args, a.lanes)
            return det, rec, cls

        detector, recognizer, classifier = stage_deployments(engine, True)
        others = {}
        for name in a.models[1:]:
            det, rec, _ = stage_deployments(engines[name], False, f"_{name}", ON_DEMAND if name not in SETS else {})
            others[name] = (det, rec, engines[name])
        # Document structure: its own two deployments, at zero replicas until a request asks (the Serve config's
        # autoscaling min_replicas 0; serve_app/serving/structure_deployments.py).
        from serve_app.serving.structure_deployments import LayoutDetectorDeployment, TableRecognizerDeployment

        structure = (LayoutDetectorDeployment.bind(engine, with_shape_ranges("layout", a.layout, engine), a.lanes),
                     TableRecognizerDeployment.bind(engine, with_shape_ranges("table", a.table, engine), a.lanes))
        pipeline = OcrPipeline.bind(detector, classifier, recognizer, engine, a.recognizer, a.lanes, others,
                                    a.set_loading, structure)
    jobs = JobStore.bind(pipeline, a.jobs, a.lanes)
    from serve_app.http.policies.result_cache import model_identity
    from serve_app.core.own_sets import described

    # One pipeline placement: the OcrPipeline deployment serves sync reads
    # and jobs alike (docs/architecture.md, "Deployments").
    # The result cache's and in-flight table's model identity: every served
    # set's (weights and settings); a request's own set is in its options.
    identity = model_identity(engine) if len(engines) == 1 else hashlib.sha256(
        "".join(f"{name}:{model_identity(e)};" for name, e in engines.items()).encode()).hexdigest()
    return OcrIngress.bind(pipeline, jobs, engine.limits, a.ingress, engine.documents,
                           PaddleXDefaults.of(engine), a.cache, identity, a.lanes, described(a.models, a.own_models))
