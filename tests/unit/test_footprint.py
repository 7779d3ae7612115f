"""load_tests/footprint.py's pure parts: which process is what, PSS summed
per role, smaps_rollup parsing, the text-line set, reading figures and the
side-by-side table (no Ray, no models)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from load_tests import footprint  # noqa: E402
from load_tests.procfs import descendants, pss_mb, smaps_rollup_kb  # noqa: E402


def test_roles_from_command_lines():
    assert footprint.role("ray::ServeReplica:ocr:TextRecognizer") == "rec replica"
    assert footprint.role("ray::ServeReplica:ocr:TextDetector") == "det replica"
    assert footprint.role("ray::ServeReplica:ocr:OcrIngress") == "ingress"
    assert footprint.role("ray::ProxyActor") == "proxy"
    assert footprint.role("/venv/bin/python3 /venv/bin/serve run /tmp/x/config.yaml") == "serve run (CLI)"
    assert footprint.role("/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=x") == "gcs"
    assert footprint.role("ray-dashboard-NodeHead-0 (/venv/bin/python3 -B -c from multiprocessing") == "dashboard"
    assert footprint.role("ray::IDLE") == "ray other"


def test_pss_is_summed_per_role_models_first():
    procs = [{"role": "proxy", "pss": 88.0, "rss": 120.0},
             {"role": "rec replica", "pss": 700.0, "rss": 900.0},
             {"role": "rec replica", "pss": 740.0, "rss": 950.0},
             {"role": "something new", "pss": 5.0, "rss": 6.0},
             {"role": "det replica", "pss": 830.0, "rss": 1000.0}]
    g = footprint.group_pss(procs)
    assert list(g) == ["rec replica", "det replica", "proxy", "something new"]
    assert g["rec replica"] == {"n": 2, "pss": 1440.0, "rss": 1850.0, "max": 740.0}
    assert g["proxy"]["n"] == 1 and g["proxy"]["pss"] == 88.0


def test_smaps_rollup_of_this_process_and_of_a_gone_one(tmp_path):
    r = smaps_rollup_kb()
    assert r["Pss"] > 0 and r["Rss"] >= r["Pss"] - 1  # PSS shares pages, so never (much) above RSS
    m = pss_mb()
    assert m is not None and m["pss"] == pytest.approx(r["Pss"] / 1024, rel=0.2)
    assert m["anon"] + m["file"] + m["shmem"] == pytest.approx(m["pss"], rel=0.05)
    assert smaps_rollup_kb(2**22 + 12345) == {} and pss_mb(2**22 + 12345) is None


def test_descendants_follow_the_parent_links():
    table = {1: (0, 0.0), 10: (1, 0.0), 11: (10, 0.0), 12: (11, 0.0), 20: (1, 0.0), 13: (10, 0.0)}
    assert descendants(10, table) == [11, 12, 13]
    assert descendants(12, table) == []
    assert os.getpid() not in descendants(os.getpid())


def test_text_line_images_are_the_one_line_crops():
    names = ["mmocr_word_1036169.jpg", "paddleocr_en_word_1.png", "rapidocr_text_rec.jpg", "rapidocr_en_rec.jpg",
             "mmocr_demo_text_recog.jpg", "mmocr_demo_text_ocr.jpg", "rapidocr_en.jpg", "paddleocr_1.jpg"]
    assert footprint.text_lines(names) == names[:5]


def test_reading_counts_lines_cer_and_agreement_with_the_engine():
    labels = {"a.jpg": ["HELLO"], "b.jpg": ["WORLD"]}
    engine = {"a.jpg": ["HELLO"], "b.jpg": ["WORLD", "x"], "c.jpg": []}
    ours = {"a.jpg": ["HELLO"], "b.jpg": ["WORLO", "x"], "c.jpg": []}
    r = footprint.reading(ours, engine, labels)
    assert r == {"lines": 3, "cer": pytest.approx(1 / 10), "same_as_engine": 2, "images": 3}


def _run(name, rnd, pss, ready=(30.0, 20.0)):
    return {"name": name, "round": rnd, "groups": {"rec replica": {"n": 2, "pss": pss, "rss": pss, "max": pss}},
            "pss_total": pss + 1000, "n_procs": 20, "rss_total": 2 * pss, "pss_total_loaded": pss + 1010,
            "ready_first_s": ready[0], "ready_second_s": ready[1], "p50_peer": 250.0, "p50_lines": 120.0,
            "first_ms": 300.0, "steady_ms": 200.0, "rate_8": 3.5, "errors_8": 0,
            "reading": {"lines": 665, "cer": 0.0956, "same_as_engine": 60, "images": 60}}


def test_the_table_puts_configs_side_by_side_with_the_engine_as_baseline():
    engine = {"p50_peer": 200.0, "p50_lines": 100.0, "reading": {"lines": 665, "cer": 0.0956}}
    text = footprint.table(engine, [_run("deployments.yaml", 0, 1500.0), _run("deployments.light.yaml", 0, 700.0)])
    lines = text.splitlines()
    assert lines[0] == "| | deployments.yaml (round 0) | deployments.light.yaml (round 0) |"
    assert lines[1] == "|---|---:|---:|"
    row = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in lines[2:]}
    assert row["PSS MB: rec replica"] == ["1500 (2)", "700 (2) |"]
    assert row["**PSS MB total** (processes), after the peer set"] == ["**2500** (20)", "**1700** (20) |"]
    assert row["one client p50 ms, peer set (engine 200)"] == ["250 (+50)", "250 (+50) |"]
    assert row["one client p50 ms, text lines (engine 100)"] == ["120 (+20)", "120 (+20) |"]
    assert row["CER on labels (engine 0.0956)"] == ["0.0956", "0.0956 |"]
    assert row["images read as the engine reads them"] == ["60/60", "60/60 |"]
    assert all(len(line.split(" | ")) == 3 for line in lines[2:])  # every row has both columns


def test_a_config_variant_is_a_file_with_overrides_of_its_args():
    path, overrides = footprint.parse_config("deployments.yaml+recognizer.warm=full+detector.threads=1")
    assert path == "deployments.yaml"
    assert overrides == [(["recognizer", "warm"], "full"), (["detector", "threads"], 1)]
    args = {"detector": {"cpu_cores": [0, 1], "threads": 2}}
    footprint.apply_overrides(args, overrides)
    assert args == {"detector": {"cpu_cores": [0, 1], "threads": 1}, "recognizer": {"warm": "full"}}
    assert footprint.parse_config("deployments.light.yaml") == ("deployments.light.yaml", [])
    with pytest.raises(ValueError, match="key.path=value"):
        footprint.parse_config("deployments.yaml+recognizer.warm")
