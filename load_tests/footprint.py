"""Footprint of a Serve config, side by side with lighter ones: PSS per
process and in total, `serve run` to ready (first and second start), one
client's p50 over the in-process engine, img/s at 8 clients, lines read and
CER, in one run (docs/performance.md, "The two CPU profiles", has the
method and the figures).

    timeout 1200 .venv/bin/python -m load_tests memory footprint
    ... footprint --configs deployments.yaml,deployments.light.yaml --rounds 2

A config is a file with optional `+key.path=value` overrides of its
application args (YAML values), e.g. `deployments.yaml+recognizer.warm=full`.
Each round: the engine in a child process (warmed) reads the peer images
once and the text-line images `--line-passes` more times; then each config
(the order reversed every other round) runs as `serve run` of a temporary
copy (a free port, a fresh journal and compile cache) and is timed to
/readyz 200 (every stage with a ready, warmed replica); its first request
is timed alone, then, once the recogniser's shapes built after ready are
built, one client reads the same images (`Cache-Control: no-cache`); PSS
of the `serve run` process and its descendants is read then, after
IDLE_S idle and after 8 clients; the engine, started again beside the
service, and the service read each text-line image in turn (the engine
first every other pair); each further model set is loaded; the service
is stopped and started again on the same cache: the second start.
Other users' load is printed with the figures."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from harness import service
from harness.procfs import load_line
from harness.service import ServeRun, parse_config
from load_tests.stats import md_table, median
from load_tests.cli import standalone

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_CONFIGS = ("deployments.yaml+recognizer.warm=full", "deployments.yaml",
                   "deployments.light.yaml+recognizer.warm=full", "deployments.light.yaml")
FIRST_IMAGE = "rapidocr_en.jpg"  # a short page: read first after ready, then again in the peer pass
# One line of text each: word crops and text-line images of the peer set.
TEXT_LINE_PREFIXES = ("mmocr_word_", "paddleocr_en_word_", "paddleocr_word_", "rapidocr_text_rec",
                      "rapidocr_en_rec", "mmocr_demo_text_recog")


# -- pure parts -------------------------------------


DEPLOYMENT_GROUPS = {"TextDetector": "det replica", "DirectionClassifier": "cls replica",
                     "TextRecognizer": "rec replica", "OcrPipeline": "pipeline", "OcrIngress": "ingress",
                     "JobStore": "job store"}


def role(cmd: str) -> str:
    """A service process's role from its command line (truncated ones
    too): a replica's deployment, Ray's and Serve's own processes, the
    `serve run` CLI."""
    if "serve run" in cmd or cmd.split(" ")[0].endswith("/serve"):
        return "serve run (CLI)"
    m = re.search(r"ServeReplica:[^:\s]+:(\w+)", cmd)
    if m:
        return DEPLOYMENT_GROUPS.get(m.group(1), m.group(1))
    for needle, group in (("ProxyActor", "proxy"), ("ServeController", "controller"), ("gcs_server", "gcs"),
                          ("raylet", "raylet"), ("dashboard", "dashboard"), ("ray::", "ray other"),
                          ("log_monitor", "ray other"), ("runtime_env", "ray other"), ("/ray/", "ray other"),
                          ("IDLE", "ray other")):
        if needle in cmd:
            return group
    return "other"


def group_pss(procs: list[dict]) -> dict[str, dict]:
    """role -> {"n", "pss", "rss"} (MB) summed over its processes, in a fixed
    order: model replicas, request path, Ray's machinery, the rest."""
    order = ("rec replica", "det replica", "cls replica", "ingress", "pipeline", "job store", "proxy",
             "controller", "gcs", "raylet", "dashboard", "ray other", "serve run (CLI)")
    out: dict[str, dict] = {}
    for p in procs:
        g = out.setdefault(p["role"], {"n": 0, "pss": 0.0, "rss": 0.0, "max": 0.0})
        g["n"] += 1
        g["pss"] += p["pss"]
        g["rss"] += p["rss"]
        g["max"] = max(g["max"], p["pss"])
    rank = {r: i for i, r in enumerate(order)}
    return dict(sorted(out.items(), key=lambda kv: (rank.get(kv[0], len(order)), kv[0])))


def text_lines(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith(TEXT_LINE_PREFIXES)]


def reading(reads: dict[str, list[str]], engine_reads: Optional[dict[str, list[str]]],
            labels: dict[str, list[str]]) -> dict:
    """Lines read, CER on the labels, and images read exactly as the engine
    reads them (same texts in the same order)."""
    from harness.peer import cer

    same = sum(1 for n, t in reads.items() if engine_reads is not None and engine_reads.get(n) == t)
    return {"lines": sum(map(len, reads.values())), "cer": cer(reads, labels), "same_as_engine": same,
            "images": len(reads)}


def _f(x, nd=0, plus=False) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{x:+.{nd}f}" if plus else f"{x:.{nd}f}"


def engine_rate(engine: dict) -> float:
    """The engine's img/s over its peer pass (one image at a time, warmed)."""
    return 1000 * len(engine["ms_peer"]) / sum(engine["ms_peer"])


def table(engine: dict, runs: list[dict]) -> str:
    """Side by side: one column per (config, round), rows as the issue asks."""
    head = [f"{r['name']} (round {r['round']})" for r in runs]
    roles: list[str] = []
    for r in runs:
        for k in r["groups"]:
            if k not in roles:
                roles.append(k)
    rows: list[tuple[str, list[str]]] = []
    for k in roles:
        rows.append((f"PSS MB: {k}", [
            f"{_f(r['groups'][k]['pss'])} ({r['groups'][k]['n']})" if k in r["groups"] else "-" for r in runs]))
    rows += [
        ("**PSS MB total** (processes), after the peer set", [
            f"**{_f(r['pss_total'])}** ({r['n_procs']})" for r in runs]),
        ("RSS MB total, after the peer set", [_f(r["rss_total"]) for r in runs]),
        (f"PSS MB total, the same after {IDLE_S:g} s idle (the model heaps trimmed)",
         [_f(r.get("pss_total_idle")) for r in runs]),
        ("PSS MB total after 8 clients", [_f(r["pss_total_loaded"]) for r in runs]),
        ("`serve run` to ready s, first start (empty compile cache)", [_f(r["ready_first_s"], 1) for r in runs]),
        ("`serve run` to ready s, second start", [_f(r["ready_second_s"], 1) for r in runs]),
        ("one client p50 ms, peer set (engine " + _f(engine["p50_peer"]) + ")",
         [f"{_f(r['p50_peer'])} ({_f(r['p50_peer'] - engine['p50_peer'], plus=True)})" for r in runs]),
        ("one client p50 ms, text lines (engine " + _f(engine["p50_lines"]) + ")",
         [f"{_f(r['p50_lines'])} ({_f(r['p50_lines'] - engine['p50_lines'], plus=True)})" for r in runs]),
        ("one client p50 ms, text lines, paired image by image with the engine beside the service (engine p50): "
         "the p50s' difference / the p50 of the differences", [
             f"{_f(r['paired']['service_p50'])} ({_f(r['paired']['engine_p50'])}): "
             f"{_f(r['paired']['service_p50'] - r['paired']['engine_p50'], 1, plus=True)} / "
             f"{_f(r['paired']['over_p50'], 1, plus=True)}" if r.get("paired") else "-" for r in runs]),
        (f"first request after ready ms ({FIRST_IMAGE}; in the peer pass after it)",
         [f"{_f(r['first_ms'])} ({_f(r['steady_ms'])})" for r in runs]),
        ("recogniser shapes left to build: after the first request / at the PSS reading",
         [f"{_f(r.get('shapes_left_ready'))} / {_f(r.get('shapes_left_pss'))}" for r in runs]),
        ("s waited after the first request for them (the one-client pass starts after)",
         [_f(r.get("shapes_built_s"), 1) for r in runs]),
        (f"img/s at 8 clients (the engine one image at a time {engine_rate(engine):.2f}): its ratio",
         [f"{_f(r['rate_8'], 2)}: {r['rate_8'] / engine_rate(engine):.2f}x" for r in runs]),
        *((f"set {name}: first request s (its load) / PSS MB added / the service's own measure (GET /v1/models mb)", [
            f"{_f(r['sets'][name]['first_s'], 1)} / {_f(r['sets'][name]['added_mb'], plus=True)}"
            f" / {_f(r['sets'][name].get('service_mb'))}"
            + ("" if r["sets"][name]["status"] == 200 else f" ({r['sets'][name]['status']})")
            if name in r.get("sets", {}) else "-" for r in runs])
          for name in dict.fromkeys(n for r in runs for n in r.get("sets", {}))),
        ("errors at 8 clients", [str(r["errors_8"]) for r in runs]),
        (f"lines read (engine {engine['reading']['lines']})", [str(r["reading"]["lines"]) for r in runs]),
        (f"CER on labels (engine {engine['reading']['cer']:.4f})", [f"{r['reading']['cer']:.4f}" for r in runs]),
        ("images read as the engine reads them", [
            f"{r['reading']['same_as_engine']}/{r['reading']['images']}" for r in runs]),
    ]
    return "\n".join(md_table(["", *head], ([label, *cells] for label, cells in rows)))


# -- the engine (child process) ----------------------------------------------------


def warmed_engine(names: list[str], precision: Optional[str] = None):
    """The in-process engine's defaults (OpenVINO's precision set when given),
    warmed (a context manager), and the images' bytes."""
    from harness.peer import PEER
    from serve_app.engine import OcrEngine, default_engine_config

    config = default_engine_config()
    if precision:
        config = config.model_copy(update={"predictor": config.predictor.model_copy(
            update={"openvino_precision": precision})})
    eng = OcrEngine(config)
    eng.warm()
    return eng, {n: (PEER / n).read_bytes() for n in names}


def timed_read(eng, data: bytes) -> tuple[float, list[str]]:
    t = time.perf_counter()
    res = eng.read(data)
    return (time.perf_counter() - t) * 1000, [ln.text for ln in res.lines]


def timed_pass(read, names: list[str], lines: list[str], passes: int) -> tuple[list, list, dict]:
    """`read(name)` -> (ms, texts) over every image, then `passes` more times
    over the text-line images: (ms per image, ms per text-line read, texts)."""
    ms_peer, ms_lines, reads = [], [], {}
    for n in names:
        ms, reads[n] = read(n)
        ms_peer.append(ms)
        if n in lines:
            ms_lines.append(ms)
    return ms_peer, ms_lines + [read(n)[0] for _ in range(passes) for n in lines], reads


def engine_child(names: list[str], lines: list[str], passes: int, precision: Optional[str] = None) -> dict:
    eng, data = warmed_engine(names, precision)
    with eng:
        ms_peer, ms_lines, reads = timed_pass(lambda n: timed_read(eng, data[n]), names, lines, passes)
    return {"ms_peer": ms_peer, "ms_lines": ms_lines, "reads": reads}


CHILD_ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}


def run_engine(names: list[str], lines: list[str], passes: int, precision: Optional[str] = None) -> dict:
    cmd = [sys.executable, "-m", "load_tests.footprint", "--engine-child",
           json.dumps([names, lines, passes, precision])]
    out = subprocess.run(cmd, env=CHILD_ENV, capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    if out.returncode != 0:
        raise RuntimeError(f"engine child failed:\n{out.stderr[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {**r, "p50_peer": median(r["ms_peer"]), "p50_lines": median(r["ms_lines"])}


def engine_server(names: list[str], precision: Optional[str] = None) -> None:
    """The engine as run_engine's, kept: warmed on `names`, then one read per
    image name on stdin, its ms on stdout (a line each)."""
    eng, data = warmed_engine(names, precision)
    with eng:
        for n in names:
            eng.read(data[n])
        print("ready", flush=True)
        for line in sys.stdin:
            print(f"{timed_read(eng, data[line.strip()])[0]:.3f}", flush=True)


class EngineBeside:
    """engine_server in a child process, beside a running service."""

    def __init__(self, names: list[str], precision: Optional[str] = None):
        cmd = [sys.executable, "-m", "load_tests.footprint", "--engine-server", json.dumps([names, precision])]
        self.proc = subprocess.Popen(cmd, env=CHILD_ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, cwd=str(ROOT))
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the engine beside the service did not start")

    def read(self, name: str) -> float:
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def paired(engine_ms: list[float], service_ms: list[float]) -> dict:
    """The service's one-client overhead from reads paired image by image:
    each side's p50 and the p50 of the per-pair differences."""
    return {"engine_p50": median(engine_ms), "service_p50": median(service_ms),
            "over_p50": median([s - e for e, s in zip(engine_ms, service_ms)]), "pairs": len(engine_ms)}


def post(session, url: str, name: str, data: bytes) -> tuple[float, Optional[list[str]]]:
    ctype = "image/png" if name.endswith(".png") else "image/jpeg"
    t = time.perf_counter()
    try:
        r = session.post(f"{url}/v1/ocr", data=data, timeout=120,
                         headers={"Content-Type": ctype, "Cache-Control": "no-cache"})
        ms = (time.perf_counter() - t) * 1000
        if r.status_code != 200:
            return ms, None
        return ms, [x["text"] for x in r.json()["results"]]
    except Exception:
        return (time.perf_counter() - t) * 1000, None


def clients(url: str, names: list[str], data: dict[str, bytes], n_clients: int, passes: int) -> dict:
    """n_clients closed-loop clients, client k starting k/n of the way into
    the list, until `passes` passes over it are done in all."""
    import requests

    todo = [names[(i + k * len(names) // n_clients) % len(names)]
            for k in range(n_clients) for i in range(passes * len(names) // n_clients)]
    per_client = [todo[k::n_clients] for k in range(n_clients)]
    errors = [0] * n_clients

    def work(k: int) -> None:
        with requests.Session() as s:
            for n in per_client[k]:
                if post(s, url, n, data[n])[1] is None:
                    errors[k] += 1

    t = time.perf_counter()
    with ThreadPoolExecutor(max(n_clients, 1)) as pool:
        list(pool.map(work, range(n_clients)))
    seconds = time.perf_counter() - t
    return {"rate": len(todo) / seconds, "errors": sum(errors), "requests": len(todo)}


IDLE_S = 3.0  # the idle PSS reading's wait after the peer set


def paired_lines(url: str, lines: list[str], data: dict[str, bytes], passes: int,
                 precision: Optional[str]) -> dict:
    """The engine (EngineBeside) and the service (one client, no cache) read
    each text-line image in turn, `passes` times, the engine first every
    other pair: both on the same machine at the same moments."""
    import requests

    eng = EngineBeside(lines, precision)
    engine_ms, service_ms = [], []
    try:
        with requests.Session() as s:
            def served(n: str) -> float:
                ms, texts = post(s, url, n, data[n])
                if texts is None:
                    raise RuntimeError(f"the service failed on {n} in the paired pass")
                return ms

            for k, n in enumerate(lines * passes):
                if k % 2 == 0:  # the engine first every other pair: neither side always follows the other
                    engine_ms.append(eng.read(n))
                    service_ms.append(served(n))
                else:
                    service_ms.append(served(n))
                    engine_ms.append(eng.read(n))
    finally:
        eng.close()
    return paired(engine_ms, service_ms)


def measure_config(name: str, config: Path, names: list[str], lines: list[str], passes: int,
                   engine: dict, labels: dict, n_clients: int, timeout_s: float,
                   overrides: Optional[list] = None, precision: Optional[str] = None) -> dict:
    import requests

    from harness.peer import PEER

    data = {n: (PEER / n).read_bytes() for n in names}
    work = Path(tempfile.mkdtemp(prefix="ocr-footprint-"))
    svc = ServeRun(config, work, work / "cache", overrides)
    out: dict = {"name": name, "config": str(config)}
    try:
        out["ready_first_s"] = svc.start(timeout_s)
        with requests.Session() as s:
            first_ms = post(s, svc.url, FIRST_IMAGE, data[FIRST_IMAGE])[0]
            out["shapes_left_ready"] = service.shapes_left(svc.url)
            # The timed pass at steady state, as the engine's (warmed): after the
            # recogniser's shapes built after ready (recognizer.warm: core).
            out["shapes_built_s"] = service.wait_shapes_built(120, url=svc.url)
            ms_peer, ms_lines, reads = timed_pass(lambda n: post(s, svc.url, n, data[n]), names, lines, passes)
        failed = [n for n, texts in reads.items() if texts is None]
        if failed:
            raise RuntimeError(f"{name}: {', '.join(failed)} failed")
        procs = [dict(p, role=role(p["cmd"])) for p in svc.processes()]
        out["shapes_left_pss"] = service.shapes_left(svc.url)
        out.update(first_ms=first_ms, steady_ms=ms_peer[names.index(FIRST_IMAGE)], p50_peer=median(ms_peer),
                   p50_lines=median(ms_lines),
                   ms_peer=ms_peer, reading=reading(reads, engine["reads"], labels), procs=procs,
                   groups=group_pss(procs), pss_total=sum(p["pss"] for p in procs),
                   rss_total=sum(p["rss"] for p in procs), n_procs=len(procs))
        time.sleep(IDLE_S)  # past malloc_trim_idle_s (1 s by default): the model processes' heaps trimmed
        out["pss_total_idle"] = svc.pss_mb()
        load = clients(svc.url, names, data, n_clients, 2)
        out.update(rate_8=load["rate"], errors_8=load["errors"],
                   pss_total_loaded=svc.pss_mb())
        out["paired"] = paired_lines(svc.url, lines, data, passes + 1, precision)
        out["sets"] = further_sets(svc, data[lines[0]])
        svc.stop()
        out["ready_second_s"] = svc.start(timeout_s)
    finally:
        svc.stop()
        shutil.rmtree(work, ignore_errors=True)  # its journal, compile cache and log: nothing left behind
    return out


def further_sets(svc: ServeRun, image: bytes) -> dict[str, dict]:
    """Each catalogued set other than the default (GET /v1/models), in
    turn: seconds from its first request to its 200 (its load, following
    503 + Retry-After), and the service's PSS after it over the PSS before
    (both after IDLE_S idle); then each one's state and the PSS its load
    added as the service measured it (GET /v1/models)."""
    import base64

    import requests

    catalogue = requests.get(f"{svc.url}/v1/models", timeout=30).json()
    body = {"image": {"base64": base64.b64encode(image).decode()}}
    out = {}
    for m in catalogue["models"][1:]:
        time.sleep(IDLE_S)
        before = svc.pss_mb()
        t, status = time.perf_counter(), 0
        while time.perf_counter() - t < 600:
            r = requests.post(f"{svc.url}/v1/ocr", json={**body, "options": {"model": m["name"]}}, timeout=120,
                              headers={"Cache-Control": "no-cache"})
            status = r.status_code
            if status != 503:
                break
            time.sleep(min(float(r.headers.get("Retry-After", 1)), 2.0))
        first_s = time.perf_counter() - t
        time.sleep(IDLE_S)
        out[m["name"]] = {"first_s": first_s, "status": status,
                          "added_mb": svc.pss_mb() - before}
    for m in requests.get(f"{svc.url}/v1/models", timeout=30).json()["models"][1:]:
        out[m["name"]].update(service_mb=m.get("mb"), state=m.get("state"))  # loaded, all: none unloaded
    return out


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help="comma-separated Serve config files (relative to the repository); the first is the baseline")
    ap.add_argument("--rounds", type=int, default=1, help="rounds; the configs' order is reversed every other one")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--line-passes", type=int, default=2, help="extra passes over the text-line images")
    ap.add_argument("--ready-timeout", type=float, default=240)
    ap.add_argument("--json", type=Path, help="also write every figure here")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                    help="OpenVINO's precision for the engine and every config (default: each one's, `auto`: bf16 "
                    "on a CPU with native bf16); fp32 on such a CPU is what `auto` picks on one without it (the "
                    "cores' other instructions stay this CPU's)")
    ap.add_argument("--engine-child", help=argparse.SUPPRESS)
    ap.add_argument("--engine-server", help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    a = args
    if a.engine_child:
        print(json.dumps(engine_child(*json.loads(a.engine_child))))
        return
    if a.engine_server:
        engine_server(*json.loads(a.engine_server))
        return
    from harness.peer import expected, peer_names

    names = peer_names()
    lines = text_lines(names)
    labels = {n: e["expected_texts"] for n, e in expected().items() if e["kind"] == "ground-truth-label"}
    configs = []
    for spec in a.configs.split(","):
        path, overrides = parse_config(spec)
        if a.precision:  # the service's predictors as the engine's
            overrides.append((["engine", "predictor", "openvino_precision"], a.precision))
        if not (ROOT / path).is_file():
            sys.exit(f"config {path} not found")
        configs.append((spec.strip(), ROOT / path, overrides))
    started, load0 = time.time(), os.getloadavg()
    engines, runs = [], []
    for rnd in range(a.rounds):
        eng = run_engine(names, lines, a.line_passes, a.precision)
        eng["reading"] = reading(eng["reads"], eng["reads"], labels)
        engines.append(eng)
        print(f"round {rnd}: engine p50 {eng['p50_peer']:.0f} ms (peer), {eng['p50_lines']:.0f} ms (lines)",
              flush=True)
        for name, path, overrides in (configs if rnd % 2 == 0 else configs[::-1]):
            r = measure_config(name, path, names, lines, a.line_passes, eng, labels, a.clients, a.ready_timeout,
                               overrides, a.precision)
            r["round"] = rnd
            runs.append(r)
            print(f"round {rnd} {name}: PSS {r['pss_total']:.0f} MB, ready {r['ready_first_s']:.1f}/"
                  f"{r['ready_second_s']:.1f} s, p50 {r['p50_peer']:.0f}/{r['p50_lines']:.0f} ms, "
                  f"{r['rate_8']:.2f} img/s, lines {r['reading']['lines']}; paired on text lines "
                  f"{r['paired']['service_p50']:.0f} ms against the engine's {r['paired']['engine_p50']:.0f}, "
                  f"differences' p50 {r['paired']['over_p50']:+.1f} ms", flush=True)
    print(f"\nRun {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {time.time() - started:.0f} s; "
          f"{load_line(load0)}; OpenVINO precision {a.precision or 'auto'}; "
          f"{len(names)} peer images, {len(lines)} text-line "
          f"images; engine per round: " + ", ".join(
              f"p50 {e['p50_peer']:.0f} / {e['p50_lines']:.0f} ms" for e in engines) + "\n")
    for rnd in range(a.rounds):
        print(f"Round {rnd} (service p50 minus this round's engine p50 in brackets):\n")
        print(table(engines[rnd], [r for r in runs if r["round"] == rnd]))
        print()
    if a.json:
        a.json.write_text(json.dumps({"engines": engines, "runs": runs}, indent=1, default=str))


def smoke(args: argparse.Namespace) -> int:
    """The pure parts on fixed figures: which process is what, PSS per role,
    the text-line set, the reading figures, a config variant and the table."""
    from load_tests.cli import check

    check(role("ray::ServeReplica:ocr:TextRecognizer") == "rec replica" and role("ray::ProxyActor") == "proxy"
          and role("/venv/bin/python3 /venv/bin/serve run /tmp/x/config.yaml") == "serve run (CLI)", "roles")
    g = group_pss([{"role": "proxy", "pss": 88.0, "rss": 120.0}, {"role": "rec replica", "pss": 700.0, "rss": 900.0},
                   {"role": "rec replica", "pss": 740.0, "rss": 950.0}])
    check(list(g) == ["rec replica", "proxy"] and g["rec replica"]["pss"] == 1440.0, f"PSS per role: {g}")
    names = ["mmocr_word_1036169.jpg", "paddleocr_en_word_1.png", "rapidocr_en.jpg"]
    check(text_lines(names) == names[:2], "the text-line images are the one-line crops")
    r = reading({"a": ["HELLO"], "b": ["WORLO", "x"]}, {"a": ["HELLO"], "b": ["WORLD", "x"]},
                {"a": ["HELLO"], "b": ["WORLD"]})
    check((r["lines"], r["same_as_engine"], round(r["cer"], 3)) == (3, 1, 0.1), f"reading: {r}")
    path, overrides = parse_config("deployments.yaml+recognizer.warm=full+detector.threads=1")
    check((path, overrides) == ("deployments.yaml", [(["recognizer", "warm"], "full"), (["detector", "threads"], 1)]),
          "a config variant is a file with overrides")
    run = {"name": "deployments.yaml", "round": 0, "groups": {"rec replica": {"n": 2, "pss": 1500.0, "rss": 1500.0,
           "max": 750.0}}, "pss_total": 2500.0, "n_procs": 20, "rss_total": 3000.0, "pss_total_loaded": 2510.0,
           "ready_first_s": 30.0, "ready_second_s": 20.0, "p50_peer": 250.0, "p50_lines": 120.0, "first_ms": 300.0,
           "steady_ms": 200.0, "rate_8": 3.5, "errors_8": 0,
           "reading": {"lines": 665, "cer": 0.0956, "same_as_engine": 60, "images": 60}}
    pr = paired([40.0, 50.0, 45.0], [55.0, 58.0, 70.0])
    check((pr["engine_p50"], pr["service_p50"], pr["over_p50"], pr["pairs"]) == (45.0, 58.0, 15.0, 3),
          f"paired: {pr}")
    run["paired"] = pr
    text = table({"p50_peer": 200.0, "p50_lines": 100.0, "ms_peer": [200.0, 300.0],
                  "reading": {"lines": 665, "cer": 0.0956}}, [run])
    check(text.splitlines()[0] == "|  | deployments.yaml (round 0) |", "the table's header")
    check("engine one image at a time 4.00" in text and "3.50: 0.88x" in text, "img/s against the engine's")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(standalone(__name__))
