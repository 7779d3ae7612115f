"""#29 item 5: TensorRT int8 calibrated on real images kept in the repo.
The calibration set (real pages, their provenance, the CPU engine's boxes),
the batches fed at the served opt shape, and the table's lookup and reuse,
with Paddle's predictor stood in by one that behaves as Paddle's source
says (serve_app/inference/int8_calibration.py): in calibration mode when no table is
in the optim cache dir, the table written on destruction into the *model's*
folder's _opt_cache. The GPU run itself is not possible here."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from serve_app.core.engine_config import PredictorOptions
from serve_app.core.errors import ConfigError
from serve_app.inference.int8_calibration import (
    MANIFEST, batches_of, ensure_table, load_set, page_crops, reusable, stage_inputs,
)
from serve_app.core.app_args import AppArgs
from serve_app.inference.shape_ranges import range_of, stage_shapes
from serve_app.inference.weights import ModelFiles

REPO = Path(__file__).resolve().parents[2]
PEER = REPO / "tests" / "data" / "peer"


def gpu_engine():
    import yaml

    cfg = yaml.safe_load((REPO / "deployments.gpu.yaml").read_text())
    return AppArgs.model_validate(cfg["applications"][0]["args"]).engine


def read(p):
    return cv2.imread(p, cv2.IMREAD_COLOR)


def test_the_set_is_real_peer_images_with_their_provenance():
    provenance = {e["image"]: e for e in json.loads((PEER / "expected.json").read_text())}
    doc = json.loads((REPO / "serve_app" / "inference" / "calibration" / "set.json").read_text())
    cal = load_set()
    assert len(cal.pages) == len(doc["pages"]) == 9 and len(cal.words) == 9
    for page, entry in zip(cal.pages, doc["pages"]):
        src = REPO / entry["copied_from"]
        assert page.read_bytes() == src.read_bytes()
        assert entry["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
        e = provenance[page.name]
        assert (entry["source"], entry["licence"]) == (e["source"], e["licence"])
        img = read(str(page))
        assert [img.shape[1], img.shape[0]] == entry["size_wh"]
        assert len(entry["cpu"]["boxes"]) == len(entry["cpu"]["texts"]) == len(entry["cpu"]["directions"])
    for w in cal.words:
        assert w.read_bytes() == (PEER / w.name).read_bytes()
    assert sum(len(b) for b in cal.boxes) > 150 and len(cal.digest) == 64


def test_crops_are_cut_where_the_cpu_engine_read_its_texts():
    names, crops = page_crops(load_set(), read)
    doc = json.loads((REPO / "serve_app" / "inference" / "calibration" / "set.json").read_text())
    texts = [t for p in doc["pages"] for t in p["cpu"]["texts"]]
    assert len(crops) == len(texts) + 9 and "EXIT" in texts and "TOTAL" in texts
    assert all(c.dtype == np.uint8 and c.ndim == 3 and c.shape[0] >= 4 and c.shape[1] >= 4 for c in crops)


@pytest.mark.parametrize("stage", ["det", "cls", "rec"])
def test_batches_are_real_images_at_the_served_opt_shape(stage):
    engine = gpu_engine()
    opt = range_of(stage_shapes(stage, engine.det, engine.cls, engine.rec)).opt
    assert opt == {"det": (8, 3, 640, 640), "cls": (6, 3, 48, 192), "rec": (16, 3, 48, 320)}[stage]
    batches = stage_inputs(stage, engine, read)(opt)
    assert batches and all(b.shape == opt and b.dtype == np.float32 and np.isfinite(b).all() for b in batches)
    flat = np.concatenate(batches)
    # normalised as served: the detector by its set's mean and std, crops to [-1, 1]
    mean, std = (np.array(engine.det.mean), np.array(engine.det.std)) if stage == "det" else (0.5, 0.5)
    lo, hi = float(np.min((0 - mean) / std)), float(np.max((1 - mean) / std))
    assert flat.min() >= lo - 1e-6 and flat.max() <= hi + 1e-6
    distinct = {hashlib.sha1(x.tobytes()).hexdigest() for x in flat}
    # real, varied content: det 9 pages fitted + 2 full-resolution windows of the 1280x720 scenes
    assert len(distinct) >= {"det": 11, "cls": 100, "rec": 100}[stage]
    assert flat.std() > 0.2


def test_the_last_batch_is_filled_from_the_start():
    items = [np.full((1, 2, 2), i, np.float32) for i in range(5)]
    b = batches_of(items, 4)
    assert [x[:, 0, 0, 0].tolist() for x in b] == [[0, 1, 2, 3], [4, 0, 1, 2]]
    with pytest.raises(ConfigError, match="no calibration inputs"):
        batches_of([], 4)


# --- the table: lookup, calibration, reuse -------------------------------------------------

OPT = (2, 3, 32, 64)
SHAPES = [(1, 3, 32, 32), (2, 3, 32, 64), (2, 3, 32, 96)]


class PaddleStandIn:
    """Paddle's predictor as its source behaves with precision Int8 and
    use_calib_mode: a table trt_calib_<key> in the optim cache dir is used;
    without one it calibrates on what it is run with, and writes the table
    when destroyed into <model program's folder>/_opt_cache/."""

    created: list = []

    def __init__(self, files: ModelFiles, optim_cache_dir: str, keys=("111", "222"), writes=True):
        self.program_dir = Path(files.program).parent
        self.keys = keys
        self.writes = writes
        self.calibrating = not any((Path(optim_cache_dir) / f"trt_calib_{k}").exists() for k in keys)
        self.fed: list = []
        self._shape = None
        # What a test looks at afterwards (not the predictor itself: a reference would keep it alive).
        self.seen = {"calibrating": self.calibrating, "program_dir": self.program_dir, "fed": self.fed}
        PaddleStandIn.created.append(self.seen)

    def get_input_names(self):
        return ["x"]

    def get_input_handle(self, name):
        return self

    def reshape(self, shape):
        self._shape = tuple(shape)

    def copy_from_cpu(self, x):
        assert x.shape == self._shape and x.dtype == np.float32
        self.fed.append(x.copy())

    def run(self):
        pass

    def __del__(self):
        if self.calibrating and self.fed and self.writes:
            d = self.program_dir / "_opt_cache"
            d.mkdir(exist_ok=True)
            for k in self.keys:
                (d / f"trt_calib_{k}").write_text(f"TRT-table {k} from {len(self.fed)} batches")


def model(tmp_path) -> ModelFiles:
    d = tmp_path / "model"
    d.mkdir()
    (d / "inference.pdmodel").write_bytes(b"program")
    (d / "inference.pdiparams").write_bytes(b"params")
    return ModelFiles("rec", d / "inference.pdmodel", d / "inference.pdiparams")


def int8_options(cache_dir, shapes=SHAPES):
    return PredictorOptions(device="gpu", tensorrt={"precision": "int8", "cache_dir": str(cache_dir),
                                                     "input_shapes": shapes})


def real_batches(shape):
    _, crops = page_crops(load_set(), read)
    from serve_app.core.engine_config import RecOptions
    from serve_app.ocr.recognition import rec_preprocess

    rec = RecOptions(image_height=shape[2])
    return batches_of([rec_preprocess(c, shape[3], rec) for c in crops[:5]], shape[0])


def test_first_start_calibrates_on_a_copy_and_keeps_the_table_in_the_engine_cache(tmp_path):
    files, cache = model(tmp_path), tmp_path / "cache"
    cache.mkdir()
    opts = int8_options(cache)
    PaddleStandIn.created = []
    got = ensure_table(files, opts, "rec", real_batches, lambda f: PaddleStandIn(f, str(cache)), digest="set-A")
    (p,) = PaddleStandIn.created
    assert p["calibrating"] and len(p["fed"]) == 3 and all(x.shape == OPT for x in p["fed"])
    assert p["program_dir"].parent == cache and p["program_dir"] != files.program.parent  # a copy, not the model's folder
    assert not (files.program.parent / "_opt_cache").exists()  # the model's folder is left alone
    assert sorted(os.listdir(cache)) == [MANIFEST, "trt_calib_111", "trt_calib_222"]  # copy removed
    assert (cache / "trt_calib_111").read_text() == "TRT-table 111 from 3 batches"
    assert got["reused"] is False and got["tables"] == ["trt_calib_111", "trt_calib_222"]
    assert got["opt"] == list(OPT) == list(range_of(SHAPES).opt) and got["batches"] == 3 and got["set"] == "set-A"

    # Second start: the manifest and its tables are there: nothing is created or fed.
    PaddleStandIn.created = []
    again = ensure_table(files, opts, "rec", real_batches, lambda f: PaddleStandIn(f, str(cache)), digest="set-A")
    assert PaddleStandIn.created == [] and again["reused"] is True and again["tables"] == got["tables"]
    # ... and the served predictor (optim cache dir = the cache) finds the table: not in calibration mode.
    assert not PaddleStandIn(files, str(cache)).calibrating


def test_another_set_or_a_lost_table_calibrates_again_and_drops_engines_built_from_the_old(tmp_path):
    files, cache = model(tmp_path), tmp_path / "cache"
    cache.mkdir()
    opts = int8_options(cache)
    ensure_table(files, opts, "rec", real_batches, lambda f: PaddleStandIn(f, str(cache)), digest="set-A")
    (cache / "trt_serialized_999").write_bytes(b"int8 engine from set A's table")
    assert not reusable(json.loads((cache / MANIFEST).read_text()), str(cache), "set-B", OPT)
    PaddleStandIn.created = []
    got = ensure_table(files, opts, "rec", real_batches, lambda f: PaddleStandIn(f, str(cache)), digest="set-B")
    # The old tables went first, so the calibration predictor did not take them as found.
    assert PaddleStandIn.created[0]["calibrating"] and got["set"] == "set-B" and got["reused"] is False
    assert not (cache / "trt_serialized_999").exists()
    os.remove(cache / "trt_calib_222")
    PaddleStandIn.created = []
    assert ensure_table(files, opts, "rec", real_batches, lambda f: PaddleStandIn(f, str(cache)),
                        digest="set-B")["reused"] is False
    assert len(PaddleStandIn.created) == 1 and (cache / "trt_calib_222").exists()


def test_refusals_say_what_to_do(tmp_path):
    files, cache = model(tmp_path), tmp_path / "cache"
    cache.mkdir()

    def create(f):
        return PaddleStandIn(f, str(cache), writes=False)

    with pytest.raises(ConfigError, match=r"rec: TensorRT int8 calibration wrote no table after 3 batches of "
                                          r"\[2, 3, 32, 64\].*precision: fp16 or fp32"):
        ensure_table(files, int8_options(cache), "rec", real_batches, create, digest="d")
    assert sorted(os.listdir(cache)) == []  # no manifest, no copy left behind
    no_cache = PredictorOptions(device="gpu", tensorrt={"precision": "int8", "input_shapes": SHAPES})
    with pytest.raises(ConfigError, match="keeps its calibration table in the engine cache.*tensorrt.cache_dir"):
        ensure_table(files, no_cache, "det", real_batches, create)
    with pytest.raises(ConfigError, match="needs tensorrt.input_shapes"):
        ensure_table(files, int8_options(cache, None), "det", real_batches, create)
    with pytest.raises(ConfigError, match="calibrated on real images in a Serve replica"):
        ensure_table(files, int8_options(cache), "det", None, create)
    with pytest.raises(ConfigError, match=r"must all be the opt shape \[2, 3, 32, 64\]"):
        ensure_table(files, int8_options(cache), "rec", lambda s: [np.zeros((1, 3, 32, 64), np.float32)], create)


def test_the_offline_command_plans_what_each_replica_would_feed(capsys):
    from serve_app.tools import calibrate_int8

    assert calibrate_int8.main(["--plan", "--precision", "int8"]) == 0
    out = capsys.readouterr().out.splitlines()
    plan = ["det: 2 batches of [8, 3, 640, 640] (16 inputs from the packaged real images) -> an entry under "
            "/tmp/ocr_trt_cache/det",
            "cls: skipped: no tensorrt in this stage's predictor",
            "rec: 9 batches of [16, 3, 48, 320] (144 inputs from the packaged real images) -> an entry under "
            "/tmp/ocr_trt_cache/rec"]
    assert out == ["model set ppocrv6_small"] + plan  # the profile's default set, whose replicas calibrate
    assert calibrate_int8.main(["--plan", "--stage", "rec"]) == 0  # the profile as shipped: rec fp16
    assert capsys.readouterr().out.splitlines()[1] == "rec: skipped: tensorrt.precision fp16: nothing to calibrate"
    # A further set of the catalogue: its own pre-processing, the same closed shapes.
    assert calibrate_int8.main(["--plan", "--precision", "int8", "--model", "ppocrv4_mobile"]) == 0
    assert capsys.readouterr().out.splitlines() == ["model set ppocrv4_mobile"] + plan
    with pytest.raises(SystemExit, match="the profile serves ppocrv6_small, ppocrv4_mobile, ppocrv6_tiny"):
        calibrate_int8.main(["--plan", "--model", "nope"])


def test_the_offline_command_calibrates_on_the_sets_own_inputs():
    """The default set's detector (v6 small) is calibrated on inputs
    normalised as its replicas normalise them (ImageNet mean/std), not as
    v4's (its files: tests/integration/test_gpu_profile.py)."""
    from serve_app.inference.int8_calibration import stage_inputs
    from serve_app.tools.calibrate_int8 import stage_plan
    from serve_app.tools.collect_shapes import REPO, load_args, set_engine

    app_args = load_args(REPO / "deployments.gpu.yaml")
    small, v4 = set_engine(app_args), set_engine(app_args, "ppocrv4_mobile")
    assert (small.model, v4.model) == ("ppocrv6_small", "ppocrv4_mobile")
    plan = stage_plan(app_args, "det", "int8")
    batch = stage_inputs("det", small)(plan["opt"])[0]
    v4_batch = stage_inputs("det", v4)(plan["opt"])[0]
    assert batch.shape == v4_batch.shape == tuple(plan["opt"]) and not np.allclose(batch, v4_batch)


def test_a_failed_run_destroys_the_predictor_before_its_folder_goes(tmp_path):
    """Paddle's destructor writes the table into the copy's folder (and would
    fail to make its _opt_cache were the folder already gone)."""
    files, cache = model(tmp_path), tmp_path / "cache"
    seen = {}

    class Failing(PaddleStandIn):
        def run(self):
            if len(self.fed) == 2:
                raise RuntimeError("CUDA error: out of memory")

        def __del__(self):
            seen["folder_there_when_destroyed"] = self.program_dir.exists()
            super().__del__()

    with pytest.raises(RuntimeError, match="out of memory"):
        ensure_table(files, int8_options(cache), "rec", real_batches, lambda f: Failing(f, str(cache)), digest="d")
    assert seen == {"folder_there_when_destroyed": True}
    assert os.listdir(cache) == []  # the copy removed, no manifest: the next start calibrates again
