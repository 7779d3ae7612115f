"""Where `serve run` to ready goes, phase by phase, for a model-free app
(the floor: what Ray and Serve take on this machine before any of our
work) and each config, started twice each, in one run.

    timeout 900 .venv/bin/python -m load_tests startup serve-run

Each start is harness.service.ServeRun (a temporary copy on a free port, a
fresh journal; the second start reuses the first's compile cache). The
phases are the `serve run` output's own timestamps (MARKS: the CLI's
first line, Ray up, Serve up, the app built, the first replica added, the
last model replica's "replica ready") and /readyz 200 as the client saw it.
`--scale-up`: a replica added after ready instead (load_tests/scale_up.py).

    timeout 600 .venv/bin/python -m load_tests startup serve-run --scale-up [--idle]"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Optional

from load_tests import scale_up
from harness.service import ServeRun, parse_config

ROOT = Path(__file__).resolve().parents[1]

FLOOR = "floor"
FLOOR_CONFIG = {
    "proxy_location": "HeadOnly",
    "http_options": {"host": "127.0.0.1", "port": 8000},
    "applications": [{"name": "floor", "route_prefix": "/", "import_path": "load_tests.serve_floor_app:build",
                      "args": {}}],
}
# (phase, the log line that ends it); the last one's time is /readyz 200.
MARKS = [("CLI start", r"Running config file"), ("Ray up", r"Started a local Ray instance"),
         ("Serve up", r"Started Serve in namespace"), ("app built", r"Imported and built app"),
         ("replicas added", r"Adding \d+ replicas? to Deployment"),
         ("model replicas ready", r"replica ready: load")]
STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def stamp(line: str) -> Optional[float]:
    m = STAMP.search(line)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def phases(log: str, t0: float, ready_s: float) -> dict[str, Optional[float]]:
    """Seconds from `serve run` to the end of each phase (the first line of
    each mark; the last "replica ready" line for the model replicas)."""
    out: dict[str, Optional[float]] = {}
    for name, pat in MARKS:
        hits = [h for h in (stamp(x) for x in log.splitlines() if re.search(pat, x)) if h is not None]
        out[name] = ((max if name == "model replicas ready" else min)(hits) - t0) if hits else None
    return {**out, "/readyz 200": ready_s}


def start_once(spec: str, work: Path, cache: Path, timeout_s: float) -> dict:
    import yaml

    if spec == FLOOR:
        path = work / "floor.yaml"
        path.write_text(yaml.safe_dump(FLOOR_CONFIG))
        run = ServeRun(path, work, cache)
    else:
        file, overrides = parse_config(spec)
        run = ServeRun(ROOT / file if not Path(file).is_absolute() else Path(file), work, cache, overrides)
    before = run.log_path.read_text() if run.log_path.exists() else ""
    t0 = time.time()
    try:
        ready_s = run.start(timeout_s)
        time.sleep(1.0)  # the last log lines reach the CLI's output
    finally:
        run.stop()
    log = run.log_path.read_text()[len(before):]
    return phases(log, t0, ready_s)


def table(results: dict[str, list[dict]]) -> str:
    from load_tests.stats import md_table

    runs = [(f"{n}, start {k + 1}", r) for n, rs in results.items() for k, r in enumerate(rs)]
    return "\n".join(md_table(["s from `serve run`", *(name for name, _ in runs)], [
        [phase, *("-" if r.get(phase) is None else f"{r[phase]:.1f}" for _, r in runs)]
        for phase in [m for m, _ in MARKS] + ["/readyz 200"]]))


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--configs", default=f"{FLOOR},deployments.light.yaml,deployments.yaml",
                    help=f"comma-separated; '{FLOOR}' is the model-free app; a file may carry +key=value overrides")
    ap.add_argument("--starts", type=int, default=2, help="starts of each config (the later ones reuse the cache)")
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--scale-up", action="store_true",
                    help="instead: a load step to an autoscaled detector replica answering (the options below)")
    scale_up.add_cli_args(ap.add_argument_group("--scale-up"))


def main(args: argparse.Namespace) -> int:
    a = args
    if a.scale_up:
        return scale_up.main(a)
    results: dict[str, list[dict]] = {}
    t_run = time.time()
    for spec in [s.strip() for s in a.configs.split(",") if s.strip()]:
        work = Path(tempfile.mkdtemp(prefix="serve-phases-"))
        cache = work / "compile-cache"
        try:
            for k in range(a.starts):
                r = start_once(spec, work, cache, a.timeout)
                results.setdefault(spec, []).append(r)
                print(f"{spec} start {k + 1}: ready {r['/readyz 200']:.1f} s", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nRun {datetime.utcfromtimestamp(t_run):%Y-%m-%d %H:%M} UTC, {time.time() - t_run:.0f} s\n")
    print(table(results))
    ready = {n: statistics.median(r["/readyz 200"] for r in v) for n, v in results.items()}
    if FLOOR in ready:
        print("\nmedian ready s: " + ", ".join(f"{n} {s:.1f} (floor + {s - ready[FLOOR]:.1f})" for n, s in ready.items()))


SMOKE_LOG = """\
2026-12-02 09:31:33,860\tINFO scripts.py:489 -- Running config file: 'deployments.light.yaml'.
2026-12-02 09:31:36,773\tINFO worker.py:2029 -- Started a local Ray instance. View the dashboard at http://127.0.0.1:8265
INFO 2026-12-02 09:31:38,243 serve 24518 -- Started Serve in namespace "serve".
(ServeController pid=24988) INFO 2026-12-02 09:31:39,317 controller 24988 -- Imported and built app 'ocr' successfully.
(ServeController pid=24988) INFO 2026-12-02 09:31:39,479 controller 24988 -- Adding 1 replica to Deployment(name='TextRecognizer', app='ocr').
(ServeReplica:ocr:TextRecognizer pid=1) INFO 2026-12-02 09:31:46,128 ocr_TextRecognizer m6 -- cls replica ready: load 0.25s, warm-up 0.12s over 6 shapes
(ServeReplica:ocr:TextRecognizer pid=1) INFO 2026-12-02 09:31:47,271 ocr_TextRecognizer m6 -- det replica ready: load 0.33s, warm-up 3.63s over 21 shapes
(ServeReplica:ocr:TextRecognizer pid=1) INFO 2026-12-02 09:31:46,900 ocr_TextRecognizer m6 -- rec replica ready: load 0.48s, warm-up 1.42s over 15 shapes
"""


def smoke(args: argparse.Namespace) -> int:
    """The phases read from a captured `serve run` log, and the table: each
    phase ends at its first line, the models at their last "ready" (no Ray)."""
    from load_tests.cli import check

    got = phases(SMOKE_LOG, datetime(2026, 12, 2, 9, 31, 31, 800000).timestamp(), 16.1)
    want = {"CLI start": 2.06, "Ray up": 4.973, "Serve up": 6.443, "app built": 7.517, "replicas added": 7.679,
            "model replicas ready": 15.471, "/readyz 200": 16.1}
    check(got.keys() == want.keys() and all(abs(got[k] - v) < 1e-3 for k, v in want.items()), f"phases: {got}")
    missing = phases(SMOKE_LOG.splitlines()[0], datetime(2026, 12, 2, 9, 31, 33).timestamp(), 7.0)
    rows = table({"floor": [missing]}).splitlines()
    check("| Ray up | - |" in rows and "| /readyz 200 | 7.0 |" in rows, "a phase missing from the log is a dash")
    print(table({"smoke": [got]}))
    return 0
