"""Named model sets at the config edge: each set's own detector values, the
default set's config left exactly as it was, served sets validated, and a
request's model checked against what is served (400 listing it) and part of
every key. No Ray, no models."""

from __future__ import annotations

import pytest

from serve_app.core.app_args import AppArgs
from serve_app.core.engine_config import DetOptions, EngineConfig, PredictorOptions, for_model, reference_config
from serve_app.core.errors import BadRequest, ConfigError
from serve_app.core.model_sets import DEFAULT_MODEL, SETS, model_set, resolve_model
from serve_app.core.request_options import parse_options
from serve_app.flow.upload import content_key

pytestmark = pytest.mark.unit


def test_the_default_set_is_v6_small_and_v4_keeps_its_own_values():
    base = EngineConfig()
    assert base.model == DEFAULT_MODEL == "ppocrv6_small"
    assert for_model(base, DEFAULT_MODEL) is base
    assert (base.det.thresh, base.det.box_thresh, base.det.unclip_ratio) == (0.2, 0.3, 1.4)
    assert base.predictor.enable_memory_optim is False  # the converted files cannot take the pass
    # v4's detector values as they were before sets existed (RapidOCR 1.4's), none of small's carried over
    v4 = for_model(base, "ppocrv4_mobile")
    assert (v4.det.thresh, v4.det.box_thresh, v4.det.unclip_ratio, v4.det.max_candidates) == (0.3, 0.5, 1.6, 1000)
    assert v4.det.mean == (0.5, 0.5, 0.5) and v4.det.std == (0.5, 0.5, 0.5) and v4.predictor.enable_memory_optim
    assert v4.det == EngineConfig(model="ppocrv4_mobile").det
    # back from another set, every value is the default's again
    assert for_model(v4, DEFAULT_MODEL).det == base.det


@pytest.mark.parametrize("name,box_thresh", [("ppocrv6_small", 0.3), ("ppocrv6_tiny", 0.4)])
def test_v6_sets_take_their_inference_yml_values(name, box_thresh):
    det = for_model(EngineConfig(), name).det
    assert (det.thresh, det.box_thresh, det.unclip_ratio, det.max_candidates) == (0.2, box_thresh, 1.4, 3000)
    assert det.mean == (0.485, 0.456, 0.406) and det.std == (0.229, 0.224, 0.225)
    assert det.limit_type == "ladder"  # the closed input shapes, as for v4
    rec = for_model(EngineConfig(), name).rec
    assert (rec.image_height, rec.image_width, rec.use_space_char) == (48, 320, True)


def test_values_the_config_names_win_over_the_sets():
    cfg = EngineConfig(det=DetOptions(box_thresh=0.7), predictor=PredictorOptions(cpu_math_library_num_threads=2))
    tiny = for_model(cfg, "ppocrv6_tiny")
    assert tiny.det.box_thresh == 0.7 and tiny.det.thresh == 0.2
    # the predictor as configured, but without the memory_optimize pass the converted v6 files cannot take
    assert tiny.predictor == cfg.predictor.model_copy(update={"enable_memory_optim": False})
    named = EngineConfig(predictor=PredictorOptions(enable_memory_optim=True))
    assert for_model(named, "ppocrv6_tiny").predictor.enable_memory_optim is True  # named: it wins
    # small -> tiny: small's own box_thresh is not carried over as if the user had set it
    assert for_model(for_model(EngineConfig(), "ppocrv6_small"), "ppocrv6_tiny").det.box_thresh == 0.4
    # the reference mode keeps its sizing (736, "min") under any set
    ref = for_model(reference_config(), "ppocrv6_small")
    assert (ref.det.limit_type, ref.det.limit_side_len, ref.det.box_thresh) == ("min", 736, 0.3)


def test_unknown_sets_are_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match="known sets: ppocrv4_mobile, ppocrv6_small, ppocrv6_tiny"):
        model_set("ppocrv5_mobile")
    with pytest.raises(ValueError, match="unknown model set 'v7'"):
        EngineConfig(model="v7")


def test_an_application_names_its_served_sets():
    a = AppArgs(models=["ppocrv4_mobile", "ppocrv6_small"], engine={"model": "ppocrv4_mobile"})
    engines = a.engines()
    assert list(engines) == ["ppocrv4_mobile", "ppocrv6_small"]
    assert engines["ppocrv4_mobile"] is a.engine
    assert engines["ppocrv6_small"].det.box_thresh == 0.3
    assert AppArgs().models == ["ppocrv6_small"]
    for bad, says in (([], "at least one"), (["nope"], "unknown model set"), (["ppocrv6_tiny"] * 2, "twice")):
        with pytest.raises(ValueError, match=says):
            AppArgs(models=bad)


def test_a_requests_model_is_checked_against_what_is_served():
    served = ("ppocrv4_mobile", "ppocrv6_small")
    assert parse_options({}).with_model(served).model == "ppocrv4_mobile"
    assert parse_options({"model": "ppocrv6_small"}).with_model(served).model == "ppocrv6_small"
    with pytest.raises(BadRequest) as e:
        parse_options({"model": "ppocrv6_tiny"}).with_model(served)
    assert e.value.status == 400
    assert "'ppocrv6_tiny' is not served here; served: ppocrv4_mobile, ppocrv6_small" in e.value.message
    with pytest.raises(BadRequest, match="is not a model set; served: ppocrv4_mobile, ppocrv6_small"):
        resolve_model("gpt", served)
    # a long name is refused at parsing, not echoed back
    with pytest.raises(BadRequest, match="at most 64 characters"):
        parse_options({"model": "x" * 10_000})


def test_the_model_is_part_of_the_result_and_dedup_key():
    image = b"\x89PNG same bytes"
    keys = {content_key(image, parse_options({"model": m}).key_dict(), "identity") for m in SETS}
    assert len(keys) == len(SETS)
    # the lane still is not
    assert content_key(image, parse_options({"model": "ppocrv6_tiny", "priority": "bulk"}).key_dict(), "i") == \
        content_key(image, parse_options({"model": "ppocrv6_tiny"}).key_dict(), "i")


def test_models_lists_dictionary_languages_and_cost():
    row = SETS["ppocrv6_small"].describe()
    assert row["dictionary"] == {"file": "ppocrv6_dict.txt", "classes": 18708}
    assert {"de", "fr", "es", "pl", "zh", "en"} <= set(row["languages"])
    assert set(row["cost"]) == {"det_gflop_960", "rec_gflop_crop", "relative"}
    assert SETS["ppocrv4_mobile"].describe(default=True)["default"] is True


# The official TensorRT dynamic shapes (min, opt, max NCHW) of the v6 files' inference.yml
# (Hpi.backend_configs.tensorrt.dynamic_shapes; det and rec of both tiers alike). Not the service's:
# a GPU replica takes its ranges from its own closed input shapes (serve_app/inference/shape_ranges.py).
_V6_TRT = {"det": ((1, 3, 32, 32), (1, 3, 736, 736), (1, 3, 4000, 4000)),
           "rec": ((1, 3, 48, 160), (1, 3, 48, 320), (8, 3, 48, 3200))}
OFFICIAL_TRT_SHAPES = {"ppocrv6_small": _V6_TRT, "ppocrv6_tiny": _V6_TRT}


def test_the_cost_figures_models_readme_quotes_are_the_sets_own():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "models" / "README.md").read_text()
    quoted = re.search(r"v4 ([\d.]+), small ([\d.]+), tiny ([\d.]+)", " ".join(text.split()))
    assert quoted, "models/README.md quotes each set's cost.relative"
    assert tuple(map(float, quoted.groups())) == tuple(
        SETS[n].cost.relative for n in ("ppocrv4_mobile", "ppocrv6_small", "ppocrv6_tiny"))


def test_each_sets_tensorrt_ranges_in_the_gpu_profile_come_from_its_closed_shapes_within_the_official_ones():
    """Read, not run (no GPU here): the GPU profile serving every set gives
    each set's detector and recogniser TensorRT the closed set of shapes it
    warms; their heights and widths lie within the official ranges of the v6
    files' inference.yml (the batch dimension is the profile's own)."""
    from pathlib import Path

    import yaml

    from serve_app.app import with_shape_ranges

    root = Path(__file__).resolve().parents[2]
    args = yaml.safe_load((root / "deployments.gpu.yaml").read_text())["applications"][0]["args"]
    a = AppArgs(**{**args, "models": list(SETS)})
    for name, engine in a.engines().items():
        for stage, stage_args in (("det", a.detector), ("rec", a.recognizer)):
            trt = with_shape_ranges(stage, stage_args, engine).predictor.tensorrt
            assert trt.input_shapes and trt.max_batch_size == max(s[0] for s in trt.input_shapes)
            official = OFFICIAL_TRT_SHAPES.get(name)
            if official is None:
                continue
            lo, _, hi = official[stage]
            for shape in trt.input_shapes:
                assert all(lo[i] <= shape[i] <= hi[i] for i in (1, 2, 3)), (name, stage, shape)


def test_what_names_the_product_says_its_default_set_not_v4():
    """The package's docstring, pyproject's description, the page's brand line and the OCRmyPDF
    plugin's docstring and option group: the service reads with PP-OCRv6 small by default."""
    import tomllib
    from pathlib import Path

    import serve_app

    root = Path(__file__).resolve().parents[2]
    page = (root / "serve_app" / "http" / "static" / "index.html").read_text()
    plugin = (root / "serve_app" / "integrations" / "ocrmypdf_plugin.py").read_text()
    named = {"serve_app": serve_app.__doc__.splitlines()[0],
             "pyproject": tomllib.loads((root / "pyproject.toml").read_text())["project"]["description"],
             "page": page[page.index('class="brand"'):page.index("</div></div>", page.index('class="brand"'))],
             "plugin": plugin[:plugin.index('"""', 3)] + plugin[plugin.index("add_argument_group"):][:120]}
    assert {k: v for k, v in named.items() if "v4" in v} == {}
    assert "PP-OCRv6" in named["serve_app"] and "PP-OCRv6" in named["page"]
