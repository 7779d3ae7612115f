"""The integration tier in two parts (docs/testing.md): "no cluster", the
modules named in NO_CLUSTER (real models in this process, the ingress's
routes over stand-in handles, config schemas: no Ray cluster is started),
and "cluster", every other module, marked `cluster` here (real Ray, real
Serve, real HTTP). A new module is `cluster` unless it is added below; a
test of a no-cluster module that leaves Ray initialised fails."""

import sys
from pathlib import Path

import pytest

from harness.peer import require_peer

NO_CLUSTER = {"test_compile_cache_models", "test_default_models", "test_docker_build_steps", "test_documents_layout",
              "test_engine_inputs", "test_engine_peer", "test_ingress_routes", "test_load_tests", "test_model_conversion",
              "test_model_sets_engine", "test_own_sets_check", "test_predictor_keys", "test_predictor_threads", "test_serve_configs",
              "test_structure_accuracy", "test_structure_engine"}
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.parent == HERE and item.path.stem not in NO_CLUSTER:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(autouse=True)
def no_cluster_in_the_no_cluster_part(request):
    """The no-cluster part stays so: a test there that starts Ray (even by a
    call that initialises it on its own) fails here."""
    yield
    if request.node.path.stem in NO_CLUSTER and "ray" in sys.modules:
        assert not sys.modules["ray"].is_initialized(), (
            f"{request.node.path.name} started Ray: move the test to a cluster module or drop it from NO_CLUSTER")


@pytest.fixture(scope="session")
def peer_dir():
    return require_peer()


@pytest.fixture(scope="session")
def ref_engine():
    """The engine with the reference's (RapidOCR 1.4.x) parameters."""
    from serve_app.core.engine_config import reference_config
    from serve_app.engine import OcrEngine, default_engine_config

    eng = OcrEngine(reference_config(predictor=default_engine_config().predictor))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def engine():
    """The engine with its defaults."""
    from serve_app.engine import OcrEngine

    eng = OcrEngine()
    yield eng
    eng.close()
