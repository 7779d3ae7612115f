"""#39 item 1: what deploy/docker/Dockerfile runs at build time is run here.

The Dockerfile is read instruction by instruction (ARG defaults, WORKDIR,
RUN), and every RUN that starts Python is executed as written, in this
project's environment, in the folder the image would be in (/app is the
repository, / a scratch folder): `python` is this venv's interpreter, the
pin file a scratch file. Package installs (apt-get, pip, venv) are the only
RUNs not executed. On this CPU machine the paddle step must refuse the CPU
build and the TensorRT step must say this paddle has none; every other step
must pass. A Python step that is not one of deploy/docker/build_steps.py's
fails the test (nothing would run it before a `docker build`).
No Ray cluster is started: each step is a subprocess."""

from __future__ import annotations

import os
import re
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
    "paddle": (1, "not a CUDA build of paddle"),
    "deps": (0, "paddlepaddle==3.3.1"),
    "imports": (0, "modules of serve_app import"),
    "models": (0, "model files verified"),
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


def python_steps(text: str, overrides: dict[str, str]) -> list[tuple[str, str]]:
    """(working directory in the image, shell command) of every RUN that
    starts Python, ARGs expanded (their defaults, then `overrides`)."""
    args: dict[str, str] = {}
    workdir, steps = "/", []
    for word, rest in instructions(text):
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = overrides.get(name.strip(), default.strip().strip('"'))
        elif word == "WORKDIR":
            workdir = rest
        elif word == "RUN" and re.search(r"\bpython3?\b", rest) and not INSTALLS.search(rest):
            cmd = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), rest)
            steps.append((workdir, cmd))
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


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> dict:
    """Scratch stand-ins: a bin folder whose python/python3 are this venv's
    interpreter, the image's / (for WORKDIR /), the pin file's folder."""
    root = tmp_path_factory.mktemp("image")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):  # a script, not a link: the venv is found from the path run
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_dir / name).chmod(0o755)
    return {"bin": bin_dir, "root": root, "pin": root / "paddle-pin.txt"}


def run_step(workdir: str, cmd: str, where: dict) -> subprocess.CompletedProcess:
    cmd = cmd.replace(PIN, str(where["pin"])).replace("/app/", f"{REPO}/")
    cwd = REPO if workdir.rstrip("/") == "/app" else where["root"]
    env = {**os.environ, "PATH": f"{where['bin']}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    return subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_every_python_step_of_the_dockerfile_is_a_build_step_and_runs(image_root):
    steps = python_steps(DOCKERFILE.read_text(), {})
    names = [step_name(cmd) for _, cmd in steps]
    assert None not in names, ("a Python step of the Dockerfile that no test runs (put it in "
                               f"deploy/docker/build_steps.py): {steps[names.index(None)][1]}")
    assert sorted(names) == sorted(EXPECTED), names
    for (workdir, cmd), name in zip(steps, names):
        out = run_step(workdir, cmd, image_root)
        rc, phrase = EXPECTED[name]
        text = out.stdout + out.stderr
        assert out.returncode == rc and phrase in text, (name, cmd, out.returncode, text[-2000:])
        if name == "paddle":
            # The GPU build would have pinned itself; this machine's paddle (the CPU build) stands in.
            image_root["pin"].write_text("paddlepaddle==3.3.1\n")


def test_require_tensorrt_fails_the_build_where_there_is_none(image_root):
    (step,) = [(w, c) for w, c in python_steps(DOCKERFILE.read_text(), {"REQUIRE_TENSORRT": "1"})
               if step_name(c) == "tensorrt"]
    out = run_step(*step, image_root)
    assert out.returncode == 2 and "no TensorRT support" in out.stdout, out.stdout + out.stderr
    (cu118,) = [(w, c) for w, c in python_steps(DOCKERFILE.read_text(), {"REQUIRE_TENSORRT": "1", "CUDA": "cu118"})
                if step_name(c) == "tensorrt"]
    out = run_step(*cu118, image_root)
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
