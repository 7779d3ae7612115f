"""glibc heap settings against the in-process engine's speed and memory
(issue #27; serve_app/serving/heap.py): each setting in a fresh child
process (the environment is read at its first allocation), the engine
warmed, the heap trimmed after warm-up where the setting says so, then the
60 peer images read one at a time, twice (the second pass timed). Rounds
alternate the settings' order.

    flock -w 1200 /tmp/ray-tests.lock timeout 1200 .venv/bin/python -m load_tests heap_settings --rounds 2

Per setting: p50 and mean ms per image, RSS (MB) after warm-up, after
the warm-up's trim, after the peer set, and after a malloc_trim(0) then
(what the idle trimmer gives back), and the lines read (the same in every
row, or the setting changed what is read)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (environment, trim after warm-up)
SETTINGS: dict[str, tuple[dict[str, str], bool]] = {
    "glibc defaults": ({}, False),
    "mmap threshold 128 KiB (the old default)": ({"MALLOC_MMAP_THRESHOLD_": "131072"}, False),
    "one arena, trimmed (the new default)": ({"MALLOC_ARENA_MAX": "1"}, True),
}


def child(trim_after_warm: bool) -> dict:
    from harness.peer import PEER, peer_names
    from load_tests.procfs import rss_mb
    from serve_app.engine import OcrEngine
    from serve_app.serving.heap import trim

    data = {n: (PEER / n).read_bytes() for n in peer_names()}
    out: dict = {}
    with OcrEngine() as eng:
        eng.warm()
        out["rss_warm"] = rss_mb()
        if trim_after_warm:
            trim()
        out["rss_trimmed"] = rss_mb()
        ms, lines = [], 0
        for rnd in range(2):
            for body in data.values():
                t = time.perf_counter()
                res = eng.read(body)
                if rnd:
                    ms.append((time.perf_counter() - t) * 1000)
                    lines += len(res.lines)
        out.update(rss_after=rss_mb(), p50=statistics.median(ms), mean=statistics.mean(ms), lines=lines)
        trim()
        out["rss_after_trim"] = rss_mb()
    return out


def run(env: dict[str, str], trim_after_warm: bool) -> dict:
    cmd = [sys.executable, "-m", "load_tests.heap_settings", "--child", json.dumps(trim_after_warm)]
    full = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(cmd, env={**full, **env, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"},
                         capture_output=True, text=True, timeout=900, cwd=str(ROOT))
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results: dict[str, list[dict]]) -> str:
    def cell(rs: list[dict], key: str) -> str:
        return " / ".join(f"{r[key]:.0f}" for r in rs)

    rows = [("p50 ms per image", "p50"), ("mean ms per image", "mean"), ("RSS MB after warm-up", "rss_warm"),
            ("RSS MB after the warm-up's trim", "rss_trimmed"), ("RSS MB after the peer set", "rss_after"),
            ("RSS MB after a trim then", "rss_after_trim"), ("lines read (second pass)", "lines")]
    names = list(results)
    out = ["| rounds: " + " / ".join(str(k) for k in range(len(results[names[0]]))) + " | "
           + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    out += [f"| {label} | " + " | ".join(cell(results[n], key) for n in names) + " |" for label, key in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return
    t0 = time.time()
    results: dict[str, list[dict]] = {n: [] for n in SETTINGS}
    for rnd in range(args.rounds):
        order = list(SETTINGS) if rnd % 2 == 0 else list(reversed(SETTINGS))
        for name in order:
            env, trim_after = SETTINGS[name]
            r = run(env, trim_after)
            results[name].append(r)
            print(f"round {rnd} {name}: p50 {r['p50']:.1f} ms, RSS {r['rss_after']:.0f} MB", flush=True)
    print(f"\nRun {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}, {time.time() - t0:.0f} s, "
          f"load average {os.getloadavg()[0]:.2f} at the end\n")
    print(table(results))


if __name__ == "__main__":
    main()
