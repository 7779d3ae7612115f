"""The unit tier imports neither Ray nor paddle: every tests/unit module is
imported in a fresh interpreter (so whatever this pytest process has loaded
does not matter) and the modules that bring either in are named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("ray", "paddle")  # as in tests/unit/conftest.py (conftest modules are not importable by name)
UNIT = Path(__file__).resolve().parent
REPO = UNIT.parents[1]

PROBE = """
import importlib, json, sys
forbidden, report = {forbidden!r}, {{}}
for name in {modules!r}:
    before = {{m for m in forbidden if m in sys.modules}}
    importlib.import_module(name)
    new = [m for m in forbidden if m in sys.modules and m not in before]
    if new:
        report[name] = new
print(json.dumps(report))
"""


def test_unit_modules_import_neither_ray_nor_paddle():
    modules = sorted(p.stem for p in UNIT.glob("test_*.py"))
    assert "test_decode" in modules
    code = PROBE.format(forbidden=FORBIDDEN, modules=modules)
    # tests/unit (the modules, by name) and the repo root (serve_app, harness) first; the caller's
    # PYTHONPATH is kept after them, so the checkout under test is the one imported.
    path = os.pathsep.join([str(UNIT), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": path},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    # Once one module has loaded ray, later ones cannot bring it in again:
    # the first offender is named, fix it and rerun for the next.
    assert report == {}, f"these tests/unit modules import {report}: move what needs them to tests/integration"
