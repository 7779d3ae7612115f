"""The correctness canary: a golden input each model stage must read the
same way, checked by every model replica on its own predictor before it is
ready, every `canary_interval_s`, and after every reconfigure of a
running replica (Serve's first, as it starts the replica, comes right
after the read before ready). A mismatch fails the replica's health
check, so Serve replaces it.

The golden image is drawn here (one black word on white, OpenCV's Hershey
font), so it ships with the package; the text it must read is GOLDEN_TEXT
(an integration test runs it through the engine). No Ray import.

The one test hook: with the environment variable OCR_TEST_REC_FAULT_FILE set
in a recogniser replica, the replica that first claims that file (renames
it) wraps its predictor in PermutedPredictor (its character scores shifted
by one: wrong text). Unset, nothing here changes a predictor."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import cv2
import numpy as np

GOLDEN_TEXT = "CANARY"
_FONT, _SCALE, _THICK, _MARGIN = cv2.FONT_HERSHEY_SIMPLEX, 1.6, 3, 32
FAULT_ENV = "OCR_TEST_REC_FAULT_FILE"


def golden_text_rect() -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of the drawn word in the golden image."""
    (tw, th), base = cv2.getTextSize(GOLDEN_TEXT, _FONT, _SCALE, _THICK)
    return _MARGIN, _MARGIN - 8, _MARGIN + tw, _MARGIN - 8 + th + base


def golden_image() -> np.ndarray:
    """BGR uint8, about 100 x 260: GOLDEN_TEXT in black on white."""
    x0, y0, x1, y1 = golden_text_rect()
    img = np.full((y1 + _MARGIN, x1 + _MARGIN, 3), 255, np.uint8)
    (_, th), _ = cv2.getTextSize(GOLDEN_TEXT, _FONT, _SCALE, _THICK)
    cv2.putText(img, GOLDEN_TEXT, (x0, y0 + th), _FONT, _SCALE, (0, 0, 0), _THICK, cv2.LINE_AA)
    return img


def golden_crop() -> np.ndarray:
    """The word's line crop (a few pixels of margin), what the pipeline would
    hand the classifier and the recogniser."""
    x0, y0, x1, y1 = golden_text_rect()
    return np.ascontiguousarray(golden_image()[max(0, y0 - 6): y1 + 6, max(0, x0 - 6): x1 + 6])


@dataclass(frozen=True)
class CanaryResult:
    ok: bool
    detail: str


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def check_boxes(boxes: np.ndarray, scale_xy: tuple[float, float] = (1.0, 1.0), min_iou: float = 0.5) -> CanaryResult:
    """One box, roughly where the word was drawn (IoU of its bounding
    rectangle with the word's, in the image the detector saw: golden image
    coordinates times scale_xy)."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4, 2)
    if len(boxes) != 1:
        return CanaryResult(False, f"detector found {len(boxes)} boxes on the golden image, expected 1")
    sx, sy = scale_xy
    x0, y0, x1, y1 = golden_text_rect()
    want = (x0 * sx, y0 * sy, x1 * sx, y1 * sy)
    got = (*boxes[0].min(axis=0), *boxes[0].max(axis=0))
    iou = _iou(want, got)
    if iou < min_iou:
        return CanaryResult(False, f"detector's golden box {np.round(got, 1).tolist()} is off the word "
                                   f"{np.round(want, 1).tolist()} (IoU {iou:.2f} < {min_iou})")
    return CanaryResult(True, f"1 box, IoU {iou:.2f}")


def check_direction(labels: Sequence[str]) -> CanaryResult:
    if list(labels) != ["0"]:
        return CanaryResult(False, f"classifier read the upright golden crop as {list(labels)}, expected ['0']")
    return CanaryResult(True, "upright")


def check_text(texts: Sequence[str]) -> CanaryResult:
    if list(texts) != [GOLDEN_TEXT]:
        return CanaryResult(False, f"recogniser read the golden crop as {list(texts)}, expected [{GOLDEN_TEXT!r}]")
    return CanaryResult(True, f"read {GOLDEN_TEXT!r}")


class CanaryFailed(RuntimeError):
    """A model replica's golden check failed: the replica is unhealthy."""


class Canary:
    """When a replica's golden check is due, and what it last said. Once
    failed, it stays failed (the replica is to be replaced, not trusted
    again). `probe` runs the check and returns a CanaryResult; `on_result`
    (ok: bool) is told of every run (metrics)."""

    def __init__(self, stage: str, interval_s: float, clock: Callable[[], float] = time.monotonic,
                 on_result: Optional[Callable[[bool], None]] = None):
        self.stage = stage
        self.interval_s = interval_s
        self.clock = clock
        self.on_result = on_result
        self.runs = 0
        self.failures = 0
        self.last: Optional[CanaryResult] = None
        self.failed: Optional[CanaryResult] = None
        self._last_run: Optional[float] = None
        self._due = True

    def mark_due(self) -> None:
        """Run at the next chance (after a reconfigure)."""
        self._due = True

    def due(self) -> bool:
        if self.failed is not None:
            return False
        if self._due or self._last_run is None:
            return True
        return self.interval_s > 0 and self.clock() - self._last_run >= self.interval_s

    def record(self, result: CanaryResult) -> CanaryResult:
        self.runs += 1
        self.last = result
        self._last_run = self.clock()
        self._due = False
        if not result.ok:
            self.failures += 1
            self.failed = result
        if self.on_result is not None:
            self.on_result(result.ok)
        return result

    def run(self, probe: Callable[[], CanaryResult]) -> CanaryResult:
        try:
            result = probe()
        except Exception as e:  # a predictor that raises on the golden input is as wrong as one that misreads it
            result = CanaryResult(False, f"{type(e).__name__}: {e}")
        return self.record(result)

    def raise_if_failed(self) -> None:
        if self.failed is not None:
            raise CanaryFailed(f"{self.stage} canary failed: {self.failed.detail}")

    def stats(self) -> dict[str, Any]:
        return {"runs": self.runs, "failures": self.failures, "interval_s": self.interval_s,
                "last": None if self.last is None else {"ok": self.last.ok, "detail": self.last.detail}}


class PermutedPredictor:
    """Test hook only (see FAULT_ENV): the real predictor, with its output's
    last axis (the recogniser's character scores) rolled by one, so every
    character is read as the next one in the dictionary."""

    def __init__(self, inner: Any):
        self.inner = inner

    def run(self, x: np.ndarray) -> np.ndarray:
        return np.roll(self.inner.run(x), 1, axis=-1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def claim_fault(environ=os.environ) -> bool:
    """True in the one replica that claims the fault file named by
    FAULT_ENV (an atomic rename: two replicas never both get it); False when
    the variable is unset or the file is gone."""
    path = environ.get(FAULT_ENV)
    if not path:
        return False
    try:
        os.rename(path, f"{path}.claimed.{os.getpid()}")
    except OSError:
        return False
    return True


# -- each stage's probe, over its runner (serve_app.inference.runners) -------------------


def detector_probe(detector: Any, pipeline_opts: Any) -> Callable[[], CanaryResult]:
    """The golden image prepared as the pipeline prepares any image, through
    `detector` (a TextDetector that records no batches): one box on the word."""
    from serve_app.ocr.det_preprocess import boxes_to_original, prepare_image

    def probe() -> CanaryResult:
        work, geometry = prepare_image(golden_image(), pipeline_opts)
        return check_boxes(boxes_to_original(detector.detect([work])[0], geometry))

    return probe


def classifier_probe(classifier: Any) -> Callable[[], CanaryResult]:
    return lambda: check_direction([d.label for d in classifier.classify([golden_crop()])])


def recognizer_probe(recognizer: Any, environ=os.environ) -> Callable[[], CanaryResult]:
    """The golden crop's exact text. Where the test hook is set and this
    replica claims it, the recogniser's predictor is made to misread first."""

    def probe() -> CanaryResult:
        if claim_fault(environ):
            recognizer.predictor = PermutedPredictor(recognizer.predictor)
        return check_text([r.text for r in recognizer.recognize([golden_crop()])])

    return probe
