from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e")


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


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One real redis-server for the session (tests/redis_server.py); fails,
    never skips, when redis-server is not installed."""
    from harness.redis_server import RedisServer

    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    """The session's server, emptied for this test."""
    redis_server.flush()
    return redis_server.url
