from pathlib import Path

import pytest

from harness.service import SharedServices, grouped

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e")
SERVICES = SharedServices()


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
    items[:] = grouped_by_shared_service(items)


def shared_service_of(item) -> str | None:
    """The name of the shared service a test's module uses (its module-level
    SHARED_SERVICE), or None: a module with a service of its own."""
    module = getattr(item, "module", None)
    return getattr(module, "SHARED_SERVICE", None)


def grouped_by_shared_service(items: list) -> list:
    """The modules that share a service moved next to the first of them
    (harness.service.grouped), so that it starts once for all of them."""
    return grouped(items, shared_service_of, lambda item: item.path)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of the modules sharing a service (the next test
    wants another or none), stop it: its ~2 GB and its cluster's background
    work are not left to the modules that follow."""
    name = shared_service_of(item)
    if name is not None and (nextitem is None or shared_service_of(nextitem) != name):
        SERVICES.stop()


def pytest_sessionfinish(session, exitstatus):
    SERVICES.stop()


@pytest.fixture(scope="session")
def shared_services() -> SharedServices:
    """The session's shared services (harness.service.SharedServices); a
    test module declares SHARED_SERVICE = NAME and its `service` fixture asks
    this one for NAME's service."""
    return SERVICES


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One real redis-server for the session (harness/redis_server.py); fails,
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
