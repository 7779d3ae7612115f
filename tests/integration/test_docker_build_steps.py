"""#39 item 1: what deploy/docker/Dockerfile runs at build time is run here.

The Dockerfile is read instruction by instruction (ARG defaults, WORKDIR,
RUN), and every RUN that starts Python is executed as written, in this
project's environment, in the folder the image would be in (/app is the
repository, / a scratch folder): `python` is this venv's interpreter, the
pin file a scratch file. The converter stage (`models`) runs in the build
and export envs `make models` made (.venv-build, .venv-export), into a
scratch copy of the conversions `make models` cached (converting again
would download the carrier and take minutes; the step then checks each
entry against its record), and the image's `models` step verifies that
copy where the stage's ENV points. Package installs (apt-get, pip, venv)
are the only RUNs not executed. On this CPU machine the paddle step must
refuse the CPU build and the TensorRT step must say this paddle has none;
every other step must pass. A Python step that is not one of
deploy/docker/build_steps.py's fails the test (nothing would run it before
a `docker build`). No Ray cluster is started: each step is a subprocess."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
PIN = "/opt/paddle-pin.txt"
# What each step does here (CPU paddle 3.3.1, no TensorRT): exit code and a phrase of its output.
EXPECTED = {
    "python": (0, "Python 3."),
    "convert": (0, "legacy programs, readable by every user"),
    "paddle": (1, "not a CUDA build of paddle"),
    "deps": (0, "paddlepaddle==3.3.1"),
    "imports": (0, "modules of serve_app import"),
    "models": (0, "ppocrv6_small (det"),
    "configs": (0, "valid Serve configs: deployments.yaml, deployments.gpu.yaml"),
    "tensorrt": (0, "no TensorRT support"),
}
INSTALLS = re.compile(r"apt-get|pip install|-m venv|useradd")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments): continuation lines joined, comment lines
    (also inside a continuation, as Docker drops them) left out."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or (not pending and not line.strip()):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        word, _, rest = (pending + line).strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def python_steps(text: str, overrides: dict[str, str]) -> list[tuple[str, str, dict[str, str]]]:
    """(working directory in the image, shell command, the stage's ENV so
    far) of every RUN that starts Python, ARGs expanded (their defaults,
    then `overrides`). A FROM starts a stage: WORKDIR / and no ENV."""
    args: dict[str, str] = {}
    workdir, env, steps = "/", {}, []

    def expand(s: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), s)

    for word, rest in instructions(text):
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = overrides.get(name.strip(), default.strip().strip('"'))
        elif word == "FROM":
            workdir, env = "/", {}
        elif word == "WORKDIR":
            workdir = rest
        elif word == "ENV":
            env = {**env, **dict(kv.split("=", 1) for kv in shlex.split(expand(rest)))}
        elif word == "RUN" and re.search(r"\bpython3?\b", rest) and not INSTALLS.search(rest):
            steps.append((workdir, expand(rest), env))
    return steps


def step_name(cmd: str) -> str | None:
    m = re.search(r"deploy/docker/build_steps\.py\s+(\w+)", cmd)
    return m.group(1) if m else None


def load_build_steps():
    """deploy/docker/build_steps.py as a module (it is a script, not in a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_steps", REPO / "deploy" / "docker" / "build_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_envs() -> tuple[Path, Path]:
    """The interpreters of `make models`' build and export envs (the
    converter stage's /opt/venv-build and /opt/venv-export)."""
    from serve_app.tools.convert_models import export_python

    build, export = REPO / ".venv-build" / "bin" / "python", export_python()
    if not build.is_file() or export is None:
        pytest.fail(f"the converter stage runs in `make models`' envs: no {build if not build.is_file() else ''} "
                    f"{'.venv-export (or $OCR_SERVE_EXPORT_PYTHON)' if export is None else ''}: run `make models`")
    return build, export


def seeded_cache(dest: Path) -> Path:
    """A copy of every cached conversion the manifest's sets use (folders
    copied as `make models` left them: 0700): the convert step then has
    nothing to convert and checks each against its record."""
    from serve_app.inference.weights import model_cache_root
    from serve_app.tools.convert_models import converted_sources, load_sets

    dest.mkdir()
    for source in converted_sources(load_sets()).values():
        entry = model_cache_root() / source["sha256"]
        if entry.is_dir():
            shutil.copytree(entry, dest / source["sha256"])
    return dest


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> dict:
    """Scratch stand-ins: a bin folder whose python/python3 are this venv's
    interpreter, the image's / (for WORKDIR /), the pin file's folder, the
    converter stage's envs and its /opt/ocr-models."""
    root = tmp_path_factory.mktemp("image")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):  # a script, not a link: the venv is found from the path run
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_dir / name).chmod(0o755)
    build, export = build_envs()
    return {"bin": bin_dir, "root": root, "pin": root / "paddle-pin.txt",
            "paths": {"/opt/venv-build/bin/python": str(build), "/opt/venv-export/bin/python": str(export),
                      "/opt/ocr-models": str(seeded_cache(root / "ocr-models"))}}


def run_step(workdir: str, cmd: str, where: dict, image_env: dict | None = None) -> subprocess.CompletedProcess:
    """`cmd` with the image's paths replaced by their stand-ins, with the
    stage's ENV (PYTHONPATH: this checkout, as /app is the image's)."""
    paths = {PIN: str(where["pin"]), "/app/": f"{REPO}/", **where.get("paths", {})}

    def local(s: str) -> str:
        for image_path, here in paths.items():
            s = s.replace(image_path, here)
        return s

    cwd = REPO if workdir.rstrip("/") == "/app" else where["root"]
    env = {**os.environ, **{k: local(v) for k, v in (image_env or {}).items()},
           "PATH": f"{where['bin']}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    return subprocess.run(["bash", "-o", "pipefail", "-c", local(cmd)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_every_python_step_of_the_dockerfile_is_a_build_step_and_runs(image_root):
    steps = python_steps(DOCKERFILE.read_text(), {})
    names = [step_name(cmd) for _, cmd, _ in steps]
    assert None not in names, ("a Python step of the Dockerfile that no test runs (put it in "
                               f"deploy/docker/build_steps.py): {steps[names.index(None)][1]}")
    assert sorted(set(names)) == sorted(EXPECTED), names
    # The converter stage first (the image's models step reads what it left), each stage's Python checked.
    assert names.index("convert") < names.index("models") and names.count("python") == 2, names
    for (workdir, cmd, env), name in zip(steps, names):
        out = run_step(workdir, cmd, image_root, env)
        rc, phrase = EXPECTED[name]
        text = out.stdout + out.stderr
        assert out.returncode == rc and phrase in text, (name, cmd, out.returncode, text[-2000:])
        if name == "paddle":
            # The GPU build would have pinned itself; this machine's paddle (the CPU build) stands in.
            image_root["pin"].write_text("paddlepaddle==3.3.1\n")


def test_require_tensorrt_fails_the_build_where_there_is_none(image_root):
    (step,) = [s for s in python_steps(DOCKERFILE.read_text(), {"REQUIRE_TENSORRT": "1"})
               if step_name(s[1]) == "tensorrt"]
    out = run_step(*step[:2], image_root, step[2])
    assert out.returncode == 2 and "no TensorRT support" in out.stdout, out.stdout + out.stderr
    (cu118,) = [s for s in python_steps(DOCKERFILE.read_text(), {"REQUIRE_TENSORRT": "1", "CUDA": "cu118"})
                if step_name(s[1]) == "tensorrt"]
    out = run_step(*cu118[:2], image_root, cu118[2])
    assert out.returncode == 2 and "cu118: runs WITHOUT TensorRT" in out.stdout, out.stdout + out.stderr


def test_a_step_that_fails_stops_the_build_with_its_reason(image_root, tmp_path):
    """The steps' failures are real: a pin naming another paddle, a config
    with a misspelt arg, an old Python."""
    build_steps = load_build_steps()
    pin = tmp_path / "pin.txt"
    pin.write_text("paddlepaddle-gpu==3.3.1\n")
    out = run_step("/app", f"python deploy/docker/build_steps.py deps {pin}", image_root)
    assert out.returncode == 1 and "differs from the pinned" in out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "deployments.gpu.yaml").read_text().replace("gpu_mem_mb:", "gpu_mem_mbb:"))
    out = run_step("/app", f"python deploy/docker/build_steps.py configs {bad}", image_root)
    assert out.returncode == 1 and "gpu_mem_mbb" in out.stderr
    with pytest.raises(build_steps.StepFailed, match="Python 3.10 in the base image"):
        build_steps.step_python((3, 10))


def test_the_models_steps_refuse_what_the_image_could_not_serve(image_root, tmp_path, monkeypatch):
    """The image's models step refuses a converted set that is missing or
    that the runtime user could not read, and a cache the service would not
    look in; the converter stage refuses to run without its export env
    (the fallback's Paddle 3 programs run neither on OpenVINO nor on the
    TensorRT int8 path)."""
    from serve_app.tools.convert_models import converted_sources, load_sets

    build_steps = load_build_steps()
    served = tmp_path / "ocr-models"
    shutil.copytree(seeded_cache(tmp_path / "seed"), served)
    for path in [served, *served.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    monkeypatch.setenv("OCR_SERVE_MODEL_CACHE", str(served))
    assert "ppocrv6_tiny (det" in build_steps.step_models(str(served))  # the copy as the convert step leaves it

    with pytest.raises(build_steps.StepFailed, match="set ENV OCR_SERVE_MODEL_CACHE="):
        build_steps.step_models(str(tmp_path / "elsewhere"))

    params = sorted(served.glob("*/inference.pdiparams"))[0]
    params.chmod(0o666)  # writable by the runtime user
    with pytest.raises(build_steps.StepFailed, match=re.escape(str(params))):
        build_steps.step_models(str(served))
    params.chmod(0o644)

    (rec,) = [s["sha256"] for s in converted_sources(load_sets()).values()
              if s["set"] == "ppocrv6_small" and s["stage"] == "rec"]
    shutil.rmtree(served / rec)
    with pytest.raises(build_steps.StepFailed, match=f"ppocrv6_small rec .*no verified conversion at {served / rec}"):
        build_steps.step_models(str(served))

    (convert,) = [s for s in python_steps(DOCKERFILE.read_text(), {}) if step_name(s[1]) == "convert"]
    where = {**image_root, "paths": {**image_root["paths"], "/opt/venv-export/bin/python": str(tmp_path / "none")}}
    out = run_step(*convert[:2], where, convert[2])
    assert out.returncode == 1 and f"no export env interpreter at {tmp_path / 'none'}" in out.stderr, out.stderr


def test_imports_skip_only_a_missing_optional_extra():
    """The image installs the `gpu` extra, not `ocrmypdf`: the plugin's
    module is skipped by name there; any other missing module fails the
    step."""
    build_steps = load_build_steps()
    pyproject = REPO / "pyproject.toml"
    assert build_steps.optional_extra(ModuleNotFoundError("no ocrmypdf", name="ocrmypdf"), pyproject) == "ocrmypdf"
    assert build_steps.optional_extra(ModuleNotFoundError("no redis", name="redis"), pyproject) is None  # core dep
    assert build_steps.optional_extra(ModuleNotFoundError("x", name="serve_app.weights"), pyproject) is None
    assert build_steps.optional_extra(ImportError("cannot import name x"), pyproject) is None
