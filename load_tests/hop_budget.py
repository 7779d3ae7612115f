"""The arithmetic of the hop budget (issue #17 item 4), pure (no Ray, no
paddle): where a service request's time goes next to the in-process
engine's, which process a CPU second belongs to, and the extrapolation of
measured per-image CPU to a machine with more cores. Used by
load_tests/hops.py and load_tests/cpu_by_process.py."""

from __future__ import annotations

import re
import statistics
from typing import Iterable, Optional

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


def median(values: Iterable[Optional[float]]) -> float:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else float("nan")


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


def main() -> None:
    import argparse
    import json
    from pathlib import Path

    ap = argparse.ArgumentParser(description="Extrapolate measured per-image CPU to more cores")
    ap.add_argument("--service", type=Path, required=True, help="cpu_by_process.py --json of the service")
    ap.add_argument("--simple", type=Path, required=True, help="cpu_by_process.py --target simple --json")
    ap.add_argument("--hops", type=Path, required=True, help="load_tests/hops.py's raw JSON (thread speedup)")
    ap.add_argument("--cores", default="2,4,8,16,32")
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
