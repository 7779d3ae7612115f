"""A user's own model set checked with Paddle when the application is built
(serve_app/serving/set_check.py, in a child process): a set assembled
from the shipped PP-OCRv4 files under another name passes; a dictionary
that is not the recogniser's, a dictionary of the right size in another
order (every replica's canary would misread), a recogniser folder that
holds a detector, and a detector whose file is not a model are each
refused, the error naming the file and the problem (never a user's first
request, nor a replica that never becomes ready)."""

from __future__ import annotations

import shutil

import pytest

from serve_app.core.app_args import AppArgs
from serve_app.core.errors import ConfigError
from serve_app.inference import weights
from serve_app.serving.set_check import check_own_sets


def v4_folder(tmp_path, stage: str):
    """A copy of the shipped v4 model of `stage`, as a user's export would be laid out."""
    d = tmp_path / f"my_{stage}"
    shutil.copytree(weights.default_stage_dir(stage), d)
    return d


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own")
    words = tmp / "keys.txt"
    shutil.copy(weights.dictionary_path(), words)
    return {"det": v4_folder(tmp, "det"), "rec": v4_folder(tmp, "rec"), "dict": words, "tmp": tmp}


def declared(files, **changes) -> dict:
    d = {"name": "my_v4", "det_model": str(files["det"]), "rec_model": str(files["rec"]),
         "rec_dict": str(files["dict"]), "det": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}}
    return {**d, **changes}


def test_a_set_assembled_from_the_shipped_files_passes(files):
    check_own_sets(AppArgs.model_validate({"own_models": [declared(files)]}))


def test_a_dictionary_that_is_not_the_recognisers_is_refused_with_both_counts(files):
    short = files["tmp"] / "short.txt"
    short.write_text("".join(f"{c}\n" for c in "abcdefghij"), encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        check_own_sets(AppArgs.model_validate({"own_models": [declared(files, rec_dict=str(short))]}))
    message = str(e.value)
    assert "own model set 'my_v4' refused" in message and str(short) in message
    assert "has 10 characters (12 classes" in message and "outputs 6625 classes" in message


def test_a_dictionary_of_the_right_size_in_another_order_fails_the_replicas_canary_and_is_refused(files):
    """The counts agree, so the class check passes; the golden word reads as other characters, so
    each replica's check before ready would fail for ever: refused here instead."""
    lines = weights.dictionary_path().read_text(encoding="utf-8").split("\n")
    rotated = files["tmp"] / "rotated.txt"
    rotated.write_text("\n".join(lines[1:-1] + lines[:1] + lines[-1:]), encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        check_own_sets(AppArgs.model_validate({"own_models": [declared(files, rec_dict=str(rotated))]}))
    message = str(e.value)
    assert "own model set 'my_v4' refused" in message and "fails the check each replica runs" in message
    assert "recogniser read the golden crop as" in message and str(rotated) in message


def test_a_recogniser_folder_holding_a_detector_is_refused(files):
    with pytest.raises(ConfigError) as e:
        check_own_sets(AppArgs.model_validate({"own_models": [declared(files, rec_model=str(files["det"]))]}))
    assert "rec_model" in str(e.value) and str(files["det"]) in str(e.value)


def test_a_detector_file_that_is_not_a_model_is_refused(files):
    junk = files["tmp"] / "junk_det"
    junk.mkdir()
    (junk / "inference.pdmodel").write_bytes(b"not a program" * 10)
    (junk / "inference.pdiparams").write_bytes(b"\0" * 64)
    with pytest.raises(ConfigError) as e:
        check_own_sets(AppArgs.model_validate({"own_models": [declared(files, det_model=str(junk))]}))
    assert "own model set 'my_v4' refused" in str(e.value) and "junk_det" in str(e.value)


def test_the_documented_example_passes_with_a_fine_tuned_v4_pairs_files_in_place(tmp_path, monkeypatch):
    """docs/configuration.md's complete declaration (serve_app.core.own_sets.OWN_MODELS_EXAMPLE), its
    folders holding a PP-OCRv4 pair as a user's export would: checked with Paddle as at start."""
    import yaml

    from serve_app.core.own_sets import OWN_MODELS_EXAMPLE

    monkeypatch.setenv("HOME", str(tmp_path))  # the example's ~/models/invoices/...
    home = tmp_path / "models" / "invoices"
    home.mkdir(parents=True)
    shutil.copytree(weights.default_stage_dir("det"), home / "det")
    shutil.copytree(weights.default_stage_dir("rec"), home / "rec")
    shutil.copy(weights.dictionary_path(), home / "keys.txt")
    check_own_sets(AppArgs.model_validate(yaml.safe_load(OWN_MODELS_EXAMPLE)))
