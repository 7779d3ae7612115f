"""#39 item 2: a TensorRT engine build that fails under `tensorrt.enable:
auto` rebuilds the predictor without TensorRT, says so in the log and in
stats, and the replica starts; under `enable: true` the failure stands.

The engine build is stood in by PaddlePredictor._build raising while
TensorRT is in its options (what Paddle does when TensorRT cannot build an
engine: an exception from create_predictor, or from a shape's first run at
warm-up); no paddle predictor is created."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from serve_app.core.app_args import BatchKnobs
from serve_app.core.engine_config import PredictorOptions
from serve_app.core.errors import ConfigError, ModelError
from serve_app.inference import predictor as predictor_module
from serve_app.inference.predictor import PaddlePredictor, tensorrt_fallback
from serve_app.inference.weights import ModelFiles
from serve_app.serving.replica import ModelReplica, gpu_stats

FILES = ModelFiles("det", "/models/det/inference.pdmodel", "/models/det/inference.pdiparams")
ENGINE_ERROR = "Could not load library libnvinfer_builder_resource.so.10.5.0: cannot open shared object file"


@pytest.fixture
def gpu_with_tensorrt(monkeypatch):
    """A GPU process whose TensorRT libraries load (as resolve_device and
    resolve_tensorrt would find on a GPU node), and an engine build that
    fails where `fail_at` says: "create" (create_predictor) or "warm" (a
    shape's first run)."""
    monkeypatch.setattr(predictor_module, "resolve_device", lambda o: o)
    monkeypatch.setattr(predictor_module, "resolve_tensorrt",
                        lambda o: (o, {"on": True, "enable": o.tensorrt.enable, "reason": "TensorRT 10 found",
                                       "libraries": None}))
    monkeypatch.setattr(predictor_module, "gpu_status", lambda: (True, 1))
    state = {"fail_at": "create", "builds": []}

    def build(self, files):
        state["builds"].append(self.options.tensorrt is not None)
        if self.options.tensorrt is not None and state["fail_at"] == "create":
            raise RuntimeError(ENGINE_ERROR)
        self._thread_id = None

    def run(self, x):
        if self.options.tensorrt is not None and state["fail_at"] == "warm":
            raise RuntimeError(ENGINE_ERROR)
        return np.zeros(1)

    monkeypatch.setattr(PaddlePredictor, "_build", build)
    monkeypatch.setattr(PaddlePredictor, "run", run)
    return state


def _options(enable="auto"):
    return PredictorOptions(device="gpu", tensorrt={"enable": enable, "precision": "fp32"})


def test_a_failed_engine_build_at_creation_falls_back_under_auto(gpu_with_tensorrt, caplog):
    with caplog.at_level(logging.WARNING, logger="serve_app.inference.predictor"):
        p = PaddlePredictor(FILES, _options(), "det")
    try:
        assert gpu_with_tensorrt["builds"] == [True, False]  # tried with TensorRT, then built without
        assert p.options.tensorrt is None and p.tensorrt_status["on"] is False
        assert p.tensorrt_status["engine_build_failed"] is True
        assert "engine build failed" in p.tensorrt_status["reason"] and "libnvinfer_builder_resource" in \
            p.tensorrt_status["reason"]
        assert any("TensorRT off" in r.getMessage() and "engine build failed" in r.getMessage()
                   for r in caplog.records)
        trt = gpu_stats(p)["tensorrt"]
        assert trt["enabled"] is False and trt["enable"] == "auto" and "engine build failed" in trt["why"]
    finally:
        p.close()


def test_a_failed_engine_build_stands_when_tensorrt_is_required(gpu_with_tensorrt):
    with pytest.raises(ModelError, match="libnvinfer_builder_resource"):
        PaddlePredictor(FILES, _options(enable=True), "det")
    assert gpu_with_tensorrt["builds"] == [True]


def test_an_engine_that_fails_at_warm_up_falls_back_and_the_replica_starts(gpu_with_tensorrt):
    gpu_with_tensorrt["fail_at"] = "warm"
    p = PaddlePredictor(FILES, _options(), "det")
    replica = ModelReplica("det", p, BatchKnobs(max_batch_size=4, batch_wait_timeout_s=0.01))
    try:
        shapes = [np.zeros((1, 3, 32, 32), np.float32), np.zeros((2, 3, 32, 32), np.float32)]
        replica.warm([(p.run, x) for x in shapes])
        assert replica.ready_at is not None
        replica.check_health()  # ready: Serve counts the replica as started
        assert gpu_with_tensorrt["builds"] == [True, False]
        assert replica.stats()["tensorrt"]["enabled"] is False
        assert "engine build failed" in replica.stats()["tensorrt"]["why"]
    finally:
        p.close()


def test_the_fallback_rule():
    err = RuntimeError("TensorRT build failed")
    assert tensorrt_fallback(PredictorOptions(device="gpu"), {}, err) is None  # no TensorRT: nothing to drop
    assert tensorrt_fallback(_options(enable=True), {}, err) is None  # required: the error stands
    assert tensorrt_fallback(_options(), {}, ConfigError("int8 needs an engine cache")) is None  # a mistake stands
    opts, status = tensorrt_fallback(_options(), {"on": True, "enable": "auto"}, err)
    assert opts.tensorrt is None and opts.device == "gpu" and status["on"] is False
