"""TensorRT shape ranges from the stages' closed input sets: min/opt/max for
every dimension, batch included, hold every shape a replica can be given.
Pure: no paddle, no Ray."""

from __future__ import annotations

import random
from pathlib import Path

import collections

import pytest
import yaml

from serve_app.app import with_shape_ranges
from serve_app.core.engine_config import (
    ClsOptions, DetOptions, EngineConfig, PredictorOptions, RecOptions, TensorRTOptions,
)
from serve_app.core.errors import ConfigError
from serve_app.core.app_args import AppArgs, ClassifierArgs, RecognizerArgs
from serve_app.inference.shape_ranges import (
    ShapeRange, collection_runs, paddle_opt, cls_shapes, det_shapes, missing, range_of, rec_shapes, shapes_key,
    stage_shapes,
)
from serve_app.ocr.det_preprocess import det_input_shapes, det_layout
from serve_app.ocr.recognition import batch_limit, batch_width, input_shapes

REPO = Path(__file__).resolve().parents[2]


def gpu_args() -> AppArgs:
    cfg = yaml.safe_load((REPO / "deployments.gpu.yaml").read_text())
    return AppArgs.model_validate(cfg["applications"][0]["args"])


def test_range_of_is_the_box_with_opt_at_full_batch_and_median_size():
    r = range_of([(1, 3, 64, 320), (2, 3, 64, 640), (4, 3, 48, 960)])
    # opt: at the largest (configured) batch, a shape of the set at that batch.
    assert r == ShapeRange((1, 3, 48, 320), (4, 3, 48, 960), (4, 3, 64, 960))
    assert r.contains((3, 3, 50, 700)) and not r.contains((5, 3, 64, 640)) and not r.contains((1, 3, 64))
    assert range_of([(n, 3, 48, w) for n in (1, 2) for w in (320, 640, 960)]).opt == (2, 3, 48, 640)


def test_range_of_refuses_nothing_or_non_nchw():
    with pytest.raises(ValueError):
        range_of([])
    with pytest.raises(ValueError):
        range_of([(1, 3, 48)])


# --- detector: 21 ladder shapes x batch 1..det.batch_size ----------------------------------------


def test_detector_set_is_every_ladder_shape_at_every_batch_size():
    det = DetOptions(batch_size=8)
    shapes = det_shapes(det)
    assert len(det_input_shapes(det)) == 21
    assert len(shapes) == 21 * 8 == len(set(shapes))
    r = range_of(shapes)
    assert r.min[0] == 1 and r.max[0] == 8  # the batch dimension too (collect_shapes used to record 1 only)
    assert r.max[2:] == (1280, 1280)
    assert r.min[2:] == (min(h for h, _ in det_input_shapes(det)), min(w for _, w in det_input_shapes(det)))
    assert missing(shapes, r) == []


def test_every_image_size_lands_in_the_detector_range():
    det = DetOptions(batch_size=8)
    r = range_of(det_shapes(det))
    rnd = random.Random(14)
    sizes = [(rnd.randint(1, 4000), rnd.randint(1, 4000)) for _ in range(2000)]
    sizes += [(1, 1), (10, 4000), (4000, 10), (30, 30), (1280, 1280), (1281, 1), (2000, 2000)]
    for h, w in sizes:
        ih, iw = det_layout(h, w, det)[1]
        for n in (1, det.batch_size):
            assert r.contains((n, 3, ih, iw)), (h, w, ih, iw)


def test_open_detector_modes_have_no_range_and_say_so():
    with pytest.raises(ConfigError, match="limit_type: ladder"):
        det_shapes(DetOptions(limit_type="max"))


# --- recogniser: width ladder x batch limits --------------------------------------------------------


def test_recogniser_set_is_the_width_ladder_at_each_batch_limit():
    rec = RecOptions(batch_size=16)
    shapes = rec_shapes(rec)
    assert len(shapes) == len(input_shapes(rec))
    r = range_of(shapes)
    assert r.min == (1, 3, 48, 320)
    assert r.max == (16, 3, 48, 3200)
    assert missing(shapes, r) == []


def test_every_crop_lands_in_the_recogniser_range():
    rec = RecOptions(batch_size=16)
    r = range_of(rec_shapes(rec))
    for ratio in [0.05, 0.5, 1, 3, 6.6, 7, 20, 66.6, 67, 200, 10_000]:
        w = batch_width([ratio], rec)
        for n in range(1, batch_limit(w, rec) + 1):
            assert r.contains((n, 3, rec.image_height, w)), (ratio, n, w)


def test_open_recogniser_widths_have_no_range_and_say_so():
    with pytest.raises(ConfigError, match="width_ladder"):
        rec_shapes(RecOptions(batch_padding="batch_max"))
    with pytest.raises(ConfigError):
        rec_shapes(RecOptions(width_ladder=[]))


def test_classifier_set_is_one_crop_shape_at_each_batch_size():
    assert range_of(cls_shapes(ClsOptions(batch_size=6))) == ShapeRange((1, 3, 48, 192), (6, 3, 48, 192), (6, 3, 48, 192))


# --- the GPU profile as the app builder hands it to replicas -------------------------------------


def test_gpu_profile_gives_tensorrt_every_input_shape_and_a_matching_max_batch():
    a = gpu_args()
    det = with_shape_ranges("det", a.detector, a.engine).predictor.tensorrt
    rec = with_shape_ranges("rec", a.recognizer, a.engine).predictor.tensorrt
    assert [tuple(s) for s in det.input_shapes] == det_shapes(a.engine.det)
    assert det.max_batch_size == a.engine.det.batch_size == 8
    assert [tuple(s) for s in rec.input_shapes] == rec_shapes(a.engine.rec)
    assert rec.max_batch_size == max(n for n, _ in input_shapes(a.engine.rec)) == 16
    assert det.allow_build_at_runtime is False and rec.allow_build_at_runtime is False
    # The classifier runs plain Paddle on the GPU there: nothing to add.
    assert with_shape_ranges("cls", a.classifier, a.engine) == a.classifier


def test_stages_without_tensorrt_are_left_alone():
    args = RecognizerArgs(predictor=PredictorOptions())
    assert with_shape_ranges("rec", args, EngineConfig()) is args


def test_a_stage_on_the_engine_predictor_gets_the_ranges_too():
    eng = EngineConfig(predictor=PredictorOptions(device="gpu", tensorrt=TensorRTOptions()))
    got = with_shape_ranges("cls", ClassifierArgs(), eng).predictor.tensorrt
    assert got.max_batch_size == eng.cls.batch_size and len(got.input_shapes) == eng.cls.batch_size


def test_shape_file_key_changes_with_shapes_model_and_precision():
    s = [(1, 3, 48, 320), (2, 3, 48, 320)]
    k = shapes_key(s, "m", "fp16")
    assert k == shapes_key(list(reversed(s)), "m", "fp16")
    assert len({k, shapes_key(s[:1], "m", "fp16"), shapes_key(s, "n", "fp16"), shapes_key(s, "m", "fp32")}) == 4


# --- one writer per engine cache ------------------------------------------------------------------


def test_tuned_shape_file_lives_in_the_cache_dir_named_by_its_shape_set(tmp_path):
    from serve_app.inference.predictor import tuned_shape_file
    from serve_app.inference.weights import ModelFiles

    files = ModelFiles("rec", tmp_path / "inference.pdmodel", tmp_path / "inference.pdiparams")
    shapes = rec_shapes(RecOptions())
    trt = TensorRTOptions(cache_dir=str(tmp_path / "cache"), input_shapes=shapes)
    path = tuned_shape_file(files, trt)
    assert path.startswith(str(tmp_path / "cache")) and shapes_key(shapes, str(files.program), "fp16|opt=served") in path
    assert tuned_shape_file(files, trt.model_copy(update={"shape_range_info_path": "/x.pbtxt"})) == "/x.pbtxt"
    assert tuned_shape_file(files, TensorRTOptions()) is None


def test_the_build_lock_admits_one_holder_at_a_time(tmp_path):
    import threading
    import time

    from serve_app.inference.predictor import file_lock

    lock = str(tmp_path / "c" / ".rec.build.lock")
    inside, overlaps = [], []

    def builder(i):
        with file_lock(lock):
            if inside:
                overlaps.append(i)
            inside.append(i)
            time.sleep(0.05)
            inside.remove(i)

    threads = [threading.Thread(target=builder, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []


# --- #29 item 5: the optimum TensorRT is built for is the one served ------------------------


@pytest.mark.parametrize("stage, opt", [("det", (8, 3, 640, 640)), ("rec", (16, 3, 48, 320)), ("cls", (6, 3, 48, 192))])
def test_collection_makes_paddle_record_the_served_optimum(stage, opt):
    """Paddle takes each dimension's most frequent collected value as opt.
    Each shape run once, that is batch 1 (most shapes of the set have few
    crops per batch); with the collection runs it is the configured batch at
    the median shape, for every stage of the GPU profile."""
    a = gpu_args()
    shapes = stage_shapes(stage, a.engine.det, a.engine.cls, a.engine.rec)
    r = range_of(shapes)
    assert r.opt == opt and r.opt in shapes
    assert paddle_opt(shapes)[0] == 1  # what a single pass over the set would build for
    runs = collection_runs(shapes, r.opt)
    assert paddle_opt(runs) == r.opt
    assert set(runs) == set(shapes)  # min and max still come from the whole set
    # Any tensor derived from the input (here: height x width) gets opt's value too.
    assert collections.Counter(s[2] * s[3] for s in runs).most_common(1)[0][0] == r.opt[2] * r.opt[3]


def test_gpu_profile_gives_the_structure_models_their_one_shape_at_every_batch_size():
    a = gpu_args()
    layout = with_shape_ranges("layout", a.layout, a.engine).predictor.tensorrt
    table = with_shape_ranges("table", a.table, a.engine).predictor.tensorrt
    n_layout, n_table = 1, a.engine.structure.table_batch_size  # the layout graph takes one page at a time
    assert [tuple(s) for s in layout.input_shapes] == [(n, 3, 800, 608) for n in range(1, n_layout + 1)]
    assert [tuple(s) for s in table.input_shapes] == [(n, 3, 488, 488) for n in range(1, n_table + 1)]
    assert layout.max_batch_size == n_layout and table.max_batch_size == n_table
