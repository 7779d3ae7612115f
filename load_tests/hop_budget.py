"""The arithmetic of the hop budget (issue #17 item 4), pure (no Ray, no
paddle): where a service request's time goes next to the in-process
engine's, which process a CPU second belongs to, and the extrapolation of
measured per-image CPU to a machine with more cores. Used by
load_tests/hops.py and load_tests/cpu_by_process.py."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Optional
import sys  # noqa: E402
from load_tests.stats import median  # noqa: E402
from load_tests.cli import standalone  # noqa: E402

STAGES = ("det", "cls", "rec")


def server_timing_ms(header: Optional[str], name: str = "ingress") -> Optional[float]:
    """`dur` of the metric `name` in a Server-Timing header, else None."""
    for part in (header or "").split(","):
        fields = [f.strip() for f in part.split(";")]
        if fields and fields[0] == name:
            for f in fields[1:]:
                k, _, v = f.partition("=")
                if k.strip() == "dur":
                    try:
                        return float(v)
                    except ValueError:
                        return None
    return None


def stage_compute_ms(batches: dict[str, list[dict]], t0: float, t1: float) -> dict[str, float]:
    """Predictor time per stage spent on the one request in flight between
    t0 and t1 (time.time()): the batches that ended in that window (each
    {"pid", "t", "ms"}, a replica's recent_batches). A stage's replicas run
    in parallel (a fanned-out page's parts), so a stage's compute is the
    busiest replica's sum, not the sum over replicas."""
    out = {}
    for stage, rows in batches.items():
        per_pid: dict[int, float] = {}
        for b in rows:
            if t0 <= b["t"] <= t1:
                per_pid[b["pid"]] = per_pid.get(b["pid"], 0.0) + b["ms"]
        out[stage] = max(per_pid.values(), default=0.0)
    return out


def request_parts(latency_ms: float, timings: dict, compute: dict, ingress_ms: Optional[float]) -> dict:
    """One request's time in parts (ms): client latency; outside = what the
    client saw beyond the pipeline's total; for the service, proxy (client
    minus the ingress's own Server-Timing) and ingress (its time minus the
    pipeline's total: its own work and, with the pipeline in its own
    deployment, that hop); per stage its time in the pipeline, the predictor
    time in it (compute) and the rest (stage - compute: for det the resize
    and crops around the call, and in the service every hop and wait)."""
    out = {"latency": latency_ms, "total": timings.get("total", float("nan")),
           "decode": timings.get("decode", 0.0)}
    out["outside"] = latency_ms - out["total"]
    if ingress_ms is not None:
        out["proxy"] = latency_ms - ingress_ms
        out["ingress"] = ingress_ms - out["total"]
    for s in STAGES:
        t, c = timings.get(s, 0.0), compute.get(s, 0.0)
        out[s], out[f"{s}_compute"], out[f"{s}_rest"] = t, c, t - c
    return out


def median_parts(rows: list[dict]) -> dict:
    """Per key, the median over one image's requests."""
    keys = {k for r in rows for k in r}
    return {k: median(r.get(k) for r in rows) for k in keys}


def over_engine(svc: dict, eng: dict) -> dict:
    """What the service adds to the engine, part by part (medians in):
    proxy (over the engine's own time outside its pipeline: its loop
    thread's handoff), ingress (own work + the pipeline hop), decode, and per stage
    the compute difference (replica vs the engine's predictor: threads,
    shared cores) and the rest (hop, transfer, wait)."""
    out = {"latency": svc["latency"] - eng["latency"], "proxy": svc.get("proxy", svc["outside"]) - eng["outside"],
           "ingress": svc.get("ingress", 0.0), "decode": svc["decode"] - eng["decode"]}
    for s in STAGES:
        out[f"{s}_compute"] = svc[f"{s}_compute"] - eng[f"{s}_compute"]
        out[f"{s}_hop"] = svc[f"{s}_rest"] - eng[f"{s}_rest"]
    out["parts_sum"] = sum(v for k, v in out.items() if k != "latency")
    return out


# -- CPU by process ---------------------------------------------------------------

DEPLOYMENT_GROUPS = {"TextDetector": "det replica", "DirectionClassifier": "cls replica",
                     "TextRecognizer": "rec replica", "OcrPipeline": "pipeline", "OcrIngress": "ingress",
                     "JobStore": "job store"}


def process_group(cmdline: str) -> str:
    """Which part of the service (or the baseline) a process is, from its
    command line (truncated ones too)."""
    m = re.search(r"ServeReplica:[^:\s]+:(\w+)", cmdline)
    if m:
        return DEPLOYMENT_GROUPS.get(m.group(1), m.group(1))
    for needle, group in (("ProxyActor", "proxy"), ("ServeController", "controller"), ("gcs_server", "gcs"),
                          ("raylet", "raylet"), ("dashboard", "dashboard"), ("simple_server", "simple server"),
                          ("cpu_by_process", "load client"), ("ray::", "ray other"),
                          ("log_monitor", "ray other"), ("runtime_env", "ray other"), ("/ray/", "ray other")):
        if needle in cmdline:
            return group
    return "other"


# What each group's CPU does as the load grows: model replicas' work is per
# image (and spreads over more cores with more replicas); proxy, ingress and
# pipeline work is per request (one more replica each where one is busy);
# the rest is Ray's per-node machinery, which does not grow with images.
PER_IMAGE_MODEL = ("det replica", "cls replica", "rec replica")
PER_REQUEST_RAY = ("proxy", "ingress", "pipeline")
PER_NODE = ("controller", "gcs", "raylet", "dashboard", "ray other", "job store")


def amdahl_fraction(speedup_2: float) -> float:
    """The parallel fraction p that gives `speedup_2` on 2 threads
    (1 / ((1 - p) + p / 2)); clipped to [0, 1]."""
    if speedup_2 <= 0:
        return 0.0
    return min(1.0, max(0.0, 2.0 * (1.0 - 1.0 / speedup_2)))


def amdahl_speedup(p: float, n: float) -> float:
    return 1.0 / ((1.0 - p) + p / n)


def service_rate(cores: float, model_cs: float, request_cs: float, node_cores: float) -> float:
    """img/s the service's CPU allows on `cores`: the per-node machinery
    takes `node_cores`; each image costs model_cs + request_cs core-seconds
    (measured per image), spread over replicas on the rest."""
    return max(0.0, cores - node_cores) / (model_cs + request_cs)


def extrapolation(service: dict, simple: dict, rate_1: float, rate_2: float, cores: list[int]) -> list[dict]:
    """Rows of the extrapolation to `cores`, from measured figures only:
    `service` and `simple` are load_tests/cpu_by_process.py's --json output
    at saturation; rate_1 / rate_2 the engine's img/s one image at a time on
    1 and 2 threads (load_tests/hops.py). The service's model and
    per-request CPU per image is taken as measured on this machine (its
    replicas share 2 cores here, so this is an upper bound on their cost),
    its per-node machinery as the cores it used; the simple server gets
    Amdahl's speedup of its threads (and never more than its CPU per image
    allows). The HTTP proxy is one process per node: the service never
    goes past one core of it."""
    p = amdahl_fraction(rate_2 / rate_1)
    simple_cs = simple["system_core_s_per_img"]
    proxy_cs = service["groups_cpu_s"].get("proxy", 0.0) / max(1, service["answers"])
    out = []
    for n in cores:
        svc = service_rate(n, service["model_core_s_per_img"], service["request_core_s_per_img"],
                           service["node_cores"])
        if proxy_cs > 0:
            svc = min(svc, 1.0 / proxy_cs)
        # anchored on its measured saturated rate on this machine's 2 cores
        smp = min(simple["img_s"] * amdahl_speedup(p, n) / amdahl_speedup(p, 2), n / simple_cs)
        out.append({"cores": n, "service": svc, "simple": smp, "ratio": svc / smp if smp else float("nan")})
    return out


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--service", type=Path, help="`hops cpu --json` of the service (required)")
    ap.add_argument("--simple", type=Path, help="`hops cpu --target simple --json` (required)")
    ap.add_argument("--hops", type=Path, help="`hops budget`'s raw JSON: the thread speedup (required)")
    ap.add_argument("--cores", default="2,4,8,16,32")


def main(args: argparse.Namespace) -> int:
    a = args
    if not (a.service and a.simple and a.hops):
        raise SystemExit("hops extrapolate needs --service, --simple and --hops (see --help)")
    svc, smp = json.loads(a.service.read_text()), json.loads(a.simple.read_text())
    sp = json.loads(a.hops.read_text())["speedup"]
    r1, r2 = sp["1"]["rate"], sp["2"]["rate"]
    print(f"measured: service {svc['img_s']:.2f} img/s at {svc['clients']} clients; CPU per image: model replicas "
          f"{svc['model_core_s_per_img']:.3f}, proxy+ingress+pipeline {svc['request_core_s_per_img']:.3f} core-s; "
          f"per-node Ray machinery {svc['node_cores']:.2f} cores; simple server {smp['img_s']:.2f} img/s, "
          f"{smp['system_core_s_per_img']:.3f} core-s per image; engine one at a time {r1:.2f} img/s on 1 thread, "
          f"{r2:.2f} on 2 (parallel fraction {amdahl_fraction(r2 / r1):.2f})")
    print("\n| cores | service img/s (computed) | simple server img/s (computed) | service / simple |\n|---:|---:|---:|---:|")
    for row in extrapolation(svc, smp, r1, r2, [int(x) for x in a.cores.split(",")]):
        print(f"| {row['cores']} | {row['service']:.2f} | {row['simple']:.2f} | {row['ratio']:.2f}x |")


def smoke(args: argparse.Namespace) -> int:
    """The arithmetic on fixed figures: Server-Timing, a stage's compute in a
    window, parts over the engine, process groups, Amdahl and the extrapolation."""
    from load_tests.cli import check

    check(server_timing_ms("db;dur=3, ingress;desc=x;dur=7.25") == 7.25 and server_timing_ms("db;dur=3") is None,
          "Server-Timing's ingress duration")
    batches = {"det": [{"pid": 1, "t": 10.5, "ms": 40.0}, {"pid": 1, "t": 9.0, "ms": 99.0}], "cls": [],
               "rec": [{"pid": 2, "t": 10.6, "ms": 10.0}, {"pid": 2, "t": 10.7, "ms": 15.0},
                       {"pid": 3, "t": 10.65, "ms": 20.0}, {"pid": 3, "t": 12.0, "ms": 50.0}]}
    check(stage_compute_ms(batches, 10.0, 11.0) == {"det": 40.0, "cls": 0.0, "rec": 25.0},
          "a stage's compute: batches in the window, the busiest replica")
    eng = request_parts(127.0, {"decode": 5.0, "det": 50.0, "cls": 8.0, "rec": 60.0, "total": 125.0},
                        {"det": 40.0, "cls": 5.0, "rec": 55.0}, None)
    svc = request_parts(180.0, {"decode": 6.0, "det": 62.0, "cls": 12.0, "rec": 80.0, "total": 162.0},
                        {"det": 44.0, "cls": 5.0, "rec": 65.0}, 170.0)
    d = over_engine(svc, eng)
    check(d["latency"] == 53.0 and abs(d["parts_sum"] - d["latency"]) < 1e-9, f"parts add up: {d}")
    check(process_group("ray::ServeReplica:ocr:TextRecognizer") == "rec replica"
          and process_group(".venv/bin/python -m load_tests.simple_server --host x") == "simple server",
          "process groups")
    p = amdahl_fraction(1.6)
    check(abs(amdahl_speedup(p, 2) - 1.6) < 1e-9 and abs(service_rate(8, 0.4, 0.1, 0.5) - 15.0) < 1e-9, "Amdahl")
    rows = extrapolation({"model_core_s_per_img": 0.4, "request_core_s_per_img": 0.1, "node_cores": 0.5,
                          "answers": 100, "groups_cpu_s": {"proxy": 1.0}},
                         {"system_core_s_per_img": 0.3, "img_s": 4.0}, 3.0, 4.8, [2, 8, 64, 1024])
    check(abs(rows[0]["service"] - 3.0) < 1e-9 and abs(rows[3]["service"] - 100.0) < 1e-9,
          f"extrapolation, capped by the one proxy: {rows}")
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(standalone(__name__))
