"""fp16 / int8 only after an agreement check against fp32 on real images.

fp16 has bad accuracy reports for PP-OCRv4 elsewhere, and nothing here has
run it on a GPU. So a TensorRT stage below fp32 is let start only when its
answers on real images agree with fp32's, read with its TensorRT engine and
with a plain fp32 predictor (Paddle's GPU kernels) on the same GPU; below
THRESHOLD it refuses to start, giving the figure:
- rec: the real word crops (serve_app/inference/calibration/words) and the line crops
  of the packaged pages: share of identical texts;
- det: the packaged pages (serve_app/inference/calibration/set.json): share of boxes
  matched one to one at IoU >= 0.9 (of the larger of the two counts, so a
  missing and an extra box both count against it);
- cls: the same crops as rec, upright and turned 180 degrees: share of
  identical angle decisions.
int8 is calibrated on the same real images first (serve_app/inference/int8_calibration.py).
Pure: no paddle, no Ray (the caller passes the two readers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from serve_app.core.errors import ConfigError

THRESHOLD = 0.995
BOX_IOU = 0.9  # a low-precision box is the fp32 box when their IoU is at least this
WORDS = Path(__file__).resolve().parent / "calibration" / "words"
# How each stage's figure reads ("9/9 lines identical to fp32").
UNITS = {"rec": "lines identical to fp32", "cls": "angle decisions identical to fp32",
         "det": f"boxes matched to fp32's at IoU >= {BOX_IOU}"}


@dataclass(frozen=True)
class Agreement:
    identical: int
    total: int
    differing: list = field(default_factory=list)  # (name, fp32 answer, low-precision answer)
    unit: str = UNITS["rec"]

    @property
    def fraction(self) -> float:
        return self.identical / self.total if self.total else 0.0

    def as_dict(self) -> dict:
        return {"identical": self.identical, "total": self.total, "fraction": round(self.fraction, 4),
                "unit": self.unit, "differing": [list(d) for d in self.differing[:10]]}


def agreement(names: Sequence[str], reference: Sequence, candidate: Sequence, unit: str = UNITS["rec"]) -> Agreement:
    """Answers compared one by one (texts, angle labels)."""
    if not (len(names) == len(reference) == len(candidate)):
        raise ValueError("names, reference and candidate readings must be as many")
    differing = [(n, r, c) for n, r, c in zip(names, reference, candidate) if r != c]
    return Agreement(len(names) - len(differing), len(names), differing, unit)


def quad_iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two convex quadrilaterals (4x2 corner arrays: the detector's
    boxes are minimum-area rectangles, so convex)."""
    import cv2

    a = np.asarray(a, dtype=np.float32).reshape(4, 2)
    b = np.asarray(b, dtype=np.float32).reshape(4, 2)
    area_a, area_b = abs(cv2.contourArea(a)), abs(cv2.contourArea(b))
    if area_a <= 0 or area_b <= 0:
        return 0.0
    inter, _ = cv2.intersectConvexConvex(a, b)
    inter = max(0.0, float(inter))
    return inter / (area_a + area_b - inter)


def match_boxes(reference: Sequence, candidate: Sequence, min_iou: float = BOX_IOU) -> int:
    """Pairs matched one to one, best IoU first, each at least min_iou."""
    pairs = sorted(((quad_iou(r, c), i, j) for i, r in enumerate(reference) for j, c in enumerate(candidate)),
                   reverse=True)
    used_r, used_c, matched = set(), set(), 0
    for iou, i, j in pairs:
        if iou < min_iou:
            break
        if i not in used_r and j not in used_c:
            used_r.add(i)
            used_c.add(j)
            matched += 1
    return matched


def box_agreement(names: Sequence[str], reference: Sequence, candidate: Sequence,
                  min_iou: float = BOX_IOU) -> Agreement:
    """Per image, boxes matched at IoU >= min_iou, out of the larger of the
    two counts (a box lost and a box made up both count against it)."""
    if not (len(names) == len(reference) == len(candidate)):
        raise ValueError("names, reference and candidate boxes must be as many")
    matched = total = 0
    differing = []
    for n, r, c in zip(names, reference, candidate):
        m = match_boxes(r, c, min_iou)
        t = max(len(r), len(c))
        matched += m
        total += t
        if m < t:
            differing.append((n, f"{len(r)} boxes", f"{len(c)} boxes, {m} matched"))
    return Agreement(matched, total, differing, UNITS["det"])


def decide(stage: str, precision: str, a: Agreement, threshold: float = THRESHOLD) -> str:
    """The start-up log line when the stage may serve at `precision`; a
    ConfigError with the figure (and the first differences) when not."""
    if a.total == 0:
        raise ConfigError(f"{stage}: TensorRT {precision} needs an agreement check on real images, and none "
                          f"were found ({WORDS.parent}): reinstall the package, or set tensorrt.precision: fp32")
    figure = f"{a.identical}/{a.total} {a.unit} ({100 * a.fraction:.1f}%, need {100 * threshold:.1f}%)"
    if a.fraction < threshold:
        diffs = "; ".join(f"{n}: fp32 {r!r} vs {precision} {c!r}" for n, r, c in a.differing[:3])
        raise ConfigError(f"{stage}: TensorRT {precision} refused: {figure} ({diffs}); "
                          "set tensorrt.precision: fp32 for this stage")
    return f"{stage}: TensorRT {precision} agrees with fp32: {figure}"


def precision_policy(stage: str, precision: str) -> bool:
    """True when the stage needs the agreement check before it serves
    (every stage below fp32: rec, det and cls each have their measure)."""
    if stage not in UNITS:
        raise ConfigError(f"{stage}: no agreement measure for this stage; set its tensorrt.precision: fp32")
    return precision != "fp32"


def word_crops(read_image: Callable[[str], object]) -> tuple[list[str], list]:
    """The real word crops kept in the package, as (names, images)."""
    paths = sorted(p for p in WORDS.glob("*.jpg"))
    return [p.name for p in paths], [read_image(str(p)) for p in paths]


def check_items(stage: str, read_image: Callable[[str], Any]) -> tuple[list[str], list]:
    """What a stage is checked on, named: pages for det, line and word
    crops for rec, the same crops upright and turned for cls."""
    from serve_app.inference.int8_calibration import load_set, page_crops

    cal = load_set()
    if stage == "det":
        return [p.name for p in cal.pages], [read_image(str(p)) for p in cal.pages]
    names, crops = page_crops(cal, read_image)
    if stage == "cls":
        return names + [f"{n} (turned)" for n in names], crops + [np.rot90(c, 2) for c in crops]
    return names, crops


def answers(stage: str, out: Sequence) -> list:
    """What is compared of a stage's output: texts, angle labels, boxes."""
    if stage == "rec":
        return [r.text if hasattr(r, "text") else r for r in out]
    if stage == "cls":
        return [d.label if hasattr(d, "label") else d for d in out]
    return list(out)


def check(stage: str, precision: str, names: Sequence[str], items: Sequence,
          read_reference: Callable[[list], list], read_candidate: Callable[[list], list],
          threshold: float = THRESHOLD) -> tuple[str, Agreement]:
    ref = answers(stage, read_reference(list(items)))
    cand = answers(stage, read_candidate(list(items)))
    a = box_agreement(names, ref, cand) if stage == "det" else agreement(names, ref, cand, UNITS[stage])
    return decide(stage, precision, a, threshold), a
