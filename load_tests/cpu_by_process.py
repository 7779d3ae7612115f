"""Where the CPU goes: deploys deployments.yaml on a local Ray (or starts the
single-process simple server, `--target simple`), runs N closed-loop HTTP
clients over the peer images, and prints the CPU seconds each process used
in the window (from /proc), with core-seconds per image, per process and
per part of the service (load_tests/hop_budget.py's groups).

    flock /tmp/ray-tests.lock timeout 600 .venv/bin/python -m load_tests hops budget cpu --clients 8 --seconds 30
    ... cpu_by_process.py --target simple              # the baseline, same clients and images
    ... cpu_by_process.py --pipeline-in-ingress false  # the pipeline in its own deployment
    ... cpu_by_process.py --json out.json              # also write the figures

The load client (this process) is listed but is not part of either system."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]

from load_tests.baselines import SimpleServer  # noqa: E402
from load_tests.hop_budget import PER_IMAGE_MODEL, PER_NODE, PER_REQUEST_RAY, process_group  # noqa: E402
from harness.procfs import cmdline, process_table  # noqa: E402
from harness.service import deploy_config, free_port, load_config, start_ray, stop_all  # noqa: E402
from harness.peer import PEER  # noqa: E402
import sys  # noqa: E402
from load_tests.cli import standalone  # noqa: E402


def cpu_seconds() -> dict[int, tuple[str, float]]:
    """pid -> (command line, CPU seconds used) for every process."""
    return {pid: (cmdline(pid), cpu) for pid, (_, cpu) in process_table().items()}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--n-images", type=int, default=20)
    ap.add_argument("--target", choices=("service", "simple"), default="service")
    ap.add_argument("--json", type=Path, help="also write the figures here")


def main(args: argparse.Namespace) -> int:
    a = args

    names = sorted(p.name for p in PEER.iterdir() if p.suffix in (".jpg", ".png"))
    names = names[:: max(1, len(names) // a.n_images)][: a.n_images]
    images = [(PEER / n).read_bytes() for n in names]
    srv = None
    if a.target == "simple":
        srv = SimpleServer(free_port(), ROOT / "load_tests/out/cpu_simple_server.log")
        srv.start(120)
    else:
        start_ray()
    try:
        if srv is not None:
            url = srv.url
        else:
            url = deploy_config(load_config(), free_port())
        hdr = {"Content-Type": "application/octet-stream"}
        for d in images:  # every shape seen once before measuring
            requests.post(f"{url}/v1/ocr", data=d, headers=hdr, timeout=120)
        stop, done = threading.Event(), [0]

        def client(k: int) -> None:
            for d in itertools.cycle(images[k:] + images[:k]):
                if stop.is_set():
                    return
                r = requests.post(f"{url}/v1/ocr", data=d, headers=hdr, timeout=120)
                done[0] += r.status_code == 200

        threads = [threading.Thread(target=client, args=(2 * k % len(images),)) for k in range(a.clients)]
        for t in threads:
            t.start()
        time.sleep(3)  # let the load settle
        before, n0, t0 = cpu_seconds(), done[0], time.time()
        time.sleep(a.seconds)
        after, n1, t1 = cpu_seconds(), done[0], time.time()
        stop.set()
        for t in threads:
            t.join()
    finally:
        if srv is not None:
            srv.stop()
        else:
            stop_all()
    rows = sorted(((c - before.get(pid, (cmd, 0.0))[1], pid, cmd) for pid, (cmd, c) in after.items()), reverse=True)
    rows = [r for r in rows if r[0] > 0.2]
    total, n, w = sum(r[0] for r in rows), n1 - n0, t1 - t0
    print(f"{a.clients} clients, {w:.1f} s: {n} answers ({n / w:.2f} img/s); CPU {total:.1f} s = "
          f"{total / w:.2f} cores = {total / max(n, 1):.3f} core-s per image")
    print("| CPU s | core-s/img | pid | process |\n|---:|---:|---:|---|")
    for c, pid, cmd in rows[:25]:
        print(f"| {c:.2f} | {c / max(n, 1):.3f} | {pid} | {cmd.strip()} |")
    groups: dict[str, float] = {}
    for c, pid, cmd in rows:
        g = "load client" if pid == os.getpid() else process_group(cmd)
        groups[g] = groups.get(g, 0.0) + c
    print("\n| part | CPU s | cores | core-s/img |\n|---|---:|---:|---:|")
    for g, c in sorted(groups.items(), key=lambda x: -x[1]):
        print(f"| {g} | {c:.2f} | {c / w:.2f} | {c / max(n, 1):.3f} |")
    own = {g: c for g, c in groups.items() if g not in ("load client", "other")}
    summary = {"target": a.target, "clients": a.clients,
               "seconds": w, "answers": n, "img_s": n / w, "groups_cpu_s": groups,
               "system_core_s_per_img": sum(own.values()) / max(n, 1),
               "model_core_s_per_img": sum(groups.get(g, 0.0) for g in PER_IMAGE_MODEL) / max(n, 1),
               "request_core_s_per_img": sum(groups.get(g, 0.0) for g in PER_REQUEST_RAY) / max(n, 1),
               "node_cores": sum(groups.get(g, 0.0) for g in PER_NODE) / w,
               "others_cores": groups.get("other", 0.0) / w}
    print("\n" + json.dumps(summary))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(standalone(__name__))
