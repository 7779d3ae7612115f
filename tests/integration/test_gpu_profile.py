"""The GPU profile on logical GPUs (no GPU needed): Ray's fractional
placement, and the Paddle side of each replica as stats() reports it (the
memory share it asks for, the limit Paddle enforces, TensorRT's shape set).

What runs depends on what is installed, decided once and fast (no skips):
with paddle's CPU build, or a CUDA build that sees no GPU, a replica without
the CPU fallback must fail its own start saying why, and with the fallback
runs on the CPU showing what a GPU would be given; where paddle sees a GPU,
the replica must run on it with the limit enforced (TensorRT is dropped from
the config there to keep the test short; load_tests/gpu_run.sh runs it)."""

from __future__ import annotations

import time

import pytest
import requests

from harness.peer import PEER
from harness.service import REPO, apply_config, deploy_config, free_port, load_config, start_ray, stop_all
from serve_app.inference.gpu import gpu_memory_limit_mb
from serve_app.inference.predictor import gpu_status
from serve_app.core.app_args import AppArgs
from serve_app.inference.shape_ranges import range_of, rec_shapes

CUDA_BUILD, GPUS = gpu_status()
REAL_GPU = CUDA_BUILD and GPUS > 0
TOKEN = "gpu-profile-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HANG_S = 900  # a wait's deadline: only a hang reaches it


@pytest.fixture(scope="module")
def cluster(monkeypatch_module):
    # A replica that cannot start fails its deployment after one try, not Serve's
    # three per replica (each a process start and a paddle import here): the first
    # test waits for DEPLOY_FAILED. Read by the controller, which inherits this env.
    monkeypatch_module.setenv("RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT", "1")
    start_ray(num_cpus=8, num_gpus=1)  # logical where there is no GPU: Ray only counts them
    yield
    stop_all(graceful=False)  # the cluster goes with ray.shutdown(): no ~10-40 s Serve drain


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def gpu_config(fallback: bool, rec_replicas: int) -> dict:
    cfg = load_config(REPO / "deployments.gpu.yaml")
    app = cfg["applications"][0]
    # The profile needs its token (OCR_AUTH_TOKEN) where the app is built and in the ingress.
    app["runtime_env"] = {"env_vars": {app["args"]["ingress"]["auth_token_env"]: TOKEN}}
    for block in [app["args"]["engine"]] + [app["args"].get(s, {}) for s in ("detector", "classifier", "recognizer")]:
        if "predictor" in block:
            block["predictor"]["allow_cpu_fallback"] = fallback
            if REAL_GPU:
                block["predictor"].pop("tensorrt", None)
    if not REAL_GPU:
        # On the CPU fallback the profile's detector batches of 8 would be 168
        # input shapes to warm (8 x 1280x1280 at the top) on two cores: more
        # minutes and GBs than this test has. The recogniser's set is checked.
        app["args"]["engine"]["det"]["batch_size"] = 1
    for d in app["deployments"]:
        d["ray_actor_options"]["num_cpus"] = 0.1
        if d["name"] in ("TextDetector", "DirectionClassifier"):
            d["ray_actor_options"]["num_gpus"] = 0  # leave the one GPU to the recogniser
        if d["name"] == "TextRecognizer":
            d.pop("autoscaling_config")
            d["num_replicas"] = rec_replicas
        if d["name"] == "OcrPipeline":
            d.pop("autoscaling_config")
    return cfg


def _rec_states() -> dict:
    from ray import serve

    return serve.status().applications["ocr"].deployments["TextRecognizer"].replica_states


def _app_status(name: str = "ocr"):
    from ray import serve

    return serve.status().applications.get(name)


def test_replicas_check_their_own_gpu_and_say_what_to_do(cluster):
    """The app builds wherever the controller runs; each replica checks its
    own device. Without a usable GPU and without the fallback: DEPLOY_FAILED
    with the replica's message."""
    from ray import serve

    cfg = gpu_config(fallback=False, rec_replicas=1)
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    apply_config(cfg)
    want = "RUNNING" if REAL_GPU else "DEPLOY_FAILED"
    deadline = time.monotonic() + HANG_S
    app = None
    while time.monotonic() < deadline:
        app = _app_status()
        if app is not None and app.status in ("RUNNING", "DEPLOY_FAILED"):
            break
        time.sleep(1)
    assert app is not None and app.status == want, (app and app.status, app and app.message)
    if REAL_GPU:
        rec = serve.get_deployment_handle("TextRecognizer", app_name="ocr")
        s = rec.stats.remote().result()
        assert s["device"] == "gpu" and s["gpu_memory_limit_mb"] is not None, s
    else:
        message = app.message + " ".join(d.message for d in app.deployments.values())
        assert "allow_cpu_fallback" in message and "paddlepaddle-gpu" in message, message
        # The replica says which of the two cases it is in.
        assert ("CPU build (paddlepaddle)" if not CUDA_BUILD else "sees no GPU") in message, message
    serve.delete("ocr")


def test_four_quarter_gpu_replicas_share_one_gpu_and_a_fifth_waits(cluster):
    from ray import serve

    cfg = gpu_config(fallback=True, rec_replicas=5)
    port = free_port()
    serve.shutdown()
    # The waits are on state; their deadlines only stop a hang. The replicas
    # load one beside another on two cores (an AVX2-only machine had 3 of the
    # 4 running after 210 s), so no start-up time is assumed.
    url = deploy_config(cfg, port, timeout_s=HANG_S, all_replicas=False)  # each stage has a warmed replica
    deadline = time.monotonic() + HANG_S
    while (states := _rec_states()).get("RUNNING", 0) < 4:
        app = _app_status()
        assert app.status != "DEPLOY_FAILED", app.message
        assert time.monotonic() < deadline, f"4 recogniser replicas not running after {HANG_S} s: {states}"
        time.sleep(2)
    # The fifth waits for a GPU share, and not for lack of time: the four hold
    # all of the one GPU (4 x 0.25), so Ray has nothing left to place it on.
    import ray

    assert ray.available_resources().get("GPU", 0) == 0, ray.available_resources()
    states = _rec_states()
    assert states.get("RUNNING", 0) == 4, states
    assert sum(states.values()) == 5, states

    rec = serve.get_deployment_handle("TextRecognizer", app_name="ocr")
    # The router picks a replica per call and passes over one whose queue-length probe is slow (a replica
    # still building its deferred shapes beside three others on two cores): call until all four answered.
    seen = {}
    deadline = time.monotonic() + HANG_S
    while len(seen) < 4:
        assert time.monotonic() < deadline, f"4 recogniser replicas running, {len(seen)} answered in {HANG_S} s"
        s = rec.stats.remote().result()
        seen[s["pid"]] = s
        if len(seen) < 4:
            time.sleep(0.2)

    engine = AppArgs.model_validate(cfg["applications"][0]["args"]).engine
    shapes = rec_shapes(engine.rec)
    for s in seen.values():
        assert s["gpu_ids"] == ["0"], s  # each replica got GPU 0 from Ray
        # Paddle side: Ray's 0.25 became the replica's memory share.
        assert s["requested_device"] == "gpu" and s["gpu_memory_fraction"] == 0.25, s
        assert s["gpu_memory_reserve_mb"] == 768
        if REAL_GPU:
            g = s["gpu_memory"]
            assert s["device"] == "gpu"
            assert s["gpu_memory_limit_mb"] == gpu_memory_limit_mb(0.25, g["device_total_mb"], 768), s
        else:
            assert s["device"] == "cpu"  # no usable GPU: fell back, as the test config allows
            assert s["gpu_memory_limit_mb"] is None  # nothing is enforced on the CPU, and nothing claimed
            # TensorRT as a GPU would get it: every recogniser input shape, batch dim included.
            trt = s["tensorrt"]
            assert trt["enabled"] is False and trt["precision"] == "fp16"
            # #29 item 1: TensorRT optional (enable: auto), and the replica says why it is off.
            assert trt["enable"] == "auto" and "CPU fallback" in trt["why"], trt
            assert trt["input_shapes"] == len(shapes) == 113
            assert trt["input_range"] == range_of(shapes).as_dict()
            assert trt["max_batch_size"] == 16 == engine.rec.batch_size

    # #29 item 4: the stages given no GPU share (num_gpus: 0 above) see no
    # device at all, while the recogniser sees the one Ray gave it.
    for name in ("TextDetector", "DirectionClassifier"):
        s = serve.get_deployment_handle(name, app_name="ocr").stats.remote().result()
        assert s["gpu_ids"] == [] and s["cuda_visible_devices"] == "", (name, s["cuda_visible_devices"])
        assert s["gpus_seen_by_paddle"] == 0, s
    for s in seen.values():
        assert s["cuda_visible_devices"] == "0", s["cuda_visible_devices"]

    with open(PEER / "rapidocr_issue_170.png", "rb") as f:
        r = requests.post(f"{url}/v1/ocr", files={"file": f}, headers=AUTH, timeout=120)
    assert r.status_code == 200 and [x["text"] for x in r.json()["results"]] == ["TEST"]


def test_tuned_shape_ranges_are_collected_over_the_shape_set(tmp_path):
    """The collection pass a TensorRT replica runs before building engines,
    here on the CPU (same tensor shapes): the model input's recorded range is
    the range of the shapes given, batch dimension included."""
    from serve_app.core.engine_config import PredictorOptions
    from serve_app.inference.predictor import collect_shape_ranges
    from serve_app.inference.weights import model_files

    shapes = [(1, 3, 48, 320), (3, 3, 48, 640), (2, 3, 48, 960)]
    out = tmp_path / "rec.pbtxt"
    collect_shape_ranges(model_files("rec"), PredictorOptions(enable_mkldnn=False), shapes, str(out))
    text = out.read_text()
    block = text[text.index('name: "x"'):].split("}")[0]
    dims = {k: [int(v) for v in [line.split(":")[1] for line in block.splitlines() if line.strip().startswith(k)]]
            for k in ("min_shape", "max_shape", "opt_shape")}
    assert dims["min_shape"] == [1, 3, 48, 320] and dims["max_shape"] == [3, 3, 48, 960], block
    # #29 item 5: the optimum Paddle recorded is the served one (largest batch), not the most frequent batch.
    assert dims["opt_shape"] == [3, 3, 48, 640] == list(range_of(shapes).opt), block
    assert not list(tmp_path.glob("*.tmp"))  # written under a temporary name, then renamed


def test_the_default_sets_ranges_are_collected_on_its_own_files(tmp_path):
    """The profile's default set is ppocrv6_small: the offline tools
    (collect_shapes --out, calibrate_int8) resolve its converted files, as
    its replicas do, and the collection pass runs that program (input `x`,
    height 48 like v4's) over shapes of the set's own closed rec set."""
    from serve_app.core.engine_config import PredictorOptions
    from serve_app.inference.predictor import collect_shape_ranges
    from serve_app.inference.weights import converted_dir
    from serve_app.tools.collect_shapes import load_args, set_engine, stage_files

    engine = set_engine(load_args(REPO / "deployments.gpu.yaml"))
    assert engine.model == "ppocrv6_small" and engine.rec.image_height == 48
    files = stage_files(engine, "rec")
    assert files.program == converted_dir("ppocrv6_small", "rec") / "inference.pdmodel"
    served = rec_shapes(engine.rec)
    shapes = [served[0], served[len(served) // 2], served[-1]]
    out = tmp_path / "rec.pbtxt"
    collect_shape_ranges(files, PredictorOptions(enable_mkldnn=False,
                                                 enable_memory_optim=engine.predictor.enable_memory_optim),
                         shapes, str(out))
    text = out.read_text()
    block = text[text.index('name: "x"'):].split("}")[0]
    dims = {k: [int(v) for v in [line.split(":")[1] for line in block.splitlines() if line.strip().startswith(k)]]
            for k in ("min_shape", "max_shape")}
    r = range_of(shapes)
    assert dims["min_shape"] == list(r.min) and dims["max_shape"] == list(r.max), (block, r)
