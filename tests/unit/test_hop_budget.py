"""The hop budget's arithmetic (load_tests/hop_budget.py): pure, no Ray,
no models."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from load_tests.hop_budget import (  # noqa: E402
    amdahl_fraction, amdahl_speedup, over_engine, process_group, request_parts, server_timing_ms, service_rate,
    stage_compute_ms,
)


def test_server_timing_reads_the_named_duration():
    assert server_timing_ms("ingress;dur=12.5") == 12.5
    assert server_timing_ms("db;dur=3, ingress;desc=x;dur=7.25") == 7.25
    assert server_timing_ms("db;dur=3") is None
    assert server_timing_ms(None) is None
    assert server_timing_ms("ingress;dur=abc") is None


def test_stage_compute_counts_batches_in_the_window_and_the_busiest_replica():
    batches = {
        "det": [{"pid": 1, "t": 10.5, "ms": 40.0}, {"pid": 1, "t": 9.0, "ms": 99.0}],
        "cls": [],
        "rec": [{"pid": 2, "t": 10.6, "ms": 10.0}, {"pid": 2, "t": 10.7, "ms": 15.0},
                {"pid": 3, "t": 10.65, "ms": 20.0}, {"pid": 3, "t": 12.0, "ms": 50.0}],
    }
    got = stage_compute_ms(batches, 10.0, 11.0)
    # det: the batch before the window is another request's; rec: parts run in parallel
    assert got == {"det": 40.0, "cls": 0.0, "rec": 25.0}


def test_parts_over_the_engine_add_up_to_the_latency_difference():
    timings = {"decode": 5.0, "det": 50.0, "cls": 8.0, "rec": 60.0, "total": 125.0}
    eng = request_parts(127.0, timings, {"det": 40.0, "cls": 5.0, "rec": 55.0}, None)
    assert eng["outside"] == 2.0 and "proxy" not in eng
    svc_t = {"decode": 6.0, "det": 62.0, "cls": 12.0, "rec": 80.0, "total": 162.0}
    svc = request_parts(180.0, svc_t, {"det": 44.0, "cls": 5.0, "rec": 65.0}, 170.0)
    assert svc["proxy"] == 10.0 and svc["ingress"] == 8.0
    d = over_engine(svc, eng)
    assert d["latency"] == 53.0
    assert d["proxy"] == 8.0  # over the engine's own 2 ms outside its pipeline
    assert (d["det_compute"], d["det_hop"]) == (4.0, 8.0)
    assert (d["cls_compute"], d["cls_hop"]) == (0.0, 4.0)
    assert (d["rec_compute"], d["rec_hop"]) == (10.0, 10.0)
    assert d["decode"] == 1.0
    # the pipeline's own steps after rec (assembly) differ by total - sum of stages: 0 here
    assert d["parts_sum"] == pytest.approx(d["latency"])


@pytest.mark.parametrize("cmd,group", [
    ("ray::ServeReplica:ocr:TextDetector", "det replica"),
    ("ray::ServeReplica:ocrhere:TextRecognizer", "rec replica"),
    ("ray::ServeReplica:ocr:OcrIngress", "ingress"),
    ("ray::ServeReplica:ocr:OcrPipeline", "pipeline"),
    ("ray::ProxyActor", "proxy"),
    ("ray::ServeController", "controller"),
    ("/x/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp", "gcs"),
    ("/x/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name", "raylet"),
    ("/x/python -u /x/ray/dashboard/agent.py --node-ip-address", "dashboard"),
    (".venv/bin/python -m load_tests simple_server --host 127.0.0.1", "simple server"),
    (".venv/bin/python -m load_tests.simple_server --host 127.0.0.1", "simple server"),
    ("/x/python /x/site-packages/ray/autoscaler/_private/monitor.py --logs-dir", "ray other"),
    ("bash", "other"),
])
def test_process_groups(cmd, group):
    assert process_group(cmd) == group


def test_amdahl_round_trip_and_rates():
    p = amdahl_fraction(1.6)
    assert amdahl_speedup(p, 2) == pytest.approx(1.6)
    assert amdahl_fraction(2.0) == 1.0 and amdahl_fraction(1.0) == 0.0 and amdahl_fraction(2.5) == 1.0
    assert amdahl_speedup(p, 1) == pytest.approx(1.0)
    assert amdahl_speedup(p, 1e9) == pytest.approx(1 / (1 - p))
    # 0.5 core of per-node machinery, 0.4 + 0.1 core-s per image: 2 cores -> 3 img/s, 8 cores -> 15
    assert service_rate(2, 0.4, 0.1, 0.5) == pytest.approx(3.0)
    assert service_rate(8, 0.4, 0.1, 0.5) == pytest.approx(15.0)
    assert service_rate(0.2, 0.4, 0.1, 0.5) == 0.0
    assert not math.isnan(service_rate(4, 0.3, 0.0, 0.0))


def test_extrapolation_uses_measured_figures_and_caps():
    from load_tests.hop_budget import extrapolation

    service = {"model_core_s_per_img": 0.4, "request_core_s_per_img": 0.1, "node_cores": 0.5, "answers": 100,
               "groups_cpu_s": {"proxy": 1.0}}  # 0.01 core-s per image in the proxy: at most 100 img/s
    simple = {"system_core_s_per_img": 0.3, "img_s": 4.0}
    rows = extrapolation(service, simple, 3.0, 4.8, [2, 8, 64, 1024])
    assert rows[0]["service"] == pytest.approx(3.0) and rows[1]["service"] == pytest.approx(15.0)
    assert rows[3]["service"] == pytest.approx(100.0)  # the one proxy per node
    p = amdahl_fraction(1.6)
    assert rows[0]["simple"] == pytest.approx(4.0)  # its measured rate on 2 cores
    assert rows[1]["simple"] == pytest.approx(4.0 * amdahl_speedup(p, 8) / 1.6)
    assert rows[2]["simple"] < 4.0 / 1.6 / (1 - p) + 1e-9
    assert rows[1]["ratio"] == pytest.approx(rows[1]["service"] / rows[1]["simple"])
