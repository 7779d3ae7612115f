"""fp16 / int8 only after an agreement check against fp32 on real images.

fp16 has bad accuracy reports for PP-OCRv4 elsewhere, and nothing here has
run it on a GPU. So a TensorRT stage below fp32 is let start only when its
readings agree with fp32's: the recogniser reads the real word crops in
serve_app/inference/calibration/words with its TensorRT engine and with a plain fp32
predictor (Paddle's GPU kernels) on the same GPU, and refuses to start,
giving the figure, when fewer than THRESHOLD of them read identically.

Not built yet, and so refused at start with the reason: int8 (Paddle
calibrates on the inputs it is run with, and the warm-up's are synthetic; a
calibration pass over real images is not written), and fp16 for the
detector and classifier (no agreement measure for boxes or directions is
written). Pure: no paddle, no Ray (the caller passes the two readers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from serve_app.core.errors import ConfigError

THRESHOLD = 0.995
WORDS = Path(__file__).resolve().parent / "calibration" / "words"


@dataclass(frozen=True)
class Agreement:
    identical: int
    total: int
    differing: list = field(default_factory=list)  # (name, fp32 text, low-precision text)

    @property
    def fraction(self) -> float:
        return self.identical / self.total if self.total else 0.0

    def as_dict(self) -> dict:
        return {"identical": self.identical, "total": self.total, "fraction": round(self.fraction, 4),
                "differing": [list(d) for d in self.differing[:10]]}


def agreement(names: Sequence[str], reference: Sequence[str], candidate: Sequence[str]) -> Agreement:
    if not (len(names) == len(reference) == len(candidate)):
        raise ValueError("names, reference and candidate readings must be as many")
    differing = [(n, r, c) for n, r, c in zip(names, reference, candidate) if r != c]
    return Agreement(len(names) - len(differing), len(names), differing)


def decide(stage: str, precision: str, a: Agreement, threshold: float = THRESHOLD) -> str:
    """The start-up log line when the stage may serve at `precision`; a
    ConfigError with the figure (and the first differences) when not."""
    if a.total == 0:
        raise ConfigError(f"{stage}: TensorRT {precision} needs an agreement check on real images, and none "
                          f"were found ({WORDS}): reinstall the package, or set tensorrt.precision: fp32")
    figure = f"{a.identical}/{a.total} lines identical to fp32 ({100 * a.fraction:.1f}%, need {100 * threshold:.1f}%)"
    if a.fraction < threshold:
        diffs = "; ".join(f"{n}: fp32 {r!r} vs {precision} {c!r}" for n, r, c in a.differing[:3])
        raise ConfigError(f"{stage}: TensorRT {precision} refused: {figure} ({diffs}); "
                          "set tensorrt.precision: fp32 for this stage")
    return f"{stage}: TensorRT {precision} agrees with fp32: {figure}"


def precision_policy(stage: str, precision: str) -> bool:
    """True when the stage needs the agreement check before it serves; a
    ConfigError where the precision cannot be checked yet."""
    if precision == "fp32":
        return False
    if precision == "int8":
        raise ConfigError(f"{stage}: TensorRT int8 is refused: it would calibrate on the warm-up's synthetic "
                          "inputs, and a calibration pass over real images is not implemented; use fp32 (or fp16 "
                          "for the recogniser, checked at start)")
    if stage != "rec":
        raise ConfigError(f"{stage}: TensorRT {precision} is refused: only the recogniser's readings are checked "
                          f"against fp32 at start; set this stage's tensorrt.precision: fp32")
    return True


def word_crops(read_image: Callable[[str], object]) -> tuple[list[str], list]:
    """The real word crops kept in the package, as (names, images)."""
    paths = sorted(p for p in WORDS.glob("*.jpg"))
    return [p.name for p in paths], [read_image(str(p)) for p in paths]


def check(stage: str, precision: str, names: Sequence[str], crops: Sequence,
          read_reference: Callable[[list], list[str]], read_candidate: Callable[[list], list[str]],
          threshold: float = THRESHOLD) -> tuple[str, Agreement]:
    a = agreement(names, read_reference(list(crops)), read_candidate(list(crops)))
    return decide(stage, precision, a, threshold), a
