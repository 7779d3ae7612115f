"""One home per configuration value: a stage's predictor settings overlay the
engine's, the Serve configs hold only what differs from the code's defaults,
and docs/configuration.md is what the models say (regenerate it with
`python -m serve_app.tools.config_doc`)."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import yaml

from serve_app.app import with_shape_ranges
from serve_app.core.engine_config import EngineConfig, PredictorOptions, TensorRTOptions
from serve_app.core.app_args import AppArgs, DetectorArgs
from serve_app.tools import config_doc

REPO = Path(__file__).resolve().parents[2]
PROFILES = ("deployments.yaml", "deployments.gpu.yaml", "deployments.light.yaml", "deployments.redis.yaml")


def _args(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())["applications"][0]["args"]


# --- the overlay -----------------------------------------------------------------------


def test_a_stage_predictor_overlays_the_engine_predictor():
    a = AppArgs.model_validate({
        "engine": {"predictor": {"device": "gpu", "gpu_mem_mb": 1000, "gpu_device_id": 1}},
        "detector": {"predictor": {"tensorrt": {"min_subgraph_size": 15}}},
        "recognizer": {"predictor": {"gpu_mem_mb": 2000}},
    })
    det = a.detector.predictor
    assert (det.device, det.gpu_mem_mb, det.gpu_device_id) == ("gpu", 1000, 1)
    assert det.tensorrt == TensorRTOptions(min_subgraph_size=15)
    rec = a.recognizer.predictor
    assert (rec.device, rec.gpu_mem_mb, rec.gpu_device_id, rec.tensorrt) == ("gpu", 2000, 1, None)
    assert a.classifier.predictor is None  # none given: the engine's, as before
    assert with_shape_ranges("cls", a.classifier, a.engine).predictor is None


def test_nested_tensorrt_settings_overlay_key_by_key():
    a = AppArgs.model_validate({
        "engine": {"predictor": {"device": "gpu", "tensorrt": {"precision": "fp32", "workspace_size": 1024}}},
        "detector": {"predictor": {"tensorrt": {"min_subgraph_size": 15}}},
        "recognizer": {"predictor": {"tensorrt": None}},
    })
    assert a.detector.predictor.tensorrt == TensorRTOptions(precision="fp32", workspace_size=1024, min_subgraph_size=15)
    assert a.recognizer.predictor.tensorrt is None  # null in the stage wins


def test_the_overlay_is_validated_whole_and_errors_name_the_stage():
    # A stage's tensorrt over a CPU engine is refused with the rule's own message.
    with pytest.raises(pydantic.ValidationError, match="detector.predictor") as e:
        AppArgs.model_validate({"detector": {"predictor": {"tensorrt": {}}}})
    assert "tensorrt needs device: gpu" in str(e.value)
    # A stage may also switch its own device (here back to the CPU, without TensorRT).
    a = AppArgs.model_validate({"engine": {"predictor": {"device": "gpu"}},
                                "classifier": {"predictor": {"device": "cpu", "cpu_math_library_num_threads": 2}}})
    assert (a.classifier.predictor.device, a.classifier.predictor.cpu_math_library_num_threads) == ("cpu", 2)
    with pytest.raises(pydantic.ValidationError, match="detector.predictor.nope"):
        AppArgs.model_validate({"detector": {"predictor": {"nope": 1}}})


def test_the_overlay_takes_the_args_default_engine_when_none_is_given():
    # No `engine:` block: AppArgs' default engine (OpenVINO on) is what the stage overlays.
    a = AppArgs.model_validate({"recognizer": {"predictor": {"cpu_math_library_num_threads": 2}}})
    assert a.recognizer.predictor.enable_openvino_engine is True
    assert a.recognizer.predictor.cpu_math_library_num_threads == 2


def test_models_built_in_python_overlay_too():
    engine = EngineConfig(predictor=PredictorOptions(device="gpu", gpu_mem_mb=900))
    a = AppArgs(engine=engine, detector=DetectorArgs(predictor=PredictorOptions(device="gpu", gpu_device_id=2)))
    assert (a.detector.predictor.gpu_mem_mb, a.detector.predictor.gpu_device_id) == (900, 2)


def test_the_gpu_profile_says_device_gpu_once():
    text = (REPO / "deployments.gpu.yaml").read_text()
    assert [line.strip() for line in text.splitlines() if line.strip().startswith("device:")] == ["device: gpu"]
    a = AppArgs.model_validate(_args("deployments.gpu.yaml"))
    # fp16 only where an agreement check against fp32 runs at start (the recogniser's): the detector is fp32
    for stage, precision in (("detector", "fp32"), ("recognizer", "fp16")):
        opts = getattr(a, stage).predictor
        assert (opts.device, opts.gpu_mem_mb, opts.tensorrt.precision, opts.tensorrt.use_static) == \
            ("gpu", 1000, precision, True)
    assert (a.detector.predictor.tensorrt.min_subgraph_size, a.recognizer.predictor.tensorrt.min_subgraph_size) == (15, 5)


# --- no restated defaults ----------------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_serve_configs_hold_only_what_differs_from_the_code(name):
    found = config_doc.restated(_args(name))
    assert not found, (f"{name} restates what the code already says (remove these, or change the default "
                       f"in serve_app/core/engine_config.py or settings.py): {found}; "
                       f"list them with: python -m serve_app.tools.config_doc --restated {name}")


def _deployments(name: str) -> list[dict]:
    return yaml.safe_load((REPO / name).read_text())["applications"][0]["deployments"]


@pytest.mark.parametrize("name", PROFILES)
def test_serve_configs_batch_knobs_hold_only_what_differs_from_the_code(name):
    found = config_doc.restated_batch(_deployments(name))
    assert not found, (f"{name}'s user_config restates the code's batch defaults (BATCH_DEFAULTS in "
                       f"serve_app/core/app_args.py): {found}")


def test_restated_batch_finds_a_default_and_keeps_what_differs():
    deployments = [
        {"name": "TextDetector", "user_config": {"max_batch_size": 4, "batch_wait_timeout_s": 0.01}},
        {"name": "TextRecognizer_ppocrv6_small", "user_config": {"max_batch_size": 24}},
        {"name": "DirectionClassifier", "user_config": {}},
        # The pipeline's knobs are the recogniser's and the classifier's: a value is restated only when both have it.
        {"name": "OcrPipeline", "user_config": {"max_batch_size": 24, "batch_wait_timeout_s": 0.0}},
        {"name": "OcrIngress", "max_ongoing_requests": 8},
    ]
    assert config_doc.restated_batch(deployments) == [
        "TextDetector.user_config.max_batch_size", "TextRecognizer_ppocrv6_small.user_config.max_batch_size",
        "OcrPipeline.user_config.max_batch_size", "OcrPipeline.user_config.batch_wait_timeout_s"]


@pytest.mark.parametrize("name, knobs", [
    ("deployments.yaml", {"det": (4, 0.0), "cls": (24, 0.0), "rec": (24, 0.0)}),
    ("deployments.redis.yaml", {"det": (4, 0.0), "cls": (24, 0.0), "rec": (24, 0.0)}),
    ("deployments.light.yaml", {"cls": (24, 0.0), "rec": (24, 0.0)}),  # the OcrPipeline block's
    ("deployments.gpu.yaml", {"det": (8, 0.01), "cls": (64, 0.005), "rec": (64, 0.01)}),
])
def test_the_profiles_keep_their_batch_knobs(name, knobs):
    """What the trimmed user_config blocks leave to the code is what they used to write."""
    seen = {}
    with_pipeline = AppArgs.model_validate(_args(name)).recognizer.with_pipeline
    for d in _deployments(name):
        for stage, k in config_doc.batch_knobs(d, with_pipeline).items():
            seen.setdefault(stage, set()).add((k.max_batch_size, k.batch_wait_timeout_s))
    assert seen == {stage: {pair} for stage, pair in knobs.items()}


@pytest.mark.parametrize("name", PROFILES)
def test_every_model_process_gets_one_malloc_arena_from_its_environment(name):
    """The arena limit's one home is the model processes' runtime_env (glibc
    reads it at the first allocation); the args have no such setting."""
    with_pipeline = AppArgs.model_validate(_args(name)).recognizer.with_pipeline
    models = [d for d in _deployments(name) if config_doc.batch_knobs(d, with_pipeline)]
    assert models
    for d in models:
        env = d["ray_actor_options"].get("runtime_env", {}).get("env_vars", {})
        assert env.get("MALLOC_ARENA_MAX") == "1", d["name"]
    with pytest.raises(pydantic.ValidationError, match="MALLOC_ARENA_MAX"):
        AppArgs.model_validate({**_args(name), "recognizer": {"malloc_arena_max": 1}})


def test_restated_finds_a_default_and_a_value_the_overlay_already_gives():
    args = {"engine": {"predictor": {"device": "gpu"}, "limits": {"max_crops": 1000, "max_pixels": 5}},
            "detector": {"predictor": {"device": "gpu", "gpu_mem_mb": 700}}, "jobs": {"ttl_s": 3600}}
    assert config_doc.restated(args) == ["engine.limits.max_crops", "detector.predictor.device", "jobs.ttl_s"]


def test_the_cpu_profile_keeps_its_effective_settings():
    """What the trimmed deployments.yaml leaves to the code is what it used to write."""
    a = AppArgs.model_validate(_args("deployments.yaml"))
    assert a.engine.predictor.enable_openvino_engine and a.engine.predictor.cpu_math_library_num_threads == 1
    assert a.engine.predictor.cache_dir == "/tmp/ocr-serve-{uid}/cache"
    assert (a.engine.limits.max_bytes, a.engine.limits.max_pixels, a.engine.limits.max_crops) == (20 << 20, 40_000_000, 1000)
    d = a.engine.documents
    assert (d.max_pages, d.render_dpi, d.max_page_pixels, d.page_concurrency) == (500, 144, 16_000_000, 4)
    assert (a.detector.cpu_cores, a.detector.threads, a.classifier.cpu_cores, a.classifier.threads) == ([0, 1], 2, [0], 1)
    assert (a.recognizer.cpu_cores, a.recognizer.threads, a.recognizer.fan_out, a.recognizer.fan_out_min_items) == \
        ([1, 0], 1, 2, 4)
    i = a.ingress
    assert (i.max_in_flight, i.default_timeout_s, i.max_batch_items, i.batch_concurrency) == (32, 120, 32, 4)
    ad = i.admission
    assert (ad.enabled, ad.max_queued_cost_s, ad.deadline_share, ad.drain_window_s) == (True, 60, 0.8, 10)
    assert (a.cache.max_bytes, a.cache.ttl_s, a.cache.share_in_flight) == (64 << 20, 300, True)
    assert (a.jobs.ttl_s, a.jobs.capacity, a.jobs.concurrency) == (3600, 1000, 8)
    assert a.jobs.journal == "/tmp/ocr-serve-{uid}/{app}/jobs.sqlite"
    ln = a.lanes
    assert (ln.enabled, ln.bulk_max_wait_s, ln.bulk_fill, ln.bulk_depth, ln.det_bulk_batch, ln.bulk_in_stages,
            ln.bulk_max_in_flight) == (True, 5, False, 1, 1, 1, 16)


# --- the generated reference -------------------------------------------------------------


def test_configuration_doc_is_current():
    doc = config_doc.DOC.read_text()
    assert doc == config_doc.rewrite(doc, config_doc.render()), (
        "docs/configuration.md is stale (a setting was added or changed): regenerate it with "
        "`python -m serve_app.tools.config_doc` (or `make config-doc`) and commit it")


def test_configuration_doc_lists_every_setting_with_a_meaning():
    generated = config_doc.render()
    rows = [r for r in generated.splitlines() if r.startswith("| `")]
    for path, cls in config_doc._sections(AppArgs):
        for name in cls.model_fields:
            assert any(r.startswith(f"| `{name}` |") for r in rows), f"{path}{name} missing"
    blank = [r.split("|")[1].strip() for r in rows if r.rstrip().endswith("|  |")]
    assert not blank, f"settings without a meaning (add Field(description=...)): {blank}"
    # Ranges and defaults come from the models themselves.
    assert "| `render_dpi` | int | `144` | >= 36, <= 1200 |" in generated
    assert "| `precision` | `fp32` \\| `fp16` \\| `int8` | `fp16` |" in generated
    assert "| `engine` | EngineConfig | as its section: but `predictor.enable_openvino_engine: true` |" in generated


CONFIG_MODULES = ("serve_app.core.app_args", "serve_app.core.job_args", "serve_app.core.engine_config",
                  "serve_app.core.predictor_options")


def _config_models() -> set[type]:
    """Every pydantic model defined in the config modules, and every model
    reachable from AppArgs' sections."""
    import importlib
    import inspect

    found = {cls for _, cls in config_doc._sections(AppArgs)}
    for name in CONFIG_MODULES:
        module = importlib.import_module(name)
        found |= {cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if issubclass(cls, pydantic.BaseModel) and cls.__module__ == name}
    return found


def test_every_setting_has_its_meaning_in_its_model():
    models = _config_models()
    assert {"AppArgs", "BatchKnobs", "JobArgs", "LaneArgs", "EngineConfig", "PredictorOptions",
            "TensorRTOptions", "DocumentLimits"} <= {m.__name__ for m in models}
    missing = [f"{m.__name__}.{name}" for m in models for name, info in m.model_fields.items()
               if not (info.description or "").strip()]
    assert not missing, f"settings without Field(description=...): {sorted(missing)}"


def test_the_reference_shows_each_models_description():
    from serve_app.core.app_args import BatchKnobs, IngressArgs
    from serve_app.core.engine_config import DetOptions

    rows = config_doc.render().splitlines()
    for name, model in (("max_in_flight", IngressArgs), ("limit_side_len", DetOptions),
                        ("batch_wait_timeout_s", BatchKnobs)):
        row = next(r for r in rows if r.startswith(f"| `{name}` |"))
        assert row.endswith(f"| {model.model_fields[name].description} |"), row
