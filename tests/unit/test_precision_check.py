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


def test_policy_checks_rec_fp16_and_refuses_what_cannot_be_checked():
    assert precision_policy("rec", "fp32") is False and precision_policy("det", "fp32") is False
    assert precision_policy("rec", "fp16") is True
    with pytest.raises(ConfigError, match="int8.*synthetic"):
        precision_policy("rec", "int8")
    with pytest.raises(ConfigError, match="det: TensorRT fp16 is refused"):
        precision_policy("det", "fp16")


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
