import pytest

from harness.peer import require_peer


@pytest.fixture(scope="session")
def peer_dir():
    return require_peer()


@pytest.fixture(scope="session")
def ref_engine():
    """The engine with the reference's (RapidOCR 1.4.x) parameters."""
    from serve_app.config import reference_config
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
