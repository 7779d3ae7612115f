"""#29 item 5: TensorRT below fp32 only after an agreement check against
fp32 on real images at start: below 99.5% of lines identical the replica
refuses, giving the figure. The decision and the comparison, with the two
readers stood in (the GPU run itself is not possible here)."""

from __future__ import annotations

import pytest

from serve_app.core.errors import ConfigError
from serve_app.inference.precision_check import THRESHOLD, agreement, check, decide, precision_policy, word_crops


def test_threshold_is_99_5_percent():
    assert THRESHOLD == 0.995


def test_all_identical_passes_with_the_figure():
    a = agreement(["a", "b"], ["GRAND", "HOTEL"], ["GRAND", "HOTEL"])
    line = decide("rec", "fp16", a)
    assert "2/2 lines identical" in line and "100.0%" in line


def test_below_the_threshold_refuses_with_the_figure_and_the_differences():
    names = [f"w{i}" for i in range(1000)]
    ref = ["TEXT"] * 1000
    ok = ref[:995] + ["TEXT"] * 5
    assert "995" not in decide("rec", "fp16", agreement(names, ref, ok))  # 1000/1000
    assert decide("rec", "fp16", agreement(names, ref, ref[:995] + ["TEXI"] * 5)).startswith("rec: TensorRT fp16 agrees")
    bad = ref[:994] + ["TEXI"] * 6  # 99.4%
    with pytest.raises(ConfigError) as e:
        decide("rec", "fp16", agreement(names, ref, bad))
    msg = str(e.value)
    assert "994/1000" in msg and "99.4%" in msg and "99.5%" in msg
    assert "'TEXT' vs fp16 'TEXI'" in msg and "precision: fp32" in msg


def test_no_images_is_no_check():
    with pytest.raises(ConfigError, match="none"):
        decide("rec", "fp16", agreement([], [], []))


def test_policy_checks_every_stage_below_fp32():
    assert precision_policy("rec", "fp32") is False and precision_policy("det", "fp32") is False
    for stage in ("det", "cls", "rec"):
        assert precision_policy(stage, "fp16") is True and precision_policy(stage, "int8") is True
    with pytest.raises(ConfigError, match="no agreement measure"):
        precision_policy("layout", "fp16")


def test_check_reads_the_packaged_words_with_both_readers():
    names, crops = word_crops(lambda path: path)  # the image reader stood in: the path itself
    assert len(names) == 9 and all(n.startswith("mmocr_word_") for n in names)
    seen = []

    def reader(tag):
        def read(c):
            seen.append((tag, len(c)))
            return ["x" if tag == "fp16" and "1223731" in p else "y" for p in c]
        return read

    line, a = check("rec", "fp16", names, crops, reader("fp32"), reader("fp16"), threshold=0.8)
    assert seen == [("fp32", 9), ("fp16", 9)] and a.identical == 8 and a.total == 9 and "8/9" in line
    with pytest.raises(ConfigError, match="8/9"):
        check("rec", "fp16", names, crops, reader("fp32"), reader("fp16"))


# --- det and cls measures, on the CPU engine's real outputs (serve_app/inference/calibration/set.json) ---

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from serve_app.inference.precision_check import (  # noqa: E402
    BOX_IOU, UNITS, answers, box_agreement, check_items, match_boxes, quad_iou,
)

SET = json.loads((Path(__file__).resolve().parents[2] / "serve_app" / "inference" / "calibration" / "set.json").read_text())
NAMES = [Path(p["file"]).name for p in SET["pages"]]
CPU_BOXES = [[np.asarray(b, dtype=np.float32) for b in p["cpu"]["boxes"]] for p in SET["pages"]]
N_BOXES = sum(len(b) for b in CPU_BOXES)


def scaled(box: np.ndarray, s: float) -> np.ndarray:
    c = box.mean(axis=0)
    return (box - c) * s + c


def test_quad_iou_of_real_boxes():
    b = CPU_BOXES[0][0]
    assert quad_iou(b, b) == pytest.approx(1.0)
    # A box grown about its centre holds the original: IoU = 1 / s^2.
    assert quad_iou(b, scaled(b, 1.05)) == pytest.approx(1 / 1.05 ** 2, rel=1e-3)
    # Moved by its own width along its top edge: no overlap.
    assert quad_iou(b, b + (b[1] - b[0])) == pytest.approx(0.0, abs=1e-3)
    square = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], np.float32)
    assert quad_iou(square, square + [5, 0]) == pytest.approx(50 / 150)


def test_identical_boxes_agree_whatever_their_order():
    assert N_BOXES > 150  # 9 real pages
    a = box_agreement(NAMES, CPU_BOXES, [list(reversed(b)) for b in CPU_BOXES])
    assert (a.identical, a.total, a.differing) == (N_BOXES, N_BOXES, [])
    assert f"{N_BOXES}/{N_BOXES} boxes matched to fp32's at IoU >= 0.9" in decide("det", "fp16", a)


def test_box_iou_threshold_on_real_boxes():
    # 1.05x about the centre: IoU 0.907 >= 0.9 for every box; 1.06x: 0.89 < 0.9 for every box.
    assert box_agreement(NAMES, CPU_BOXES, [[scaled(b, 1.05) for b in bs] for bs in CPU_BOXES]).fraction == 1.0
    a = box_agreement(NAMES, CPU_BOXES, [[scaled(b, 1.06) for b in bs] for bs in CPU_BOXES])
    assert a.identical == 0 and a.total == N_BOXES
    assert BOX_IOU == 0.9


def test_a_lost_box_and_a_made_up_box_each_refuse():
    lost = [bs[:-1] if k == 4 else bs for k, bs in enumerate(CPU_BOXES)]  # the dense page loses one line
    a = box_agreement(NAMES, CPU_BOXES, lost)
    assert (a.identical, a.total) == (N_BOXES - 1, N_BOXES)
    assert a.differing == [(NAMES[4], f"{len(CPU_BOXES[4])} boxes", f"{len(CPU_BOXES[4]) - 1} boxes, "
                                      f"{len(CPU_BOXES[4]) - 1} matched")]
    with pytest.raises(ConfigError, match=rf"det: TensorRT int8 refused: {N_BOXES - 1}/{N_BOXES} boxes matched"):
        decide("det", "int8", a)
    made_up = [bs + [bs[0] + 400] if k == 0 else bs for k, bs in enumerate(CPU_BOXES)]
    a = box_agreement(NAMES, CPU_BOXES, made_up)
    assert (a.identical, a.total) == (N_BOXES, N_BOXES + 1)
    with pytest.raises(ConfigError, match=rf"{N_BOXES}/{N_BOXES + 1} boxes"):
        decide("det", "fp16", a)


def test_boxes_match_one_to_one():
    b = CPU_BOXES[0][0]
    assert match_boxes([b, b], [b]) == 1 and match_boxes([b], [b, scaled(b, 1.01)]) == 1


def test_angle_decisions_on_the_cpu_engines_real_directions():
    labels = [d for p in SET["pages"] for d in p["cpu"]["directions"]]
    names = [f"c{i}" for i in range(len(labels))]
    assert "180" in labels and "0" in labels
    a = agreement(names, labels, labels, UNITS["cls"])
    assert a.fraction == 1.0 and "angle decisions identical to fp32" in decide("cls", "fp16", a)
    flipped = list(labels)
    flipped[3] = "0" if labels[3] == "180" else "180"
    with pytest.raises(ConfigError, match=rf"cls: TensorRT fp16 refused: {len(labels) - 1}/{len(labels)} angle"):
        decide("cls", "fp16", agreement(names, labels, flipped, UNITS["cls"]))


def test_answers_take_what_each_stage_compares():
    from serve_app.core.results import Direction, Recognition

    assert answers("rec", [Recognition("EXIT", 0.9)]) == ["EXIT"]
    assert answers("cls", [Direction("180", 0.99)]) == ["180"]
    assert answers("det", [CPU_BOXES[0]]) == [CPU_BOXES[0]]


def test_check_items_are_the_packaged_real_images():
    shapes = []
    names, pages = check_items("det", lambda p: (shapes.append(p), p)[1])
    assert names == NAMES and all(Path(p).is_file() for p in pages)
    import cv2

    read = lambda p: cv2.imread(p, cv2.IMREAD_COLOR)  # noqa: E731
    names, crops = check_items("rec", read)
    assert len(names) == N_BOXES + 9 and names[0] == f"{NAMES[0]}#0" and names[-1].startswith("mmocr_word_")
    assert all(c.ndim == 3 and c.shape[2] == 3 and min(c.shape[:2]) > 0 for c in crops)
    cls_names, cls_crops = check_items("cls", read)
    assert len(cls_names) == 2 * len(names) and cls_names[-1].endswith("(turned)")
    assert np.array_equal(cls_crops[len(names)], np.rot90(crops[0], 2))


def test_det_check_with_the_two_readers_stood_in():
    lost = {NAMES[1]}  # the int8 detector "loses" the second page's boxes

    def reader(tag):
        def read(pages):
            return [[] if tag == "int8" and Path(p).name in lost else CPU_BOXES[NAMES.index(Path(p).name)]
                    for p in pages]
        return read

    names, pages = check_items("det", lambda p: p)
    with pytest.raises(ConfigError, match=rf"{N_BOXES - len(CPU_BOXES[1])}/{N_BOXES} boxes"):
        check("det", "int8", names, pages, reader("fp32"), reader("int8"))
