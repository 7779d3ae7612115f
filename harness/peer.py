"""The peer images in tests/data/peer (copied, with their provenance, from
the project's shared data; see tests/data/peer/README.md) and how results
are compared with them. Shared by the tests and the benchmarks."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from serve_app.inference.precision_check import edit_distance

REPO = Path(__file__).resolve().parents[1]
PEER = REPO / "tests" / "data" / "peer"


def peer_names() -> list[str]:
    """The peer images' file names (JPEG and PNG), sorted."""
    return sorted(p.name for p in PEER.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))


def require_peer() -> Path:
    if not (PEER / "expected.json").is_file():
        raise FileNotFoundError(
            f"peer data not found at {PEER}: it ships with the repository (tests/data/peer); is the clone complete?"
        )
    return PEER


@lru_cache(maxsize=1)
def expected() -> dict[str, dict]:
    return {e["image"]: e for e in json.loads((require_peer() / "expected.json").read_text())}


@lru_cache(maxsize=4)
def reference(name: str = "reference_rapidocr_paddle.json") -> dict[str, list[dict]]:
    return json.loads((require_peer() / name).read_text())


def _rect(box) -> tuple[float, float, float, float]:
    xs = [p[0] for p in box]
    ys = [p[1] for p in box]
    return min(xs), min(ys), max(xs), max(ys)


def iou(a, b) -> float:
    ax0, ay0, ax1, ay1 = _rect(a)
    bx0, by0, bx1, by1 = _rect(b)
    iw = max(0.0, min(ax1, bx1) - max(ax0, bx0))
    ih = max(0.0, min(ay1, by1) - max(ay0, by0))
    inter = iw * ih
    union = (ax1 - ax0) * (ay1 - ay0) + (bx1 - bx0) * (by1 - by0) - inter
    return inter / union if union > 0 else 0.0


def match_lines(ours: list[dict], theirs: list[dict], min_iou: float = 0.5) -> list[tuple[dict, dict | None]]:
    """Pair each reference line with our line of the best box overlap (at
    least min_iou), each of ours used once."""
    used: set[int] = set()
    pairs = []
    for t in theirs:
        best, best_iou = None, min_iou
        for i, o in enumerate(ours):
            if i in used:
                continue
            v = iou(o["box"], t["box"])
            if v >= best_iou:
                best, best_iou = i, v
        if best is not None:
            used.add(best)
        pairs.append((t, ours[best] if best is not None else None))
    return pairs


def agreement(ours: dict[str, list[dict]], theirs: dict[str, list[dict]]) -> tuple[int, int, list[str]]:
    """(reference lines read with identical text, reference lines, differences)."""
    same = total = 0
    diffs = []
    for name, lines in theirs.items():
        for t, o in match_lines(ours.get(name, []), lines):
            total += 1
            if o is not None and o["text"] == t["text"]:
                same += 1
            else:
                diffs.append(f"{name}: {t['text']!r} vs {o['text'] if o else None!r}")
    return same, total, diffs


# One Levenshtein distance for the tests and the service's precision check.
levenshtein = edit_distance


def substring_distance(label: str, text: str) -> int:
    """Edits to make `label` appear inside `text` (text around it is free):
    a label is one word or field, a read line may hold several."""
    prev = [0] * (len(text) + 1)
    for i, cl in enumerate(label, 1):
        cur = [i]
        for j, ct in enumerate(text, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (cl != ct)))
        prev = cur
    return min(prev)


def label_errors(read_texts: list[str], labels: list[str]) -> tuple[int, int]:
    """(character errors, label characters) for one image: each label is
    matched to the read line where it needs the fewest edits, spaces removed
    on both sides (the receipt labels have none). A label read nowhere
    costs its length."""
    lines = [t.replace(" ", "") for t in read_texts]
    errors = chars = 0
    for label in labels:
        want = label.replace(" ", "")
        chars += len(want)
        errors += min([substring_distance(want, t) for t in lines] + [len(want)])
    return errors, chars


def cer(reads: dict[str, list[str]], labels: dict[str, list[str]]) -> float:
    """Character error rate over all labels of all images."""
    errors = chars = 0
    for name, want in labels.items():
        e, c = label_errors(reads.get(name, []), want)
        errors, chars = errors + e, chars + c
    return errors / max(chars, 1)


def rapidocr_paddle_reads(names: list[str], threads: int) -> dict[str, list[dict]]:
    """What RapidOCR-paddle (the reference PP-OCRv4 pipeline, its default
    parameters; `threads` changes no reading parameter) reads in each peer
    image. Its predictors grow by every input shape they see (~11 GB over
    the 60 images): tests call it in a child (harness.in_child)."""
    from rapidocr_paddle import RapidOCR

    ocr = RapidOCR(cpu_math_library_num_threads=threads)
    out = {}
    for name in names:
        res, _ = ocr(str(PEER / name))
        out[name] = [{"box": [[float(x) for x in p] for p in r[0]], "text": r[1], "score": float(r[2])}
                     for r in (res or [])]
    return out


def read_with_cache(cache_dir, name: str) -> tuple[list[str], dict]:
    """A new engine (the in-process defaults, its compiled-model cache in
    `cache_dir`) reading the peer image `name`: its lines' texts and each
    predictor's cache record. Tests call it in a child (harness.in_child)."""
    from serve_app.engine import OcrEngine, default_engine_config

    cfg = default_engine_config()
    with OcrEngine(cfg.model_copy(update={"predictor": cfg.predictor.model_copy(update={"cache_dir": cache_dir})})) as eng:
        return [line.text for line in eng.read(PEER / name).lines], {p.name: p.cache for p in eng._predictors}


TIGHT_LINE_SOURCES = ("rapidocr_en.jpg", "paddleocr_00006737.jpg", "mmocr_icdar15_img_1.jpg", "rapidocr_ch_en_num.jpg")


def tight_lines() -> list[tuple]:
    """12 lines the reference read with confidence (BGR crop, text), cut tight by its boxes."""
    import cv2
    import numpy as np

    out = []
    for name in TIGHT_LINE_SOURCES:
        img = cv2.imread(str(PEER / name))
        for r in reference()[name]:
            if len(r["text"]) >= 3 and r["score"] > 0.9:
                b = np.asarray(r["box"])
                x0, y0 = np.maximum(b.min(axis=0).astype(int), 0)
                x1, y1 = b.max(axis=0).astype(int)
                out.append((img[y0:y1, x0:x1], r["text"]))
    return out[:12]


def tight_line_errors(read, lines: list[tuple], height: int) -> tuple[int, int, int]:
    """(character errors, characters, lines read as nothing) of `read`
    (image -> text) over `lines` scaled to `height` px high, spaces ignored."""
    import cv2

    errors = chars = empty = 0
    for crop, want in lines:
        small = cv2.resize(crop, (max(1, round(crop.shape[1] * height / crop.shape[0])), height),
                           interpolation=cv2.INTER_AREA)
        got = read(small)
        empty += not got
        want = want.replace(" ", "")
        errors += levenshtein(want, got.replace(" ", ""))
        chars += len(want)
    return errors, chars, empty


def tight_line_errors_at(precision: str, heights: list[int]) -> dict[int, tuple[int, int, int]]:
    """tight_line_errors per height for a new engine (the in-process defaults)
    at OpenVINO `precision`. Tests call it in a child (harness.in_child)."""
    from serve_app.engine import OcrEngine, default_engine_config

    cfg = default_engine_config()
    opts = cfg.predictor.model_copy(update={"openvino_precision": precision})
    lines = tight_lines()
    with OcrEngine(cfg.model_copy(update={"predictor": opts})) as eng:
        read = lambda img: " ".join(line.text for line in eng.read(img).lines)  # noqa: E731
        return {h: tight_line_errors(read, lines, h) for h in heights}


def engine_lines(name: str) -> list[dict]:
    """A new engine's (the in-process defaults) lines for the peer image
    `name`, as result dicts. For a test process with no engine of its own to
    share: tests call it in a child (harness.in_child)."""
    from serve_app.engine import OcrEngine

    with OcrEngine() as eng:
        return [line.to_dict() for line in eng.read(PEER / name).lines]
