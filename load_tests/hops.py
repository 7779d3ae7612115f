"""The hop budget at one client (issue #17 item 4): the in-process engine,
the single-process HTTP server (load_tests/simple_server.py) and the
service side by side in one run, one request at a time, over the same
images; and the engine's speedup from 1 to 2 threads. (Until issue #23 the
service could also run the pipeline in the ingress; that placement was
measured against this one and removed.)

    flock /tmp/ray-tests.lock timeout 600 .venv/bin/python -m load_tests hops budget budget

The service is deployed as in deployments.yaml on a local Ray cluster
(Ray is told 4 logical CPUs; every replica still pins its inference
threads to the cores deployments.yaml names, the same two cores the engine
and the simple server use). Each round sends every image once to each system, the systems'
order rotating per round; nothing else of ours runs meanwhile.

Per request: client latency; for the service the ingress's own time
(Server-Timing), the pipeline's timings_ms and, from the model replicas'
recent_batches, the predictor time each stage spent on it; for the engine
the same stage times and the same predictor times (the detector's
on_batch, the classifier's and recogniser's calls). The tables give
per image medians and what the service adds over the engine, part by part
(load_tests/hop_budget.py has the arithmetic)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]

from load_tests.baselines import SimpleServer  # noqa: E402
from load_tests.hop_budget import (  # noqa: E402
    STAGES, amdahl_fraction, median, median_parts, over_engine, request_parts, server_timing_ms, stage_compute_ms,
)
from harness.service import (  # noqa: E402
    MODEL_DEPLOYMENTS, deploy_config, free_ports, load_config, replica_stats, start_ray, stop_all,
)
from harness.peer import PEER  # noqa: E402
from load_tests.cli import standalone  # noqa: E402

IMAGES = {"receipt": "mmocr_wildreceipt_1.jpeg", "word crop": "mmocr_word_1036169.jpg",
          "phone photo": "mmocr_icdar15_img_1.jpg", "short page": "rapidocr_en.jpg",
          "dense page": "mmocr_demo_densetext_det.jpg"}
MODES = {"service": ("/", False)}  # name: (route prefix, unused)
SYSTEMS = ("engine", "simple server", *MODES)


def image_mix(n: int) -> list[str]:
    """The mix load_tests/cpu_by_process.py loads (every k-th peer image)."""
    names = sorted(p.name for p in PEER.iterdir() if p.suffix in (".jpg", ".png"))
    return names[:: max(1, len(names) // n)][:n]


def content_type(name: str) -> str:
    return "image/png" if name.endswith(".png") else "image/jpeg"


# -- the systems --------------------------------------------------------------------


class Engine:
    """The in-process engine, its stage calls timed (one request at a time)."""

    def __init__(self):
        from serve_app.engine import OcrEngine
        from serve_app.flow.pipeline import Stages

        self.engine = OcrEngine()
        self.engine.warm()
        self.current: dict[str, float] = {}
        st = self.engine.pipeline.stages

        def timed(stage, fn):
            if fn is None:
                return None

            async def call(*a, **kw):
                t = time.perf_counter()
                try:
                    return await fn(*a, **kw)
                finally:
                    self.current[stage] = self.current.get(stage, 0.0) + (time.perf_counter() - t) * 1000

            return call

        # The detector's compute as a replica records it (load_tests/hop_budget:
        # predictor batch and box finding, not the input's normalisation,
        # which stays in the stage's rest for both); cls and rec as the
        # replicas' batches (pre- and post-processing included).
        self.engine.detector.on_batch = lambda n, seconds: self.current.__setitem__(
            "det", self.current.get("det", 0.0) + seconds * 1000)
        self.engine.pipeline.stages = Stages(st.detect, timed("cls", st.classify), timed("rec", st.recognize))

    def read(self, data: bytes) -> dict:
        self.current = {}
        t = time.perf_counter()
        res = self.engine.read(data)
        ms = (time.perf_counter() - t) * 1000
        return {"parts": request_parts(ms, res.timings_ms, dict(self.current), None), "lines": len(res.lines)}


def http_read(session: requests.Session, url: str, data: bytes, ctype: str) -> dict:
    w0, t = time.time(), time.perf_counter()
    r = session.post(f"{url}/v1/ocr", data=data, headers={"Content-Type": ctype}, timeout=120)
    ms = (time.perf_counter() - t) * 1000
    w1 = time.time()
    r.raise_for_status()
    body = r.json()
    return {"latency": ms, "timings": body["timings_ms"], "lines": len(body["results"]),
            "ingress": server_timing_ms(r.headers.get("server-timing")), "t0": w0, "t1": w1}


def model_batches(app: str) -> dict[str, list[dict]]:
    """stage -> every recent predictor batch of its replicas ({pid, t, ms})."""
    from ray import serve

    out: dict[str, list[dict]] = {}
    for stage, dep in MODEL_DEPLOYMENTS.items():
        got = replica_stats(serve.get_deployment_handle(dep, app), 2 if stage == "rec" else 1)
        out[stage] = [{"pid": pid, "t": b["t"], "ms": b["ms"]} for pid, st in got.items()
                      for b in st["recent_batches"]]
    return out


def two_apps(port_config: dict) -> dict:
    """deployments.yaml as one application per entry of MODES (one since
    issue #23; a second mode would get no job journal)."""
    import copy

    config = copy.deepcopy(port_config)
    base = config["applications"][0]
    apps = []
    for name, (prefix, here) in MODES.items():
        app = copy.deepcopy(base)
        app["name"] = "ocr" if prefix == "/" else "ocrhere"
        app["route_prefix"] = prefix
        if prefix != "/":
            app["args"].setdefault("jobs", {})["journal"] = None
        apps.append(app)
    config["applications"] = apps
    return config


# -- the run --------------------------------------------------------------------------


def measure(repeats: int, port: int, simple_port: int, log_dir: Path) -> dict:
    from ray import serve  # noqa: F401  (Ray is started below)

    images = {label: (name, (PEER / name).read_bytes()) for label, name in IMAGES.items()}
    srv = SimpleServer(simple_port, log_dir / "hops_simple_server.log")
    srv.start(120)
    engine = None
    try:
        engine = Engine()
        start_ray(num_cpus=4)
        url = deploy_config(two_apps(load_config()), port)
        urls = {"simple server": srv.url, **{m: url.rstrip("/") + (p if p != "/" else "") for m, (p, _) in MODES.items()}}
        apps = {m: ("ocr" if p == "/" else "ocrhere") for m, (p, _) in MODES.items()}
        sessions = {s: requests.Session() for s in urls}

        def one(system: str, name: str, data: bytes) -> dict:
            if system == "engine":
                return engine.read(data)
            return http_read(sessions[system], urls[system], data, content_type(name))

        for _ in range(2):  # untimed: every system has seen every image
            for name, data in images.values():
                for s in SYSTEMS:
                    one(s, name, data)
        rows: dict[str, dict[str, list[dict]]] = {s: {label: [] for label in images} for s in SYSTEMS}
        lines: dict[str, dict[str, int]] = {s: {} for s in SYSTEMS}
        for k in range(repeats):
            order = SYSTEMS[k % len(SYSTEMS):] + SYSTEMS[: k % len(SYSTEMS)]
            pending: dict[str, list[tuple[str, dict]]] = {m: [] for m in MODES}
            for label, (name, data) in images.items():
                for s in order:
                    got = one(s, name, data)
                    lines[s][label] = got["lines"]
                    if s in MODES:
                        pending[s].append((label, got))
                    elif s == "engine":
                        rows[s][label].append(got["parts"])
                    else:  # the simple server: its engine's stage times, no predictor times
                        rows[s][label].append(request_parts(got["latency"], got["timings"], {}, None))
            for m, done in pending.items():  # the replicas' batches of this round, by time window
                batches = model_batches(apps[m])
                for label, got in done:
                    compute = stage_compute_ms(batches, got["t0"], got["t1"])
                    rows[m][label].append(request_parts(got["latency"], got["timings"], compute, got["ingress"]))
            print(f"round {k + 1}/{repeats} done", file=sys.stderr, flush=True)
        return {"rows": rows, "lines": lines}
    finally:
        try:
            stop_all(graceful=False)
        finally:
            if engine is not None:
                engine.engine.close()
            srv.stop()


def engine_threads(threads: int, n_images: int, passes: int) -> dict:
    """In a child process: the engine on `threads` threads pinned to as many
    cores, one image at a time over the mix; img/s over `passes` passes."""
    from serve_app.engine import OcrEngine, default_engine_config

    cores = sorted(os.sched_getaffinity(0))[:threads]
    cfg = default_engine_config()
    cfg = cfg.model_copy(update={"predictor": cfg.predictor.model_copy(
        update={"cpu_math_library_num_threads": threads, "cpu_affinity": cores})})
    names = image_mix(n_images)
    data = [(PEER / n).read_bytes() for n in names]
    with OcrEngine(cfg) as eng:
        eng.warm()
        for d in data:
            eng.read(d)
        t = time.perf_counter()
        for _ in range(passes):
            for d in data:
                eng.read(d)
        seconds = time.perf_counter() - t
    return {"threads": threads, "cores": cores, "images": len(data) * passes, "seconds": seconds,
            "rate": len(data) * passes / seconds}


def speedup(n_images: int, passes: int, rounds: int = 1) -> dict:
    """The engine on 1 and 2 threads, each in a child process, alternating
    (1, 2, 1, 2, ...) for `rounds` rounds so that drifting load from other
    users falls on both; img/s over all of each one's timed images."""
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(rounds):
        for threads in (1, 2):
            p = subprocess.run([sys.executable, "-m", "load_tests.hops", "--engine-threads", str(threads), "--n-images",
                                str(n_images), "--passes", str(passes)], cwd=ROOT, capture_output=True, text=True, timeout=600)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                sys.exit(f"engine on {threads} threads failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
            runs[threads].append(json.loads(line[-1][7:]))
            print(f"engine, {threads} thread(s): {runs[threads][-1]['rate']:.2f} img/s", file=sys.stderr, flush=True)
    out = {}
    for threads, rs in runs.items():
        images, seconds = sum(r["images"] for r in rs), sum(r["seconds"] for r in rs)
        out[threads] = {**rs[0], "images": images // rounds, "seconds": seconds, "rate": images / seconds,
                        "rates": [round(r["rate"], 3) for r in rs]}
    return out


# -- the tables ------------------------------------------------------------------------


def f(x: float, nd: int = 0) -> str:
    return "n/a" if x != x else f"{x:.{nd}f}"


def report(result: dict) -> str:
    rows, lines = result["rows"], result["lines"]
    med = {s: {label: median_parts(r) for label, r in per.items() if r} for s, per in rows.items()}
    eng = med["engine"]
    out = [f"Run {result['started']}; {result['repeats']} rounds, one request at a time; load average at start "
           f"{result['load'][0]}, at end {result['load'][1]}.", ""]
    out += ["Per image, median client latency (ms) and what each system adds over the in-process engine:", "",
            "| image | lines | engine | simple server | " + " | ".join(MODES) + " | simple - engine | "
            + " | ".join(f"{m} - engine" for m in MODES) + " |",
            "|---|---:|" + "---:|" * (2 + 2 * len(MODES) + 1)]
    for label in IMAGES:
        e = eng[label]["latency"]
        cells = [f(med[s][label]["latency"]) for s in SYSTEMS]
        diffs = [f(med[s][label]["latency"] - e) for s in ("simple server", *MODES)]
        n = "/".join(str(lines[s].get(label, "?")) for s in SYSTEMS)
        n = n.split("/")[0] if len(set(n.split("/"))) == 1 else n
        out.append(f"| {label} | {n} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
    summary = {s: median(med[s][label]["latency"] - eng[label]["latency"] for label in IMAGES)
               for s in ("simple server", *MODES)}
    cells = ["**median over images**", ""] + [""] * len(SYSTEMS) + [f"**{f(summary[s], 1)}**"
                                                                   for s in ("simple server", *MODES)]
    out.append("| " + " | ".join(cells) + " |")
    out += ["", "What the service adds over the engine, part by part (ms, medians per image): proxy = client "
            "latency - the ingress's Server-Timing; ingress = its time - the pipeline's total (its own work, and "
            "the hop to the pipeline where the pipeline is a deployment); per stage, compute = the replica's "
            "predictor time - the engine's, hop = the rest of the stage's time (hop, transfer, wait) - the "
            "engine's rest (its resize/crop work around the same call):", "",
            "| image | system | adds | proxy | ingress | decode | det compute | det hop | cls compute | cls hop | "
            "rec compute | rec hop | parts sum |", "|---|---|" + "---:|" * 11]
    parts_med: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
    for label in IMAGES:
        for m in MODES:
            d = over_engine(med[m][label], eng[label])
            for k, v in d.items():
                parts_med[m].setdefault(k, []).append(v)
            out.append(f"| {label} | {m} | {f(d['latency'])} | {f(d['proxy'])} | {f(d['ingress'])} | "
                       f"{f(d['decode'])} | " + " | ".join(f"{f(d[f'{s}_compute'])} | {f(d[f'{s}_hop'])}"
                                                          for s in STAGES) + f" | {f(d['parts_sum'])} |")
    for m in MODES:
        d = {k: median(v) for k, v in parts_med[m].items()}
        out.append(f"| **median over images** | {m} | {f(d['latency'], 1)} | {f(d['proxy'], 1)} | "
                   f"{f(d['ingress'], 1)} | {f(d['decode'], 1)} | "
                   + " | ".join(f"{f(d[f'{s}_compute'], 1)} | {f(d[f'{s}_hop'], 1)}" for s in STAGES)
                   + f" | {f(d['parts_sum'], 1)} |")
    out += ["", "Stage times themselves (ms, medians): time in the pipeline / predictor time in it:", "",
            "| image | system | det | cls | rec | pipeline total |", "|---|---|---:|---:|---:|---:|"]
    for label in IMAGES:
        for s in ("engine", *MODES):
            x = med[s][label]
            out.append(f"| {label} | {s} | " + " | ".join(f"{f(x[t])} / {f(x[f'{t}_compute'])}" for t in STAGES)
                       + f" | {f(x['total'])} |")
    sp = result.get("speedup")
    if sp:
        s2 = sp["2"]["rate"] / sp["1"]["rate"]
        p = amdahl_fraction(s2)
        out += ["", f"Engine (= the simple server's work, one image at a time) over the "
                f"{sp['1']['images'] // max(1, result['passes'])}-image mix ({sp.get('measured', 'with the run')}): "
                f"1 thread on core {sp['1']['cores']} {sp['1']['rate']:.2f} img/s {sp['1'].get('rates', '')}, "
                f"2 threads on {sp['2']['cores']} {sp['2']['rate']:.2f} img/s {sp['2'].get('rates', '')}: speedup "
                f"{s2:.2f}x (Amdahl's parallel fraction {p:.2f}, so at most {1 / max(1e-9, 1 - p):.1f}x on any "
                f"number of threads)."]
    goal = {m: summary[m] <= 20 for m in MODES}
    out += ["", "Goal p50 at one client <= engine + 20 ms (median over images of the per-image difference): "
            + "; ".join(f"{m} {summary[m]:+.1f} ms ({'met' if goal[m] else 'missed'})" for m in MODES)]
    return "\n".join(out)


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repeats", type=int, default=8, help="rounds (each image once to each system)")
    ap.add_argument("--n-images", type=int, default=20, help="images in the thread-speedup mix")
    ap.add_argument("--passes", type=int, default=2, help="timed passes over the mix per thread count")
    ap.add_argument("--no-speedup", action="store_true", help="skip the engine's 1 -> 2 thread speedup")
    ap.add_argument("--out", type=Path, default=ROOT / "load_tests/out/hops.json")
    ap.add_argument("--from-raw", action="store_true", help="print the tables of --out's recorded run")
    ap.add_argument("--speedup-rounds", type=int, default=1, help="alternating 1/2-thread rounds")
    ap.add_argument("--speedup-only", action="store_true",
                    help="measure only the thread speedup and put it into --out's recorded run")
    ap.add_argument("--engine-threads", type=int, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    a = args
    if a.engine_threads:
        print("RESULT " + json.dumps(engine_threads(a.engine_threads, a.n_images, a.passes)))
        return
    if a.speedup_only:
        result = json.loads(a.out.read_text())
        load = tuple(round(x, 2) for x in os.getloadavg())
        result["speedup"] = {str(k): v for k, v in speedup(a.n_images, a.passes, a.speedup_rounds).items()}
        result["speedup"]["measured"] = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
                                         f"{load} -> {tuple(round(x, 2) for x in os.getloadavg())}")
        a.out.write_text(json.dumps(result))
        print(report(result))
        return
    if a.from_raw:
        print(report(json.loads(a.out.read_text())))
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = tuple(round(x, 2) for x in os.getloadavg())
    port, simple_port = free_ports(2)
    # The thread speedup first: once this process has used Serve handles,
    # their background tasks start a new local Ray after ray.shutdown().
    sp = None if a.no_speedup else {str(k): v for k, v in speedup(a.n_images, a.passes, a.speedup_rounds).items()}
    result = measure(a.repeats, port, simple_port, a.out.parent)
    result.update(started=started, repeats=a.repeats, passes=a.passes)
    if sp:
        result["speedup"] = sp
    result["load"] = [list(load0), [round(x, 2) for x in os.getloadavg()]]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result))
    print(report(result))


if __name__ == "__main__":
    sys.exit(standalone(__name__))
