"""Every Python step of deploy/docker/Dockerfile, one subcommand each, so that
what the image runs at build time is what tests/integration/test_docker_build_steps.py
runs (in the project's own environment, with the Dockerfile's own command
lines). A failing step exits non-zero with one line naming the fix, which
fails `docker build` there.

    python deploy/docker/build_steps.py python            # 3.11 or 3.12
    python deploy/docker/build_steps.py paddle PIN        # a CUDA build; its pin written to PIN
    python deploy/docker/build_steps.py deps PIN          # still that paddle, and one OpenCV
    python deploy/docker/build_steps.py imports [EXTRAS]  # serve_app compiles, every module imports
    python deploy/docker/build_steps.py convert CACHE EXPORT_PYTHON   # (stage `models`, build env) v6 sets into CACHE
    python deploy/docker/build_steps.py models CACHE      # every set's weights present and intact, CACHE read-only
    python deploy/docker/build_steps.py configs FILE...   # Serve schema + the app's typed args
    python deploy/docker/build_steps.py tensorrt CUDA REQUIRE [PIN]   # serve_app.inference.tensorrt_libs install

Only the standard library at import: `python` runs before anything is installed.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

PYTHONS = ((3, 11), (3, 12))  # pyproject.toml requires-python; what paddlepaddle-gpu 3.3.1 has wheels for too


class StepFailed(Exception):
    """The build must stop: the message says why and what to do."""


def step_python(version: tuple = tuple(sys.version_info[:2])) -> str:
    if tuple(version) not in PYTHONS:
        raise StepFailed(
            f"Python {version[0]}.{version[1]} in the base image; this project needs "
            f"{' or '.join(f'{a}.{b}' for a, b in PYTHONS)} (pyproject.toml requires-python): "
            "pick a CUDA_IMAGE on Ubuntu 24.04 (python3 3.12)")
    return f"Python {version[0]}.{version[1]}"


def _paddle_distributions() -> list[str]:
    """`name==version` of every installed paddle distribution (both the CPU
    and the GPU one provide the `paddle` module)."""
    from importlib import metadata

    found = set()
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in ("paddlepaddle", "paddlepaddle-gpu"):
            found.add(f"{name}=={dist.version}")
    return sorted(found)


def step_paddle(pin: Path) -> str:
    """paddle imports, is a CUDA build, and is written to `pin` as the pip
    constraint every later install is given (so dependency resolution can
    neither replace it nor add the CPU build beside it). No GPU is needed."""
    import paddle

    line = (f"paddle {paddle.__version__}, CUDA {paddle.version.cuda()}, cuDNN {paddle.version.cudnn()}, "
            f"Python {sys.version.split()[0]}")
    if not paddle.is_compiled_with_cuda():
        raise StepFailed(f"{line}: not a CUDA build of paddle (the CPU `paddlepaddle`?): install "
                         "paddlepaddle-gpu from Paddle's index for the image's CUDA "
                         "(https://www.paddlepaddle.org.cn/packages/stable/<cuda>/)")
    dists = _paddle_distributions()
    if len(dists) != 1:
        raise StepFailed(f"{line}: expected one paddle distribution, pip sees {dists or 'none'}")
    pin.write_text(dists[0] + "\n")
    return f"{line}; pinned {dists[0]} in {pin}"


def step_deps(pin: Path) -> str:
    """After the project's dependencies: the paddle pinned by step_paddle is
    still the only paddle, and one OpenCV distribution (two would each bring
    their own cv2)."""
    from importlib import metadata

    want = pin.read_text().split()
    have = _paddle_distributions()
    if have != want:
        raise StepFailed(f"the installed paddle {have} differs from the pinned {want}: a dependency replaced it; "
                         f"install with -c {pin}")
    cv = sorted({(d.metadata["Name"] or "").lower() for d in metadata.distributions()
                 if (d.metadata["Name"] or "").lower().startswith("opencv")})
    if len(cv) != 1:
        raise StepFailed(f"{len(cv)} OpenCV distributions installed ({', '.join(cv) or 'none'}): keep exactly one")
    return f"{have[0]}, {cv[0]}"


def optional_extra(error: ImportError, pyproject: Path, installed: tuple = ("gpu",)) -> str | None:
    """The pyproject extra (not installed in the image) whose package a
    failed import names, e.g. `ocrmypdf` for serve_app.integrations; None
    when the failure is not an optional dependency's absence."""
    import tomllib

    missing = getattr(error, "name", None)
    if not isinstance(error, ModuleNotFoundError) or not missing:
        return None
    extras = tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {})
    for extra, reqs in extras.items():
        names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].strip().lower().replace("-", "_") for r in reqs}
        if extra not in installed and missing.split(".")[0].lower() in names:
            return extra
    return None


def step_imports(extras: str = "gpu") -> str:
    """The package byte-compiles (the image runs with
    PYTHONDONTWRITEBYTECODE) and every module imports (a module moved
    without its importers fails here, not in a replica); a module that
    needs an optional extra the image does not install (pyproject.toml) is
    named and skipped. `extras`: the image's EXTRAS (comma-separated)."""
    import compileall
    import importlib
    import pkgutil

    import serve_app

    pyproject = Path(serve_app.__path__[0]).parent / "pyproject.toml"

    if not compileall.compile_dir(serve_app.__path__[0], quiet=1):
        raise StepFailed("serve_app does not byte-compile (the errors above)")

    failed, skipped = [], []
    names = [m.name for m in pkgutil.walk_packages(serve_app.__path__, "serve_app.")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - each failure is reported
            installed = tuple(x.strip() for x in extras.split(",") if x.strip())
            extra = optional_extra(e, pyproject, installed) if isinstance(e, ImportError) else None
            if extra:
                skipped.append(f"{name} (extra {extra})")
            else:
                failed.append(f"{name}: {type(e).__name__}: {e}")
    if failed:
        raise StepFailed(f"{len(failed)} of {len(names)} modules do not import: " + "; ".join(failed[:5]))
    return (f"{len(names) - len(skipped)} modules of serve_app import"
            + (f"; not installed here, skipped: {', '.join(skipped)}" if skipped else ""))


def _read_only_for_others(root: Path) -> list[str]:
    """Paths under `root` (root included) that a user other than the owner
    cannot read (or, a folder, enter) or can write."""
    bad = []
    for path in [root, *sorted(root.rglob("*"))]:
        mode = path.lstat().st_mode
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if (mode & need) != need or mode & (stat.S_IWGRP | stat.S_IWOTH):
            bad.append(f"{path} ({stat.filemode(mode)})")
    return bad


def step_convert(cache: str, export_python: str) -> str:
    """(The converter stage, in the build env.) serve_app/tools/convert_models.py
    as `make models` runs it, into `cache`: every file of the manifest's
    converted sets downloaded, converted and checked against onnxruntime
    (or, already there, checked against its record). Each converted file
    must be a legacy program (the export env's Paddle 2.6.2 made it; the
    fallback's Paddle 3 .json runs neither on OpenVINO nor on the TensorRT
    int8 path). Then the folder is made readable, not writable, by every
    user: conversions are published from 0700 temporary folders, and the
    image's runtime user is not their owner."""
    if not Path(export_python).is_file():
        raise StepFailed(f"no export env interpreter at {export_python}: create it with the packages of "
                         "models/export-requirements.txt (paddlepaddle 2.6.2) before this step")
    os.environ["OCR_SERVE_EXPORT_PYTHON"] = export_python
    import json

    from serve_app.inference.weights import CONVERSION_RECORD
    from serve_app.tools.conversion_check import ConversionError
    from serve_app.tools.convert_models import converted_sources, ensure_all, load_sets
    from serve_app.tools.structure_models import ensure_structure

    root = Path(cache)
    try:
        status = ensure_all(root)
        status.update({f"structure {k}": v for k, v in ensure_structure(root).items()})  # layout, table
    except ConversionError as e:
        raise StepFailed(f"model conversion failed: {e}") from None
    sources = converted_sources(load_sets())
    for path, source in sources.items():
        if not source["convert"]:
            continue
        record = json.loads((root / source["sha256"] / CONVERSION_RECORD).read_text())
        made = record.get("rewrites", {})
        if not str(made.get("format", "")).startswith("legacy"):
            raise StepFailed(f"{path} was converted to {made.get('format')!r}, not a legacy program "
                             f"({made.get('legacy_error')}): fix the export env ({export_python})")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    counts = {what: sum(1 for s in status.values() if s == what) for what in sorted(set(status.values()))}
    sets = sorted({s["set"] for s in sources.values()})
    return (f"{len(status)} files of {', '.join(sets)} in {root} ("
            + ", ".join(f"{n} {what}" for what, n in counts.items())
            + "; each checked against onnxruntime when converted, against its record when cached), "
            "legacy programs, readable by every user")


def step_models(cache: str) -> str:
    """Every built-in set's files, each checked: the carrier wheel's
    (PP-OCRv4 mobile, and the direction classifier every set uses) against
    models/manifest.json, the converted sets' against their conversion
    records in `cache`, whose sources must be the manifest's (size,
    sha256). `cache` must be where the service will look
    ($OCR_SERVE_MODEL_CACHE, set before this step) and not writable by
    anyone but its owner (root: the runtime user only reads it)."""
    from serve_app.core.errors import ModelError
    from serve_app.inference.weights import MANIFEST_PATH, model_cache_root, set_files, set_names

    env = os.environ.get("OCR_SERVE_MODEL_CACHE")
    if not env or Path(env).resolve() != Path(cache).resolve():
        raise StepFailed(f"OCR_SERVE_MODEL_CACHE is {env!r} but the converted sets are in {cache}: "
                         f"set ENV OCR_SERVE_MODEL_CACHE={cache} before this step (the service reads it)")
    try:
        sets = [set_files(name) for name in set_names()]
    except ModelError as e:
        raise StepFailed(str(e)) from None
    bad = _read_only_for_others(model_cache_root())
    if bad:
        raise StepFailed(f"{len(bad)} paths in {cache} are not readable and unwritable for the runtime user, e.g. "
                         f"{'; '.join(bad[:3])}: chmod folders 0755 and files 0644 (the convert step does)")
    return (f"model files verified against {MANIFEST_PATH} and the conversion records in {cache}: "
            + "; ".join(f"{s.name} (" + ", ".join(f"{f.name} {_short(f.program.parent.name)}/{f.program.name}"
                                                  for f in (s.det, s.cls, s.rec)) + f", {s.dictionary.name})"
                        for s in sets))


def _short(folder: str) -> str:
    """A cache entry's folder (the source's sha256) by its first 12 digits."""
    return folder[:12] if re.fullmatch(r"[0-9a-f]{64}", folder) else folder


def step_configs(paths: list[str]) -> str:
    """Each Serve config parses with Ray Serve's schema and every
    application's args with the app's typed args."""
    import yaml
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    from serve_app.app import AppArgs

    for path in paths:
        with open(path) as f:
            cfg = yaml.safe_load(f)
        try:
            ServeDeploySchema.model_validate(cfg)
            for app in cfg["applications"]:
                AppArgs.model_validate(app.get("args") or {})
        except ValidationError as e:
            raise StepFailed(f"{path}: {e}") from None
    return "valid Serve configs: " + ", ".join(paths)


def step_tensorrt(cuda: str, require: str, pin: str = "") -> int:
    """TensorRT from NVIDIA's index, linked and loaded as Paddle will
    (serve_app.inference.tensorrt_libs install); REQUIRE 1: missing fails."""
    from serve_app.inference.tensorrt_libs import main

    return main(["install", "--cuda", cuda] + (["--constraint", pin] if pin else [])
                + (["--require"] if require == "1" else []))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    step, rest = argv[0], argv[1:]
    steps = {"python": lambda: step_python(),
             "paddle": lambda: step_paddle(Path(*rest)),
             "deps": lambda: step_deps(Path(*rest)),
             "imports": lambda: step_imports(*rest),
             "convert": lambda: step_convert(*rest),
             "models": lambda: step_models(*rest),
             "configs": lambda: step_configs(rest)}
    if step == "tensorrt":
        return step_tensorrt(*rest)
    if step not in steps:
        print(f"unknown step {step!r}: one of {', '.join(steps)}, tensorrt", file=sys.stderr)
        return 2
    try:
        out = steps[step]()
    except StepFailed as e:
        print(f"build step {step} FAILED: {e}", file=sys.stderr)
        return 1
    print(f"build step {step}: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
