import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e")

# tests/peer.py is shared by the tests and load_tests/.
sys.path.insert(0, str(TESTS))


def pytest_collection_modifyitems(config, items):
    """Mark every test with its tier, taken from its folder (tests/unit ->
    `unit`, ...), so `pytest -m unit` selects a tier wherever it is run from."""
    for item in items:
        try:
            tier = item.path.relative_to(TESTS).parts[0]
        except ValueError:  # a test outside tests/
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
