"""A user's own model sets (serve_app/core/own_sets.py): declared in the
application's args, catalogued, their engine config built from the
declaration, and every broken declaration that can be seen without Paddle
refused when the application's args are read, naming the file and the
problem. (The recogniser-against-dictionary and blank-inference checks run
Paddle: tests/integration/test_own_sets_check.py.)"""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from serve_app.core.app_args import AppArgs
from serve_app.core.engine_config import EngineConfig

pytestmark = pytest.mark.unit


def folder(root, name: str, program: bytes = b"prog", params: bytes = b"params"):
    d = root / name
    d.mkdir()
    (d / "inference.pdmodel").write_bytes(program)
    (d / "inference.pdiparams").write_bytes(params)
    return d


@pytest.fixture
def declared(tmp_path):
    det, rec = folder(tmp_path, "det"), folder(tmp_path, "rec")
    words = tmp_path / "dict.txt"
    words.write_text("a\nb\nc\n", encoding="utf-8")
    return {"name": "invoices_v2", "title": "Invoices (fine-tuned)", "det_model": str(det), "rec_model": str(rec),
            "rec_dict": str(words), "languages": ["de"], "det": {"box_thresh": 0.55}, "rec": {"use_space_char": False}}


def test_an_own_set_is_catalogued_after_the_listed_ones_with_its_own_values(declared):
    a = AppArgs.model_validate({"own_models": [declared]})
    assert a.models == ["ppocrv6_small", "invoices_v2"]
    mine = a.engines()["invoices_v2"]
    assert (mine.model, mine.det_model, mine.rec_model, mine.rec_dict) == (
        "invoices_v2", declared["det_model"], declared["rec_model"], declared["rec_dict"])
    assert mine.det.box_thresh == 0.55 and mine.rec.use_space_char is False
    # small's own detector values are not carried over as if the user had set them
    assert mine.det.thresh == EngineConfig(model="ppocrv4_mobile").det.thresh
    assert a.engines()["ppocrv6_small"] is a.engine
    # listed explicitly (here first: the default), it is not added twice
    b = AppArgs.model_validate({"models": ["invoices_v2", "ppocrv4_mobile"], "own_models": [declared]})
    assert b.models == ["invoices_v2", "ppocrv4_mobile"]


def test_get_v1_models_describes_it(declared):
    from serve_app.core.own_sets import described

    a = AppArgs.model_validate({"own_models": [declared]})
    small, mine = described(a.models, a.own_models)
    assert small["name"] == "ppocrv6_small" and small["default"] is True and small["own"] is False
    assert mine["name"] == "invoices_v2" and mine["own"] is True and mine["default"] is False
    assert mine["title"] == "Invoices (fine-tuned)" and mine["languages"] == ["de"]
    assert mine["dictionary"] == {"file": "dict.txt", "classes": 3}
    # its folders by their names: the server's paths are not shown to a client
    assert mine["models"] == {"det": "det", "cls": "ch_ppocr_mobile_v2.0_cls_infer", "rec": "rec"}
    assert str(Path(declared["det_model"]).parent) not in repr(mine)


def test_an_own_set_gives_its_predictor_options_and_the_default_sets_are_not_carried_over(declared):
    """The v6 family's files need enable_memory_optim false; an own set exported the same way says so
    in its declaration. Without it, the default set's (ppocrv6_small's) own predictor options are not
    laid on it as if the user had set them."""
    plain = AppArgs.model_validate({"own_models": [declared]}).engines()["invoices_v2"]
    assert plain.predictor.enable_memory_optim is True
    mine = AppArgs.model_validate({"own_models": [{**declared, "predictor": {"enable_memory_optim": False}}]})
    assert mine.engines()["invoices_v2"].predictor.enable_memory_optim is False
    assert mine.engines()["ppocrv6_small"].predictor.enable_memory_optim is False  # small's own, as before


@pytest.mark.parametrize("breakage,says", [
    (lambda d, tmp: d.update(det_model=str(tmp / "nowhere")), "det_model .*nowhere is not a folder"),
    (lambda d, tmp: (tmp / "rec" / "inference.pdmodel").unlink(), "rec_model .*rec holds neither inference.pdmodel"),
    (lambda d, tmp: (tmp / "rec" / "inference.pdiparams").unlink(), r"rec/inference.pdiparams is missing"),
    (lambda d, tmp: (tmp / "det" / "inference.pdiparams").write_bytes(b""), r"det/inference.pdiparams is empty"),
    (lambda d, tmp: d.update(rec_dict=str(tmp / "missing.txt")), "rec_dict .*missing.txt is not a file"),
    (lambda d, tmp: (tmp / "dict.txt").write_bytes(b""), "rec_dict .*dict.txt is empty"),
    (lambda d, tmp: (tmp / "dict.txt").write_bytes(b"\xff\xfe\x00a"), "rec_dict .*dict.txt is not UTF-8"),
    (lambda d, tmp: d.update(cls_model=str(tmp / "det")), "cls_model .*cannot bring its own direction classifier"),
    (lambda d, tmp: (tmp / "dict.txt").write_text("x\n" * 50_001), r"rec_dict .*dict.txt has 50001 lines, more than 50000"),
    (lambda d, tmp: (tmp / "dict.txt").write_bytes(b"x" * (1 << 20) + b"\n"), r"rec_dict .*dict.txt has 1048577 bytes"),
    (lambda d, tmp: d.update(rec={"image_height": 100_000}), r"rec.image_height\s+Input should be less than or equal to 128"),
    (lambda d, tmp: d.update(rec={"image_width": 1 << 20}), r"rec.image_width\s+Input should be less than or equal to 4096"),
    (lambda d, tmp: d.update(predictor={"enable_memory_optimisation": False}), r"predictor.enable_memory_optimisation"),
    (lambda d, tmp: d.update(name="ppocrv4_mobile"), "is a built-in set's"),
    (lambda d, tmp: d.update(name="../etc"), "String should match pattern"),
    (lambda d, tmp: d.update(det={"thresh": 7}), r"det.thresh\s+Input should be less than 1"),
    (lambda d, tmp: d.update(shape=[1, 2]), "Extra inputs are not permitted"),
])
def test_each_broken_declaration_is_refused_naming_the_file_and_the_problem(declared, tmp_path, breakage, says):
    breakage(declared, tmp_path)
    with pytest.raises((pydantic.ValidationError, ValueError), match=says) as e:
        AppArgs.model_validate({"own_models": [declared]}).engines()
    if declared["name"] == "invoices_v2" and " is " in says:  # a file's problem: the set is named too
        assert "own model set 'invoices_v2'" in str(e.value)


def test_a_name_declared_twice_or_listed_but_not_declared_is_refused(declared):
    with pytest.raises(pydantic.ValidationError, match="declares a name twice"):
        AppArgs.model_validate({"own_models": [declared, declared]})
    with pytest.raises(pydantic.ValidationError, match="unknown model set.*'mine'.*declared under own_models"):
        AppArgs.model_validate({"models": ["ppocrv6_small", "mine"]})


def test_the_readme_and_configuration_md_declare_a_complete_own_set_that_loads(tmp_path, monkeypatch):
    """docs/configuration.md shows serve_app.core.own_sets.OWN_MODELS_EXAMPLE, README.md one in short;
    each names every field a declaration may give (cls_model, refused, only in a comment) and is read
    as an application's args with its files in place (the Paddle check of the example:
    tests/integration/test_own_sets_check.py)."""
    import yaml

    from harness.readme_blocks import blocks
    from serve_app.core.own_sets import OWN_MODELS_EXAMPLE, OwnModelSet

    repo = Path(__file__).resolve().parents[2]
    assert f"```yaml\n{OWN_MODELS_EXAMPLE}```" in (repo / "docs" / "configuration.md").read_text()
    (readme,) = [b.text for b in blocks(repo / "README.md") if b.lang == "yaml" and "own_models:" in b.text]
    monkeypatch.setenv("HOME", str(tmp_path))
    for example, where in ((OWN_MODELS_EXAMPLE, "models/invoices"), (readme, "inv")):
        args = yaml.safe_load(example)
        (given,) = args["own_models"]
        assert set(OwnModelSet.model_fields) - set(given) == {"cls_model"}, example
        home = tmp_path / where
        home.mkdir(parents=True)
        folder(home, "det"), folder(home, "rec")
        (home / "keys.txt").write_text("a\nb\n", encoding="utf-8")
        a = AppArgs.model_validate(args)
        assert a.models[-1] == given["name"] == "invoices"
        mine = a.engines()["invoices"]
        assert mine.det.mean == (0.5, 0.5, 0.5) and mine.rec.image_height == 48
        assert mine.predictor.enable_memory_optim is True and mine.det_model == given["det_model"]
