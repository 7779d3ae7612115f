"""TensorRT dynamic-shape ranges, known before serving: every model input a
replica can be given comes from a closed set (the detector's ladder of 21
input shapes times batch sizes 1..det.batch_size, the classifier's one crop
shape times 1..cls.batch_size, the recogniser's width ladder times its batch
limits), so min/opt/max over that set, batch dimension included, holds every
shape met in service. Pure: no paddle, no Ray.

How the predictor uses them (serve_app/inference/predictor.py): before building
TensorRT engines it runs the model once per shape of the set *without*
TensorRT, with Paddle's `collect_shape_range_info`, which records the range
of every tensor in the graph (TensorRT subgraphs start at inner tensors, not
only at the model input); then builds the engines from that file
(`enable_tuned_tensorrt_dynamic_shape(path, allow_build_at_runtime=False)`).
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from serve_app.core.engine_config import ClsOptions, DetOptions, RecOptions
from serve_app.core.errors import ConfigError
from serve_app.ocr.det_preprocess import det_input_shapes
from serve_app.ocr.recognition import input_shapes as rec_input_shapes

Shape = tuple[int, int, int, int]  # N, C, H, W


@dataclass(frozen=True)
class ShapeRange:
    """min/opt/max of one NCHW input: TensorRT's optimisation profile."""

    min: Shape
    opt: Shape
    max: Shape

    def contains(self, shape: Sequence[int]) -> bool:
        return len(shape) == 4 and all(lo <= s <= hi for lo, s, hi in zip(self.min, shape, self.max))

    def as_dict(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


def range_of(shapes: Iterable[Sequence[int]]) -> ShapeRange:
    """The smallest box holding every shape. opt (where TensorRT tunes its
    kernels): the configured batch (the set's largest, which full batches
    under load run at), at the shape of that batch nearest the median height
    and width: always a shape the stage is really given."""
    shapes = [tuple(int(d) for d in s) for s in shapes]
    if not shapes or any(len(s) != 4 for s in shapes):
        raise ValueError(f"need at least one NCHW shape; got {shapes[:3]}")
    lo = tuple(min(s[i] for s in shapes) for i in range(4))
    hi = tuple(max(s[i] for s in shapes) for i in range(4))
    full = sorted({s for s in shapes if s[0] == hi[0]})
    h = statistics.median_low([s[2] for s in full])
    w = statistics.median_low([s[3] for s in full])
    opt = min(full, key=lambda s: (abs(s[2] - h) + abs(s[3] - w), s[2] * s[3], s))
    return ShapeRange(lo, opt, hi)  # type: ignore[arg-type]


def paddle_opt(runs: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The opt shape Paddle's collect_shape_range_info records for a tensor
    given these runs: per dimension, the most frequent value (Paddle 3.x
    analysis_predictor.cc, StatisticShapeRangeInfo; ties unordered). A model
    of Paddle's rule, for tests and docs."""
    import collections

    return tuple(collections.Counter(r[d] for r in runs).most_common(1)[0][0] for d in range(len(runs[0])))


def collection_runs(shapes: Sequence[Shape], opt: Sequence[int]) -> list[Shape]:
    """The inputs the collection pass runs: every shape once (min and max),
    then `opt` len(shapes) more times, so that in every dimension of every
    tensor (inner ones too, whatever function of the input they are) the
    value opt gives is strictly the most frequent and Paddle records it as
    opt. Run once, every shape would count alike and Paddle would pick
    whichever value most shapes share in each dimension: batch 1 for the
    recogniser's set (most widths allow few crops), not the batch served."""
    opt = tuple(int(d) for d in opt)
    return [tuple(s) for s in shapes] + [opt] * len(shapes)  # type: ignore[misc]


def det_shapes(det: DetOptions) -> list[Shape]:
    """Every detector input: each ladder shape at each batch size."""
    hw = det_input_shapes(det)
    if not hw:
        raise ConfigError(
            f"TensorRT needs the detector's closed set of input shapes (det.limit_type: ladder); "
            f"det.limit_type {det.limit_type!r} sizes images openly, so no shape range holds them all: "
            "use limit_type: ladder, or drop `tensorrt:` from the detector's predictor")
    return [(n, 3, h, w) for h, w in hw for n in range(1, det.batch_size + 1)]


def cls_shapes(cls: ClsOptions) -> list[Shape]:
    c, h, w = cls.image_shape
    return [(n, c, h, w) for n in range(1, cls.batch_size + 1)]


def rec_shapes(rec: RecOptions) -> list[Shape]:
    """Every recogniser input: each ladder width at each batch size its
    column budget allows."""
    if rec.batch_padding != "bucket" or not rec.width_ladder:
        raise ConfigError(
            "TensorRT needs the recogniser's closed set of input shapes (rec.batch_padding: bucket and a "
            "rec.width_ladder); with batch_max padding or no ladder any width can reach the model: "
            "set both, or drop `tensorrt:` from the recogniser's predictor")
    return [(n, 3, rec.image_height, w) for n, w in rec_input_shapes(rec)]


def stage_shapes(stage: str, det: DetOptions, cls: ClsOptions, rec: RecOptions) -> list[Shape]:
    return {"det": lambda: det_shapes(det), "cls": lambda: cls_shapes(cls), "rec": lambda: rec_shapes(rec)}[stage]()


def shapes_key(shapes: Sequence[Sequence[int]], model: str = "", precision: str = "") -> str:
    """A short name for a shape set (with the model and precision it was
    collected for): the tuned-shape file of another set is never reused."""
    h = hashlib.sha256(repr((sorted(tuple(s) for s in shapes), model, precision)).encode()).hexdigest()
    return h[:16]


def missing(shapes: Iterable[Sequence[int]], rng: ShapeRange) -> list[tuple[int, ...]]:
    """Shapes of a set that a range does not hold (empty by construction)."""
    return [tuple(s) for s in shapes if not rng.contains(s)]


def describe(stage: str, shapes: Sequence[Shape], rng: Optional[ShapeRange] = None) -> str:
    rng = rng or range_of(shapes)
    return (f"{stage}: {len(shapes)} input shapes, batch {rng.min[0]}..{rng.max[0]}; "
            f"min {list(rng.min)} opt {list(rng.opt)} max {list(rng.max)}")
