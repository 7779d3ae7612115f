"""Ray Serve's throughput-optimized mode (RAY_SERVE_THROUGHPUT_OPTIMIZED=1)
against the default mode, on this machine, with the CPU profile.

    python -m load_tests serve throughput-mode [--seconds 15] [--clients 6] [--repeats 12]

Each mode in its own process and its own Ray cluster (Serve reads the mode
at import, in every process of the cluster): one client sending the peer
set's 1600x1200 receipt (5.76 MB decoded, over the 4 MiB gRPC message: a 500
before stage payloads were sized) and a word image one at a time (p50), then
`clients` clients at once for `seconds` (img/s, p50, p99, statuses); and a
synchronous handle call from a plain driver (another process), with and
without RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=1 in that driver. Prints one
table; a benchmark, not a test (nothing is asserted).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness.peer import PEER
from load_tests.cli import standalone
from load_tests.loadgen import post_file, threaded_load
from load_tests.stats import md_table

REPO = Path(__file__).resolve().parents[1]
RECEIPT = PEER / "mmocr_wildreceipt_1.jpeg"
WORD = PEER / "rapidocr_issue_170.png"
MODES = {"default": {}, "throughput": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}}

DRIVER = """
import json, sys, time, ray
from ray import serve
ray.init(address=sys.argv[1], log_to_driver=False)
data = open(sys.argv[2], "rb").read()
t0 = time.perf_counter()
try:
    r = serve.get_app_handle("ocr").ocr.remote(data).result(timeout_s=120)
    print(json.dumps({"ok": True, "lines": len(r["results"]), "ms": (time.perf_counter() - t0) * 1000}))
except Exception as e:
    print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {str(e)[:160]}"}))
"""


def child(mode: str, out: Path, seconds: float, clients: int, repeats: int,
          loops: tuple[str, ...] = ("0", "1")) -> None:
    from harness.service import load_config, served

    import ray

    from ray.serve._private import constants

    result: dict = {"mode": mode, "grpc_between_deployments": bool(constants.RAY_SERVE_USE_GRPC_BY_DEFAULT)}
    t0 = time.monotonic()
    try:
        with served(load_config(), num_cpus=8) as url:
            result["ready_s"] = time.monotonic() - t0
            r = post_file(url, RECEIPT)
            result["receipt_status"] = r.status_code
            result["receipt_texts"] = [x["text"] for x in r.json().get("results", [])] if r.status_code == 200 else r.text
            for name, path in (("receipt", RECEIPT), ("word", WORD)):
                post_file(url, path)  # first-call costs out
                lat, codes = [], []
                for _ in range(repeats):
                    t = time.perf_counter()
                    codes.append(post_file(url, path).status_code)
                    lat.append((time.perf_counter() - t) * 1000)
                result[f"one_{name}"] = {"p50_ms": statistics.median(lat), "codes": sorted(set(codes))}
            result["saturation"] = threaded_load(url, [RECEIPT, WORD, WORD, WORD], clients, seconds)
            gcs = ray.get_runtime_context().gcs_address
            for sep in loops:
                env = {**os.environ, "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": sep}
                p = subprocess.run([sys.executable, "-c", DRIVER, gcs, str(RECEIPT)], env=env, capture_output=True,
                                   text=True, timeout=300)
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
                result[f"handle_sep{sep}"] = json.loads(lines[-1]) if lines else {"ok": False,
                                                                                   "error": p.stderr[-200:]}
    finally:
        out.write_text(json.dumps(result))


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--child", default=None)
    p.add_argument("--handle-loops", default="0,1",
                   help="RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP values a plain driver's sync handle is tried with")
    p.add_argument("--out", type=Path, default=None)


def main(args: argparse.Namespace) -> int:
    a = args
    if a.child:
        child(a.child, a.out, a.seconds, a.clients, a.repeats, tuple(a.handle_loops.split(",")))
        return 0
    results = []
    for mode, extra in MODES.items():
        out = Path(f"/tmp/throughput_mode_{os.getpid()}_{mode}.json")
        env = {**os.environ, **extra, "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-m", "load_tests.throughput_mode", "--child", mode, "--out", str(out),
                        "--seconds", str(a.seconds), "--clients", str(a.clients), "--repeats", str(a.repeats),
                        "--handle-loops", a.handle_loops], env=env, cwd=REPO, timeout=900)
        results.append(json.loads(out.read_text()) if out.exists() else {"mode": mode, "error": "no result"})
    def h(x: dict) -> str:
        return f"ok {x['ms']:.0f} ms" if x.get("ok") else f"fails ({x.get('error', '?')[:90]})"

    print("\n".join(md_table(["mode", "Ray start to ready s", "1 client receipt p50 ms (statuses)", "1 client word p50 ms",
                               f"{a.clients} clients img/s", "p50 / p99 ms", "statuses",
                               "sync handle, plain driver (separate loop 0 / 1)"], (
        [r["mode"], f"failed: {r.get('error', r)}"] if "saturation" not in r else
        [r["mode"], f"{r['ready_s']:.0f}", f"{r['one_receipt']['p50_ms']:.0f} ({r['one_receipt']['codes']})",
         f"{r['one_word']['p50_ms']:.0f}", f"{s['img_s']:.2f}", f"{s['p50_ms']:.0f} / {s['p99_ms']:.0f}", s["codes"],
         f"{h(r.get('handle_sep0', {}))} / {h(r.get('handle_sep1', {}))}"]
        for r, s in ((r, r.get("saturation", {})) for r in results)), "lrlrrlll")))
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(standalone(__name__))
