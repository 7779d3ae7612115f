"""serve_app.tools.rehome: old module paths rewritten to their rooms, new
paths left alone, and a second run changes nothing.

rehome: keep old paths (this file's fixtures name them)"""

from __future__ import annotations

from pathlib import Path

import pytest

from serve_app.tools.rehome import FOLDERS, LAYERS, MODULES, NEW_MODULES, new_path, rewrite_files, rewrite_text

OLD_PY = '''\
import serve_app.ingress as ingress
from serve_app import config, jobs
from serve_app import paddlex as px  # the adapter
from serve_app.config import EngineConfig, ImageLimits
from serve_app.stages.decode import decode_image
from serve_app.jobs import JobStore
from serve_app.engine import OcrEngine
from serve_app.client import OcrClient
from serve_app.options import (
    OcrOptions,
    parse_options,
)


def test_x(monkeypatch):
    monkeypatch.setattr("serve_app.ingress.time.monotonic", lambda: 0)
    policy = "serve_app.autoscaling:BacklogPolicy"
    return ingress.api, serve_app.config.reference_config()
'''

NEW_PY = '''\
import serve_app.http.ingress as ingress
from serve_app.core import engine_config as config
from serve_app.jobs import store as jobs
from serve_app.http import paddlex as px  # the adapter
from serve_app.core.engine_config import EngineConfig, ImageLimits
from serve_app.ocr.decode import decode_image
from serve_app.jobs.store import JobStore
from serve_app.engine import OcrEngine
from serve_app.client import OcrClient
from serve_app.core.request_options import OcrOptions, parse_options


def test_x(monkeypatch):
    monkeypatch.setattr("serve_app.http.ingress.time.monotonic", lambda: 0)
    policy = "serve_app.serving.autoscaling:BacklogPolicy"
    return ingress.api, serve_app.core.engine_config.reference_config()
'''


def test_old_imports_and_strings_become_new_and_new_ones_stay():
    assert rewrite_text(OLD_PY, Path("tests/unit/test_x.py")) == NEW_PY
    assert rewrite_text(NEW_PY, Path("tests/unit/test_x.py")) == NEW_PY  # idempotent


def test_prose_yaml_and_makefile_paths():
    yaml = ("import_path: serve_app.app:build_app\n"
            "policy_function: serve_app.autoscaling:BacklogPolicy  # serve_app/autoscaling.py\n"
            "request_router_class: \"serve_app.routing:PartSpreadingRouter\"\n")
    want = ("import_path: serve_app.app:build_app\n"
            "policy_function: serve_app.serving.autoscaling:BacklogPolicy  # serve_app/serving/autoscaling.py\n"
            "request_router_class: \"serve_app.serving.routing:PartSpreadingRouter\"\n")
    assert rewrite_text(yaml, Path("deployments.yaml")) == want
    assert rewrite_text(want, Path("deployments.yaml")) == want
    make = "\t$(BIN)/python -m serve_app.tensorrt_libs; python -m serve_app.tools.config_doc\n"
    assert rewrite_text(make, Path("Makefile")) == (
        "\t$(BIN)/python -m serve_app.inference.tensorrt_libs; python -m serve_app.tools.config_doc\n")
    end = "the lock is serve_app.predictor.file_lock. And serve_app.pipeline."
    assert rewrite_text(end, Path("x.md")) == (
        "the lock is serve_app.inference.predictor.file_lock. And serve_app.flow.pipeline.")
    md = "see serve_app/jobs.py, serve_app/stages/, serve_app/static/app.js and `serve_app.job_redis`"
    assert rewrite_text(md, Path("docs/x.md")) == (
        "see serve_app/jobs/store.py, serve_app/ocr/, serve_app/http/static/app.js and `serve_app.jobs.redis_book`")


@pytest.mark.parametrize("place, old, new", [
    # a module at its old place, relative imports resolved there
    ("serve_app/ingress.py", "from . import paddlex\nfrom .config import ImageLimits\n",
     "from serve_app.http import paddlex\nfrom serve_app.core.engine_config import ImageLimits\n"),
    ("serve_app/stages/decode.py", "from ..config import ImageLimits\nfrom .crop import crop_quad\n",
     "from serve_app.core.engine_config import ImageLimits\nfrom serve_app.ocr.crop import crop_quad\n"),
    # an old module's text already in its new home (a branch's edit re-applied):
    # resolved against its old place; `.results` is serve_app.results, not jobs/results.py
    ("serve_app/jobs/book.py", "from .results import TextLine\nfrom .job_results import ResultStore\n",
     "from serve_app.core.results import TextLine\nfrom serve_app.jobs.results import ResultStore\n"),
    ("serve_app/inference/predictor.py", "from . import compile_cache\n",
     "from serve_app.inference import compile_cache\n"),
])
def test_relative_imports_inside_the_package(tmp_path, place, old, new):
    f = tmp_path / place
    f.parent.mkdir(parents=True)
    f.write_text(old)
    assert rewrite_files([f]) == [f] and f.read_text() == new
    assert rewrite_files([f]) == [] and f.read_text() == new  # a second run changes nothing


def test_a_file_with_the_marker_is_left_alone(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(Path(__file__).read_text())
    assert rewrite_files([f]) == []


def test_the_table_maps_into_the_rooms_and_every_new_module_exists():
    root = Path(__file__).resolve().parents[2]
    for old, new in MODULES.items():
        room = new.split(".")[1]
        assert room in LAYERS, new
        assert new_path(old) == new and new_path(new) == new
        target = root / (new.replace(".", "/") + ".py")
        assert target.is_file() or (root / new.replace(".", "/") / "__init__.py").is_file(), target
    for new in FOLDERS.values():
        assert (root / new).is_dir(), new
    assert "serve_app.engine" in NEW_MODULES and "serve_app.client" in NEW_MODULES
