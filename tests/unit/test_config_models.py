"""Configuration models and model-file resolution in given directories. The
default model set (read and hashed from the carrier wheel) is checked in
tests/integration/test_default_models.py."""

from __future__ import annotations

import pydantic
import pytest

from serve_app.core.engine_config import (
    DetOptions, EngineConfig, ImageLimits, PredictorOptions, RecOptions, TensorRTOptions,
)
from serve_app.core.errors import ModelError
from serve_app.inference.weights import dictionary_path, model_files

# --- PredictorOptions consistency ------------------------------------------------------


def test_tensorrt_needs_a_gpu():
    with pytest.raises(pydantic.ValidationError, match="tensorrt needs device: gpu"):
        PredictorOptions(device="cpu", tensorrt=TensorRTOptions())
    opts = PredictorOptions(device="gpu", tensorrt=TensorRTOptions())
    assert opts.tensorrt.precision == "fp16"


def test_openvino_is_cpu_only():
    with pytest.raises(pydantic.ValidationError, match="set device: cpu or turn it off"):
        PredictorOptions(device="gpu", enable_openvino_engine=True)
    assert PredictorOptions(device="cpu", enable_openvino_engine=True).enable_openvino_engine


def test_cpu_affinity_must_not_be_empty():
    with pytest.raises(pydantic.ValidationError, match="at least one core"):
        PredictorOptions(cpu_affinity=[])
    assert PredictorOptions(cpu_affinity=[0, 1]).cpu_affinity == [0, 1]


def test_models_refuse_unknown_fields_and_are_frozen():
    with pytest.raises(pydantic.ValidationError, match="unclip_ration"):
        DetOptions(unclip_ration=2.0)
    opts = DetOptions()
    with pytest.raises(pydantic.ValidationError):
        opts.thresh = 0.5
    assert opts.thresh == 0.3


@pytest.mark.parametrize(
    "model, kwargs",
    [
        (DetOptions, {"thresh": 1.0}),
        (DetOptions, {"limit_side_len": 16}),
        (DetOptions, {"limit_type": "mean"}),
        (RecOptions, {"batch_size": 0}),
        (ImageLimits, {"max_pixels": 0}),
        (PredictorOptions, {"device": "tpu"}),
    ],
)
def test_out_of_range_values_are_refused(model, kwargs):
    with pytest.raises(pydantic.ValidationError, match=next(iter(kwargs))):
        model(**kwargs)


def test_engine_config_from_a_nested_dict():
    cfg = EngineConfig.model_validate({"det": {"box_thresh": 0.6}, "limits": {"max_bytes": 1024}})
    assert cfg.det.box_thresh == 0.6
    assert cfg.det.thresh == 0.2  # the default set's own (ppocrv6_small)
    assert cfg.limits.max_bytes == 1024
    with pytest.raises(pydantic.ValidationError, match="tensorrt"):
        EngineConfig.model_validate({"predictor": {"device": "cpu", "tensorrt": {}}})


# --- model_files -----------------------------------------------------------------------------


def test_directory_with_only_params_names_the_directory(tmp_path):
    (tmp_path / "inference.pdiparams").write_bytes(b"\x01" * 16)
    with pytest.raises(ModelError) as err:
        model_files("det", str(tmp_path))
    message = str(err.value)
    assert str(tmp_path) in message
    assert "inference.pdmodel" in message and "inference.json" in message
    assert err.value.status == 500


def test_directory_with_json_and_params_resolves_to_the_json(tmp_path):
    (tmp_path / "inference.json").write_text('{"program": 1}')
    (tmp_path / "inference.pdiparams").write_bytes(b"\x01" * 16)
    files = model_files("rec", str(tmp_path))
    assert files.name == "rec"
    assert files.program == tmp_path / "inference.json"
    assert files.params == tmp_path / "inference.pdiparams"


def test_legacy_pdmodel_is_preferred_over_json(tmp_path):
    for name in ("inference.pdmodel", "inference.json", "inference.pdiparams"):
        (tmp_path / name).write_bytes(b"\x01")
    assert model_files("cls", str(tmp_path)).program == tmp_path / "inference.pdmodel"


def test_directory_with_program_but_no_params(tmp_path):
    (tmp_path / "inference.json").write_text("{}")
    with pytest.raises(ModelError, match="no inference.pdiparams") as err:
        model_files("det", str(tmp_path))
    assert str(tmp_path) in str(err.value)


def test_empty_model_file_is_refused(tmp_path):
    (tmp_path / "inference.json").write_text("{}")
    (tmp_path / "inference.pdiparams").write_bytes(b"")
    with pytest.raises(ModelError, match="is empty") as err:
        model_files("det", str(tmp_path))
    assert str(tmp_path / "inference.pdiparams") in str(err.value)


def test_missing_directory(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelError, match="does not exist") as err:
        model_files("det", str(missing))
    assert str(missing) in str(err.value)


# --- dictionary_path -----------------------------------------------------------------------------


def test_missing_dictionary_is_named(tmp_path):
    missing = tmp_path / "keys.txt"
    with pytest.raises(ModelError, match="does not exist") as err:
        dictionary_path(str(missing))
    assert str(missing) in str(err.value)


def test_existing_dictionary_resolves(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("a\n")
    assert dictionary_path(str(path)) == path


@pytest.mark.parametrize("args", [
    {"recognizer": {"with_pipeline": True}},
    {"recognizer": {"with_pipeline": True}, "detector": {"beside_recognizer": True}},
    {"recognizer": {"with_pipeline": True}, "classifier": {"beside_recognizer": True}},
])
def test_the_pipeline_beside_the_models_needs_every_stage_there(args):
    """recognizer.with_pipeline calls every stage in its own process: a
    stage left in a deployment of its own is refused, naming what to set."""
    from serve_app.core.app_args import AppArgs

    with pytest.raises(pydantic.ValidationError, match="with_pipeline needs detector.beside_recognizer"):
        AppArgs.model_validate(args)


def test_the_pipeline_beside_the_models_with_the_classifier_off_or_beside():
    from serve_app.core.app_args import AppArgs

    beside = {"detector": {"beside_recognizer": True}, "recognizer": {"with_pipeline": True}}
    assert AppArgs.model_validate({**beside, "classifier": {"beside_recognizer": True}}).recognizer.with_pipeline
    assert AppArgs.model_validate({**beside, "engine": {"cls": {"enabled": False}}}).recognizer.with_pipeline
