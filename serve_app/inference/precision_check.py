"""fp16 / int8 only where it reads what fp32 reads, judged on what users see.

fp16 has bad accuracy reports for PP-OCRv4 elsewhere, and nothing here has
run it on a GPU. So at start a TensorRT stage below fp32 reads real images
with its engine and with a plain fp32 predictor (Paddle's GPU kernels) on
the same GPU, and is compared within a bound:
- rec: the character error rate of its texts against fp32's, on the real
  word crops (serve_app/inference/calibration/words) and the line crops of
  the packaged pages: at most REC_MAX_CER;
- det: the mean IoU of its boxes against fp32's on the packaged pages
  (serve_app/inference/calibration/set.json), boxes paired one to one, best
  IoU first, a box without a partner counting 0: at least DET_MIN_IOU;
- cls: the same crops as rec, upright and turned 180 degrees: at least
  CLS_MIN_AGREEMENT of the angle decisions identical.
A stage that misses its bound does not fail the app: it raises
PrecisionMismatch with the figure, and the replica rebuilds that stage at
fp32 and says so (serve_app.serving.replica.ModelReplica.check_precision).
int8 is calibrated on the same real images first (serve_app/inference/int8_calibration.py).
Pure: no paddle, no Ray (the caller passes the two readers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from serve_app.core.errors import ConfigError

REC_MAX_CER = 0.01  # a character in a hundred read otherwise than fp32 reads it
DET_MIN_IOU = 0.9  # mean IoU of the boxes against fp32's (a lost or a made-up box counts 0)
CLS_MIN_AGREEMENT = 0.98  # angle decisions identical to fp32's
BOX_IOU = 0.9  # a box "matched" in the report's differences: IoU at least this
WORDS = Path(__file__).resolve().parent / "calibration" / "words"
# How each stage's figure reads ("9/9 lines identical to fp32").
UNITS = {"rec": "lines identical to fp32", "cls": "angle decisions identical to fp32",
         "det": f"boxes matched to fp32's at IoU >= {BOX_IOU}"}


class PrecisionMismatch(Exception):
    """A stage below fp32 missed its bound: the message has the figure; the
    replica falls back to fp32."""


@dataclass(frozen=True)
class Agreement:
    identical: int
    total: int
    differing: list = field(default_factory=list)  # (name, fp32 answer, low-precision answer)
    unit: str = UNITS["rec"]
    cer: Optional[float] = None  # rec: character error rate against fp32
    mean_iou: Optional[float] = None  # det: mean box IoU against fp32

    @property
    def fraction(self) -> float:
        return self.identical / self.total if self.total else 0.0

    def as_dict(self) -> dict:
        return {"identical": self.identical, "total": self.total, "fraction": round(self.fraction, 4),
                "unit": self.unit, "cer": None if self.cer is None else round(self.cer, 5),
                "mean_iou": None if self.mean_iou is None else round(self.mean_iou, 4),
                "differing": [list(d) for d in self.differing[:10]]}


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (characters inserted, deleted or replaced)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def agreement(names: Sequence[str], reference: Sequence, candidate: Sequence, unit: str = UNITS["rec"]) -> Agreement:
    """Answers compared one by one (texts, angle labels)."""
    if not (len(names) == len(reference) == len(candidate)):
        raise ValueError("names, reference and candidate readings must be as many")
    differing = [(n, r, c) for n, r, c in zip(names, reference, candidate) if r != c]
    cer = None
    if unit == UNITS["rec"]:
        chars = sum(len(str(r)) for r in reference)
        cer = sum(edit_distance(str(r), str(c)) for r, c in zip(reference, candidate)) / max(chars, 1)
    return Agreement(len(names) - len(differing), len(names), differing, unit, cer=cer)


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


def paired_ious(reference: Sequence, candidate: Sequence) -> list[float]:
    """IoUs of the boxes paired one to one, best IoU first (pairs with any
    overlap)."""
    pairs = sorted(((quad_iou(r, c), i, j) for i, r in enumerate(reference) for j, c in enumerate(candidate)),
                   reverse=True)
    used_r, used_c, ious = set(), set(), []
    for iou, i, j in pairs:
        if iou <= 0:
            break
        if i not in used_r and j not in used_c:
            used_r.add(i)
            used_c.add(j)
            ious.append(iou)
    return ious


def match_boxes(reference: Sequence, candidate: Sequence, min_iou: float = BOX_IOU) -> int:
    """Pairs matched one to one, best IoU first, each at least min_iou."""
    return sum(1 for iou in paired_ious(reference, candidate) if iou >= min_iou)


def box_agreement(names: Sequence[str], reference: Sequence, candidate: Sequence,
                  min_iou: float = BOX_IOU) -> Agreement:
    """Per image, boxes matched at IoU >= min_iou, out of the larger of the
    two counts (a box lost and a box made up both count against it)."""
    if not (len(names) == len(reference) == len(candidate)):
        raise ValueError("names, reference and candidate boxes must be as many")
    matched = total = 0
    iou_sum = 0.0
    differing = []
    for n, r, c in zip(names, reference, candidate):
        ious = paired_ious(r, c)
        m = sum(1 for iou in ious if iou >= min_iou)
        t = max(len(r), len(c))
        matched += m
        total += t
        iou_sum += sum(ious)
        if m < t:
            differing.append((n, f"{len(r)} boxes", f"{len(c)} boxes, {m} matched"))
    return Agreement(matched, total, differing, UNITS["det"], mean_iou=iou_sum / total if total else None)


def decide(stage: str, precision: str, a: Agreement) -> str:
    """The start-up log line when the stage may serve at `precision`;
    PrecisionMismatch with the figure (and the first differences) when it
    misses its bound; a ConfigError when there was nothing to compare."""
    if a.total == 0:
        raise ConfigError(f"{stage}: TensorRT {precision} needs an agreement check on real images, and none "
                          f"were found ({WORDS.parent}): reinstall the package, or set tensorrt.precision: fp32")
    if stage == "rec":
        ok = (a.cer or 0.0) <= REC_MAX_CER
        figure = (f"CER {100 * (a.cer or 0.0):.2f}% against fp32 (bound {100 * REC_MAX_CER:.1f}%), "
                  f"{a.identical}/{a.total} {a.unit}")
    elif stage == "det":
        ok = (a.mean_iou or 0.0) >= DET_MIN_IOU
        figure = (f"mean box IoU {a.mean_iou or 0.0:.3f} against fp32 (bound {DET_MIN_IOU}), "
                  f"{a.identical}/{a.total} {a.unit}")
    else:
        ok = a.fraction >= CLS_MIN_AGREEMENT
        figure = f"{a.identical}/{a.total} {a.unit} ({100 * a.fraction:.1f}%, bound {100 * CLS_MIN_AGREEMENT:.0f}%)"
    if not ok:
        diffs = "; ".join(f"{n}: fp32 {r!r} vs {precision} {c!r}" for n, r, c in a.differing[:3])
        raise PrecisionMismatch(f"{stage}: TensorRT {precision} misses its bound: {figure} ({diffs})")
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
          read_reference: Callable[[list], list], read_candidate: Callable[[list], list]
          ) -> tuple[Optional[str], Agreement, Optional[str]]:
    """(the log line when it agrees, the figures, the warning when it does
    not: the caller then serves the stage at fp32)."""
    ref = answers(stage, read_reference(list(items)))
    cand = answers(stage, read_candidate(list(items)))
    a = box_agreement(names, ref, cand) if stage == "det" else agreement(names, ref, cand, UNITS[stage])
    try:
        return decide(stage, precision, a), a, None
    except PrecisionMismatch as e:
        return None, a, str(e)
