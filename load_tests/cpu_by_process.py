"""Where the CPU goes: deploys deployments.yaml on a local Ray, runs N
closed-loop HTTP clients over the peer images, and prints the CPU seconds
each process used in the window (from /proc), with core-seconds per image.

    .venv/bin/python load_tests/cpu_by_process.py --clients 8 --seconds 30

Compare the total core-seconds per image with the simple server's (its
process runs at ~1.84 cores for load_tests/bench.py's img/s)."""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from load_tests.procfs import cmdline, process_table  # noqa: E402
from load_tests.service import deploy_config, free_port, load_config, start_ray, stop_all  # noqa: E402
from peer import PEER  # noqa: E402


def cpu_seconds() -> dict[int, tuple[str, float]]:
    """pid -> (command line, CPU seconds used) for every process."""
    return {pid: (cmdline(pid), cpu) for pid, (_, cpu) in process_table().items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--n-images", type=int, default=20)
    a = ap.parse_args()

    names = sorted(p.name for p in PEER.iterdir() if p.suffix in (".jpg", ".png"))
    names = names[:: max(1, len(names) // a.n_images)][: a.n_images]
    images = [(PEER / n).read_bytes() for n in names]
    start_ray()
    try:
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
        stop_all()
    rows = sorted(((c - before.get(pid, (cmd, 0.0))[1], pid, cmd) for pid, (cmd, c) in after.items()), reverse=True)
    rows = [r for r in rows if r[0] > 0.2]
    total, n, w = sum(r[0] for r in rows), n1 - n0, t1 - t0
    print(f"{a.clients} clients, {w:.1f} s: {n} answers ({n / w:.2f} img/s); CPU {total:.1f} s = "
          f"{total / w:.2f} cores = {total / max(n, 1):.3f} core-s per image")
    print("| CPU s | core-s/img | pid | process |\n|---:|---:|---:|---|")
    for c, pid, cmd in rows[:25]:
        print(f"| {c:.2f} | {c / max(n, 1):.3f} | {pid} | {cmd.strip()} |")


if __name__ == "__main__":
    main()
