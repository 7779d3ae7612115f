"""Every benchmark program of `python -m load_tests` at its smallest
(`NAME --smoke`: each mode, seconds, no cluster; `engine` loads the models
once), so a program whose import or arithmetic rots fails here, not on the
day someone measures. Run as a user runs them, in a child process: the tests
import nothing from load_tests/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_tests(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "load_tests", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


NAMES = load_tests("--names").stdout.split()


def test_the_list_names_each_program_and_an_unknown_name_is_refused():
    assert 5 <= len(NAMES) <= 12 and {"serve", "engine", "memory", "hostile", "soak"} <= set(NAMES)
    listing = load_tests()
    assert listing.returncode == 0 and all(f"  {n} " in listing.stdout for n in NAMES)
    unknown = load_tests("nope")
    assert unknown.returncode == 2 and "no load_tests program 'nope'" in unknown.stderr


@pytest.mark.parametrize("name", NAMES)
def test_every_program_runs_its_smoke(name):
    proc = load_tests(name, "--smoke", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + "\n" + proc.stderr[-3000:]
