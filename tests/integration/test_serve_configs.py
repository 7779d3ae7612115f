"""The Serve profiles and the RayService's embedded serveConfigV2 validated
against the installed Ray Serve's schema models (imports ray and the app's
deployments; no cluster is started)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CPU_PROFILE = REPO / "deployments.yaml"
GPU_PROFILE = REPO / "deployments.gpu.yaml"
LIGHT_PROFILE = REPO / "deployments.light.yaml"
RAYSERVICE = REPO / "deploy" / "kuberay" / "rayservice.yaml"


def _load(path: Path) -> Any:
    with path.open() as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def embedded() -> dict:
    return yaml.safe_load(_load(RAYSERVICE)["spec"]["serveConfigV2"])


# --- Serve config validation -------------------------------------------------------------


def _unknown_keys(data: dict, model) -> list[str]:
    """Ray Serve's schema models ignore unknown keys (a misspelt field, or
    `ray_actor_options: {num_gpu: 1}`, validates and is silently dropped), so
    check the keys against the models' fields ourselves."""
    known = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    return sorted(set(data) - known)


def _deployment_names() -> set[str]:
    from serve_app.serving.deployments import (
        DirectionClassifierDeployment, OcrPipeline, TextDetectorDeployment, TextRecognizerDeployment,
    )
    from serve_app.http.ingress import OcrIngress
    from serve_app.jobs.store import JobStore

    # (serve_app.serving.stages_in_one_process's RecognizerWithParts is named TextRecognizer too,
    # its PipelineWithModels OcrPipeline)
    return {d.name for d in (DirectionClassifierDeployment, OcrPipeline, TextDetectorDeployment,
                             TextRecognizerDeployment, OcrIngress, JobStore)}


MODEL_DEPLOYMENTS = {"TextDetector": "det", "DirectionClassifier": "cls", "TextRecognizer": "rec"}


def validate_serve_config(cfg: dict) -> None:
    """What `serve deploy` / KubeRay would refuse, and what Serve would
    silently ignore, checked without a cluster."""
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import (
        DeploymentSchema,
        HTTPOptionsSchema,
        RayActorOptionsSchema,
        ServeApplicationSchema,
        ServeDeploySchema,
    )

    from serve_app.core.app_args import BATCH_DEFAULTS, AppArgs

    ServeDeploySchema.model_validate(cfg)  # the installed ray's schema is pydantic v2
    assert not _unknown_keys(cfg, ServeDeploySchema)
    assert not _unknown_keys(cfg.get("http_options") or {}, HTTPOptionsSchema)
    names = _deployment_names()
    for app in cfg["applications"]:
        assert not _unknown_keys(app, ServeApplicationSchema), app["name"]
        assert app["import_path"] == "serve_app.app:build_app"
        args = AppArgs.model_validate(app.get("args") or {})
        # A further model set has its own detector and recogniser, named TextDetector_{set} / TextRecognizer_{set}.
        built = names | {f"{kind}_{name}" for name in args.models[1:] for kind in ("TextDetector", "TextRecognizer")}
        if not args.recognizer.with_pipeline:  # document structure's own two deployments (app.build_app)
            from serve_app.serving.structure_deployments import LayoutDetectorDeployment, TableRecognizerDeployment

            built |= {LayoutDetectorDeployment.name, TableRecognizerDeployment.name}
        for d in app.get("deployments", []):
            where = f"{app['name']}/{d['name']}"
            assert d["name"] in built, f"{where}: the app builds no deployment of that name"
            assert not _unknown_keys(d, DeploymentSchema), where
            assert not _unknown_keys(d.get("ray_actor_options") or {}, RayActorOptionsSchema), where
            assert not _unknown_keys(d.get("autoscaling_config") or {}, AutoscalingConfig), where
            # The code sets no resources: each deployment's live here.
            assert "num_cpus" in (d.get("ray_actor_options") or {}), f"{where}: give it num_cpus"
            assert "max_ongoing_requests" in d, f"{where}: give it max_ongoing_requests"
            if d["name"].split("_", 1)[0] in MODEL_DEPLOYMENTS:
                stage = MODEL_DEPLOYMENTS[d["name"].split("_", 1)[0]]
                size = BATCH_DEFAULTS[stage].updated(d.get("user_config")).max_batch_size  # only the batch knobs
                # README: max_ongoing_requests caps every batch, so it is set above the batch sizes.
                assert d["max_ongoing_requests"] >= size, where
            if d["name"] == "OcrPipeline" and args.recognizer.with_pipeline:
                # The models are in the pipeline's process; its user_config is the recogniser's.
                size = BATCH_DEFAULTS["rec"].updated(d.get("user_config")).max_batch_size
                assert d["max_ongoing_requests"] >= size, where
                assert not {"TextRecognizer", "TextDetector", "DirectionClassifier"} & {
                    x["name"] for x in app["deployments"]}, f"{where}: with_pipeline builds no model deployment"
            if d["name"] == "OcrIngress":
                # README: above ingress.max_in_flight, so the app's own 503s come first.
                assert d["max_ongoing_requests"] > args.ingress.max_in_flight, where


@pytest.mark.parametrize("path", [CPU_PROFILE, GPU_PROFILE, LIGHT_PROFILE], ids=lambda p: p.name)
def test_profiles_are_valid_serve_configs(path):
    validate_serve_config(_load(path))


def test_unknown_keys_are_caught_where_serve_ignores_them():
    cfg = _load(GPU_PROFILE)
    # Ray 2.60's ServeDeploySchema accepts this misspelling and drops it.
    cfg["applications"][0]["deployments"][0]["ray_actor_options"]["num_gpu"] = 1
    with pytest.raises(AssertionError):
        validate_serve_config(cfg)


def test_embedded_serve_config_is_valid(embedded):
    validate_serve_config(embedded)


def test_deployment_options_have_one_home():
    """Resources, replica counts and max_ongoing_requests are in the Serve
    config files only: the decorators set none (a YAML `ray_actor_options`
    would replace the code's whole dict anyway), except the JobStore's
    single replica, which is a property of the store, not a sizing choice."""
    from serve_app.serving.deployments import (
        DirectionClassifierDeployment, OcrPipeline, TextDetectorDeployment, TextRecognizerDeployment,
    )
    from serve_app.serving.stages_in_one_process import PipelineWithModels, RecognizerWithParts
    from serve_app.http.ingress import OcrIngress
    from serve_app.jobs.store import JobStore

    from serve_app.serving.structure_deployments import LayoutDetectorDeployment, TableRecognizerDeployment

    for d in (DirectionClassifierDeployment, OcrPipeline, TextDetectorDeployment, TextRecognizerDeployment,
              OcrIngress, JobStore, RecognizerWithParts, PipelineWithModels, LayoutDetectorDeployment,
              TableRecognizerDeployment):
        allowed = {"name", "num_replicas"} if d is JobStore else {"name"}
        assert d._deployment_config.user_configured_option_names <= allowed, d.name
    for path in (CPU_PROFILE, GPU_PROFILE, LIGHT_PROFILE):
        for app in _load(path)["applications"]:
            store = [x for x in app["deployments"] if x["name"] == "JobStore"]
            assert store and "num_replicas" not in store[0] and "autoscaling_config" not in store[0], path.name


def test_gpu_profile_app_is_not_built_without_its_token(monkeypatch):
    """#24 item 4: the network profile's builder (what `serve run` and
    KubeRay call) refuses without OCR_AUTH_TOKEN, and builds with it."""
    from serve_app.app import build_app
    from serve_app.core.errors import ConfigError

    args = _load(GPU_PROFILE)["applications"][0]["args"]
    monkeypatch.delenv("OCR_AUTH_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="OCR_AUTH_TOKEN"):
        build_app(args)
    monkeypatch.setenv("OCR_AUTH_TOKEN", "s3cret")
    assert build_app(args) is not None
