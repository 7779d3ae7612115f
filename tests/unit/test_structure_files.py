"""Where the structure models come from (serve_app.inference.weights.structure_files):
the cache entry the manifest's `structure` section names, checked against its record;
a missing or altered entry is a ModelError naming it and `make models`."""

from __future__ import annotations

import json

import pytest

from serve_app.core.errors import ModelError
from serve_app.inference import weights

pytestmark = pytest.mark.unit


def lay_out(root, stage, files: dict[str, bytes]):
    entry = weights.load_manifest()["structure"][stage]
    d = root / entry["sha256"]
    d.mkdir(parents=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    record = {"source": {"sha256": entry["sha256"]},
              "files": {n: {"sha256": weights.file_sha256(d / n), "bytes": len(b)} for n, b in files.items()}}
    (d / weights.CONVERSION_RECORD).write_text(json.dumps(record))
    return d


def test_a_checked_entry_resolves_and_an_altered_or_missing_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("OCR_SERVE_MODEL_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="make models"):
        weights.structure_files("table")
    d = lay_out(tmp_path, "table", {"inference.pdmodel": b"program", "inference.pdiparams": b"params"})
    files = weights.structure_files("table")
    assert (files.program, files.params) == (d / "inference.pdmodel", d / "inference.pdiparams")
    (d / "inference.pdiparams").write_bytes(b"PARAMS")  # same size, other bytes
    with pytest.raises(ModelError, match="inference.pdiparams"):
        weights.structure_files("table")


def test_a_user_directory_and_an_unknown_stage(tmp_path):
    (tmp_path / "inference.pdmodel").write_bytes(b"p")
    (tmp_path / "inference.pdiparams").write_bytes(b"w")
    assert weights.structure_files("layout", str(tmp_path)).program == tmp_path / "inference.pdmodel"
    with pytest.raises(ModelError, match="layout, table"):
        weights.structure_files("figure")
