"""TensorRT int8, calibrated on real images: the calibration pass and where
its table is kept. Read against Paddle's source, **not run** (no GPU here).

How Paddle Inference calibrates (Paddle's develop branch at f027356e,
2024-05-09, read in a fork's snapshot, tc20042008/Paddle; the same code in
every version of these files the search index holds back to 2.x; 3.3.1,
commit 7688495, is later and was not read line by line; paths under
paddle/fluid/):
1. `enable_tensorrt_engine(precision_mode=Int8, use_calib_mode=True)`
   records both (inference/api/analysis_config.cc:742-761).
2. When a predictor is created, the TensorRT subgraph pass looks for each
   subgraph's table, `trt_calib_<calibration key>`, in model_opt_cache_dir
   (inference/analysis/ir_passes/tensorrt_subgraph_pass.cc:753-759,
   inference/analysis/helper.h:206-227). model_opt_cache_dir is
   `set_optim_cache_dir`'s folder when one is set, else `<model dir>/_opt_cache/`
   (inference/analysis/ir_pass_manager.cc:222-241). The calibration key hashes
   the subgraph's input and output names, the precision and use_cuda_graph,
   not max_batch_size (tensorrt_subgraph_pass.cc:264-294, 733-751).
3. No table: that subgraph is in calibration mode (tensorrt_subgraph_pass.cc:797-801,
   operators/tensorrt/tensorrt_engine_op.h:214-215). No engine is built; each
   run computes with Paddle's own fp32 kernels and hands its inputs to
   TensorRT's entropy calibrator, which a builder thread consumes
   (tensorrt_engine_op.h:433-496, inference/tensorrt/trt_int8_calibrator.cc:66-132).
   The calibrator's device buffers are sized by the first run's tensors
   (tensorrt_engine_op.h:447-456) and no calibration profile is set, so
   TensorRT calibrates at its first optimisation profile
   (inference/tensorrt/engine.cc:250-258): every calibration batch must have
   one shape, and here it is the served opt (serve_app.inference.shape_ranges.range_of:
   the configured batch, which the tuned shape file records as opt).
4. The table is written when that predictor is destroyed (~AnalysisPredictor
   calls SaveTrtCalibToDisk, inference/api/analysis_predictor.cc:2908-2914),
   to `<model dir>/_opt_cache/trt_calib_<key>` (analysis_predictor.cc:2885-2899):
   the model's folder, *not* set_optim_cache_dir's. A replica with an engine
   cache dir would never find its own table (step 2 looks in the cache dir)
   and would calibrate on every start; and the model's folder may be
   read-only (site-packages in the image).
5. With a table found, the engine is built in int8 from it
   (tensorrt_subgraph_pass.cc:789-794; trt_int8_calibrator.cc:48-53, 140-145),
   serialized when use_static (tensorrt_subgraph_pass.cc:920-931) and
   deserialized on later starts (tensorrt_subgraph_pass.cc:874-884).

So, once per engine cache entry (under the stage's build lock,
serve_app.inference.predictor): copy the model files into a private folder of the
cache dir, create a predictor on the copy, run it over the packaged real
images (serve_app/inference/calibration: set.json) at the served opt shape, destroy it,
and move the tables it wrote into the copy's _opt_cache into the cache dir,
where the served predictor's subgraph pass finds them (step 2). A manifest
(int8_calibration.json) names the calibration set and the tables; a later
start with both present calibrates nothing. The cache entry's key holds the
set's digest (serve_app.inference.predictor.tensorrt_cache_dir): another set, another
entry. Then the int8 engine is checked against fp32 like fp16
(serve_app/inference/precision_check.py). This is the legacy-program (.pdmodel) path;
Paddle 3's inference.json programs go through another TensorRT path, not
read here. Pure: no paddle import (the caller passes `create`).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from serve_app.core.errors import ConfigError

CALIBRATION = Path(__file__).resolve().parent / "calibration"
SET_FILE = CALIBRATION / "set.json"
WORDS = CALIBRATION / "words"
MANIFEST = "int8_calibration.json"
TABLE_PREFIX = "trt_calib_"  # helper.h:206-209
ENGINE_PREFIX = "trt_serialized_"  # helper.h:229-232: engines, which an old table would have built

Shape = tuple[int, int, int, int]


@dataclass(frozen=True)
class CalibrationSet:
    """The packaged real images: pages (with the CPU engine's boxes on
    each) and word crops."""

    pages: tuple[Path, ...]
    boxes: tuple[tuple, ...]  # per page: the CPU engine's boxes, as 4x2 lists
    words: tuple[Path, ...]
    digest: str  # sha256 over set.json and every image's bytes


@lru_cache(maxsize=1)
def load_set(root: Path = CALIBRATION) -> CalibrationSet:
    doc = json.loads((root / "set.json").read_text())
    pages = tuple(root / p["file"] for p in doc["pages"])
    words = tuple(sorted((root / "words").glob("*.jpg")))
    h = hashlib.sha256((root / "set.json").read_bytes())
    for p in pages + words:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return CalibrationSet(pages, tuple(tuple(p["cpu"]["boxes"]) for p in doc["pages"]), words, h.hexdigest())


def set_digest() -> str:
    return load_set().digest[:16]


def batches_of(items: Sequence[np.ndarray], n: int) -> list[np.ndarray]:
    """Stacked batches of exactly n items; the last one filled up from the
    start of the set (the calibrator takes one batch shape only)."""
    if not items:
        raise ConfigError(f"no calibration inputs in {CALIBRATION}: reinstall the package")
    k = -(-len(items) // n)
    return [np.stack([items[(i * n + j) % len(items)] for j in range(n)]) for i in range(k)]


def letterbox(img: np.ndarray, h: int, w: int, opts) -> np.ndarray:
    """A page as the detector is given it at an (h, w) input: long side
    fitted, the rest padded (det.pad), normalised as det_preprocess does."""
    import cv2

    from serve_app.ocr.det_preprocess import pad_image

    s = min(h / img.shape[0], w / img.shape[1])
    rh, rw = max(1, min(h, round(img.shape[0] * s))), max(1, min(w, round(img.shape[1] * s)))
    x = pad_image(cv2.resize(img, (rw, rh)), h, w, opts.pad)
    mean = np.asarray(opts.mean, dtype=np.float32) * 255.0
    inv_std = 1.0 / (np.asarray(opts.std, dtype=np.float32) * 255.0)
    return np.ascontiguousarray(((x.astype(np.float32) - mean) * inv_std).transpose(2, 0, 1))


def page_crops(cal: CalibrationSet, read_image: Callable[[str], np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    """Line crops of the pages (at the CPU engine's boxes) and the word crops, named."""
    from serve_app.ocr.crop import crop_quad

    names, crops = [], []
    for page, boxes in zip(cal.pages, cal.boxes):
        img = read_image(str(page))
        for k, b in enumerate(boxes):
            names.append(f"{page.name}#{k}")
            crops.append(crop_quad(img, np.asarray(b, dtype=np.float32)))
    for w in cal.words:
        names.append(w.name)
        crops.append(read_image(str(w)))
    return names, crops


def det_inputs(cal: CalibrationSet, shape: Shape, opts, read_image) -> list[np.ndarray]:
    n, _, h, w = shape
    items = []
    for page in cal.pages:
        img = read_image(str(page))
        items.append(letterbox(img, h, w, opts))
        if img.shape[0] > h or img.shape[1] > w:  # and a window at full resolution
            y, x = (img.shape[0] - min(h, img.shape[0])) // 2, (img.shape[1] - min(w, img.shape[1])) // 2
            items.append(letterbox(img[y:y + h, x:x + w], h, w, opts))
    return batches_of(items, n)


def rec_inputs(cal: CalibrationSet, shape: Shape, opts, read_image) -> list[np.ndarray]:
    """Crops whose width bucket is the opt width (as served there: unsqueezed);
    all crops if none is."""
    from serve_app.ocr.recognition import batch_width, rec_preprocess

    n, _, _, w = shape
    _, crops = page_crops(cal, read_image)
    fit = [c for c in crops if batch_width([c.shape[1] / c.shape[0]], opts) == w] or crops
    return batches_of([rec_preprocess(c, w, opts) for c in fit], n)


def cls_inputs(cal: CalibrationSet, shape: Shape, opts, read_image) -> list[np.ndarray]:
    """Every crop's views, upright and turned 180 degrees (the classifier's
    two answers, both real text)."""
    from serve_app.ocr.direction import cls_preprocess, cls_views

    n = shape[0]
    _, crops = page_crops(cal, read_image)
    views = [v for c in crops for v in cls_views(c, opts)]
    return batches_of([cls_preprocess(v, opts) for v in views + [np.rot90(v, 2) for v in views]], n)


def stage_inputs(stage: str, engine, read_image: Optional[Callable] = None) -> Callable[[Shape], list[np.ndarray]]:
    """For a stage of an EngineConfig: opt shape -> its calibration batches."""
    if read_image is None:
        import cv2

        def read_image(p):
            return cv2.imread(p, cv2.IMREAD_COLOR)
    make, opts = {"det": (det_inputs, engine.det), "cls": (cls_inputs, engine.cls), "rec": (rec_inputs, engine.rec)}[stage]
    return lambda shape: make(load_set(), tuple(shape), opts, read_image)


# --- the table ----------------------------------------------------------------------------


def read_manifest(cache_dir: str) -> Optional[dict]:
    try:
        return json.loads(Path(cache_dir, MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def reusable(manifest: Optional[dict], cache_dir: str, digest: str, opt: Sequence[int]) -> bool:
    """A table made from this calibration set at this opt shape, every file present."""
    return bool(manifest and manifest.get("set") == digest and manifest.get("opt") == list(opt)
                and manifest.get("tables") and all(Path(cache_dir, t).is_file() for t in manifest["tables"]))


def _feed(predictor: Any, batches: Sequence[np.ndarray]) -> None:
    """Paddle's handle API: the model's one input, one run per batch."""
    inp = predictor.get_input_handle(predictor.get_input_names()[0])
    for x in batches:
        inp.reshape(list(x.shape))
        inp.copy_from_cpu(np.ascontiguousarray(x, dtype=np.float32))
        predictor.run()


def ensure_table(files, options, name: str, inputs: Optional[Callable[[Shape], list[np.ndarray]]],
                 create: Callable[[Any], Any], digest: Optional[str] = None) -> dict:
    """The int8 calibration table of this stage's engine cache entry:
    reused when the manifest says it was made from this set at this opt
    shape, else made now (module docstring). `create(files)`: a Paddle
    predictor (calibration mode) on those model files; stood in by tests.
    What happened, for the replica's stats and start-up log."""
    from serve_app.inference.shape_ranges import range_of
    from serve_app.inference.weights import ModelFiles

    trt = options.tensorrt
    if not trt.cache_dir:
        raise ConfigError(f"{name}: TensorRT int8 keeps its calibration table in the engine cache, and none is set: "
                          "set tensorrt.cache_dir (or cache_dir), or tensorrt.precision: fp16 / fp32")
    if not trt.input_shapes:
        raise ConfigError(f"{name}: TensorRT int8 calibrates at the served opt shape, which needs "
                          "tensorrt.input_shapes (a Serve replica gets them from the app builder); "
                          "or set tensorrt.precision: fp16 / fp32")
    if inputs is None:
        raise ConfigError(f"{name}: TensorRT int8 is calibrated on real images in a Serve replica "
                          "(or `python -m serve_app.tools.calibrate_int8`), not here: set tensorrt.precision: "
                          "fp16 / fp32 for in-process use")
    digest = digest or set_digest()
    opt = range_of(trt.input_shapes).opt
    cache = trt.cache_dir
    found = read_manifest(cache)
    if reusable(found, cache, digest, opt):
        return {**found, "reused": True}
    batches = inputs(opt)
    bad = [list(b.shape) for b in batches if tuple(b.shape) != tuple(opt)]
    if bad:
        raise ConfigError(f"{name}: calibration batches must all be the opt shape {list(opt)}; got {bad[:2]}")
    os.makedirs(cache, exist_ok=True)
    # A table of another set (or a half-done attempt) would be taken as found
    # by the calibration predictor itself, and engines built from it reused.
    for f in os.listdir(cache):
        if f.startswith((TABLE_PREFIX, ENGINE_PREFIX)) or f == MANIFEST:
            os.remove(os.path.join(cache, f))
    work = tempfile.mkdtemp(prefix=f".calibrate-{name}-", dir=cache)
    try:
        copy = ModelFiles(files.name, Path(work) / Path(files.program).name, Path(work) / Path(files.params).name)
        shutil.copyfile(files.program, copy.program)
        shutil.copyfile(files.params, copy.params)
        t0 = time.perf_counter()
        predictor = create(copy)
        try:
            _feed(predictor, batches)
        except BaseException as e:
            traceback.clear_frames(e.__traceback__)  # its frames hold the predictor too
            raise
        finally:
            # The table is written by the predictor's destructor (step 4), into the
            # copy's folder: destroyed here, before that folder is removed, also on
            # an error (Paddle's destructor would fail to make its _opt_cache).
            del predictor
            gc.collect()
        seconds = time.perf_counter() - t0
        made = sorted(p for p in (Path(work) / "_opt_cache").glob(f"{TABLE_PREFIX}*") if p.stat().st_size > 0)
        if not made:
            raise ConfigError(
                f"{name}: TensorRT int8 calibration wrote no table after {len(batches)} batches of {list(opt)} "
                f"(looked in {work}/_opt_cache; Paddle logs why: 'calibration table is empty' or no TensorRT "
                "subgraph): set tensorrt.precision: fp16 or fp32 for this stage")
        for p in made:
            os.replace(p, os.path.join(cache, p.name))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    manifest = {"set": digest, "opt": list(opt), "tables": [p.name for p in made], "batches": len(batches),
                "seconds": round(seconds, 2),
                "made_at": time.time()}
    tmp = os.path.join(cache, f"{MANIFEST}.{os.getpid()}.tmp")
    Path(tmp).write_text(json.dumps(manifest))
    os.replace(tmp, os.path.join(cache, MANIFEST))
    return {**manifest, "reused": False}
