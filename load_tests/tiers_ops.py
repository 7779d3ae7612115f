"""Where each model set's detector and recogniser spend their time inside
the graph, operator by operator: OpenVINO's own counters (PERF_COUNT) on
the program files the service loads, compiled as Paddle Inference's
OpenVINO engine compiles them (the program's dynamic input shape, the same
precision, one thread) and, beside it, reshaped to the one input shape
(static), which shows what the dynamic shapes cost.

    python -m load_tests engine tiers-ops                  # v4, v6 small, v6 tiny: det 960x960 + 320x1280, rec 1 + 8 crops
    python -m load_tests engine tiers-ops --sets ppocrv4_mobile,ppocrv6_tiny --det 960x960 --rec 8
    python -m load_tests engine tiers-ops --smoke          # v4 + v6 tiny, det 320x320, 1 crop, one call

It needs the `openvino` Python package of the version Paddle 3.3.1 bundles
(2025.0.0), which the service's environment does not have: `make
openvino-env` makes .venv-openvino (models/openvino-requirements.txt), and
each graph is profiled there in a child (load_tests/openvino_counters.py);
`--openvino-python` or $OCR_SERVE_OPENVINO_PYTHON names another
interpreter. Counters are the last call's; `ms` columns are medians of
`--repeat` calls, dynamic and static interleaved. The time inside Paddle's
predictor (the dynamic compile plus its copies) is `engine tiers-speed`'s
and `engine tiers-breakdown`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = "ppocrv4_mobile"


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sets", default="ppocrv4_mobile,ppocrv6_small,ppocrv6_tiny")
    parser.add_argument("--det", default="960x960,320x1280", help="detector inputs HxW, comma separated")
    parser.add_argument("--rec", default="1,8", help="recogniser batch sizes (crops of 48x320), comma separated")
    parser.add_argument("--precision", default="auto", choices=("auto", "bf16", "f32"),
                        help="OpenVINO's inference precision (auto: bf16 where the CPU has it, as the service)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--top", type=int, default=10, help="operator types listed per graph")
    parser.add_argument("--openvino-python", default=None,
                        help="an interpreter with openvino==2025.0.0 (default $OCR_SERVE_OPENVINO_PYTHON, "
                             "else .venv-openvino/bin/python)")


def smoke(args: argparse.Namespace) -> int:
    """v4 and v6 tiny, det 320x320 and one crop, one call (measures nothing):
    both graphs of both sets profiled in both modes, convolutions counted."""
    from load_tests.cli import check

    args.sets, args.det, args.rec, args.repeat, args.top = f"{BASE},ppocrv6_tiny", "320x320", "1", 1, 3
    results = report(args)
    for s, graphs in results.items():
        for graph, shapes in graphs.items():
            for shape, modes in shapes.items():
                for mode in ("dynamic", "static"):
                    check(mode in modes and modes[mode]["median_ms"] > 0, f"{s} {graph} {shape}: no {mode} time")
                    check(any(k.startswith("Convolution") for k in modes[mode]["types"]),
                          f"{s} {graph} {shape} {mode}: no convolution among the counters")
    return 0


def openvino_python(given: str | None) -> Path:
    path = Path(given or os.environ.get("OCR_SERVE_OPENVINO_PYTHON") or REPO / ".venv-openvino" / "bin" / "python")
    if not path.is_file():
        raise SystemExit(f"tiers-ops needs an interpreter with openvino==2025.0.0 (the version Paddle 3.3.1 bundles): "
                         f"{path} does not exist; run `make openvino-env` or pass --openvino-python")
    return path


def counters(python: Path, program: Path, precision: str, repeat: int, shapes: list[list[int]]) -> dict:
    done = subprocess.run([str(python), str(REPO / "load_tests" / "openvino_counters.py"), str(program), precision,
                           "1", str(repeat), *(",".join(map(str, s)) for s in shapes)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join(ln for ln in done.stderr.splitlines() if ln.strip())[-400:]
        raise SystemExit(f"openvino_counters failed on {program} (exit {done.returncode}): {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def render(results: dict, sets: list[str], top: int) -> list[str]:
    """results: set -> graph -> shape -> mode -> {median_ms, types, slowest}."""
    out = ["| graph | input | set | dynamic ms (as Paddle) | static ms | dynamic / static | x v4 dynamic | x v4 static |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
    for graph in ("det", "rec"):
        for shape in results[sets[0]][graph]:
            base = results.get(BASE, {}).get(graph, {}).get(shape)
            for s in sets:
                r = results[s][graph][shape]
                d, st = r["dynamic"]["median_ms"], r["static"]["median_ms"]
                rel = (f"{base['dynamic']['median_ms'] / d:.2f} | {base['static']['median_ms'] / st:.2f}"
                       if base else "- | -")
                out.append(f"| {graph} | {shape} | {s} | {d:.1f} | {st:.1f} | {d / st:.2f} | {rel} |")
    for graph in ("det", "rec"):
        shape = next(iter(results[sets[0]][graph]))
        cols = [(s, m) for s in sets for m in ("dynamic", "static")]
        types: dict[str, float] = {}
        for s, m in cols:
            for k, (ms, _) in results[s][graph][shape][m]["types"].items():
                types[k] = max(types.get(k, 0.0), ms)
        out += ["", f"{graph} {shape}, counters in ms (nodes) per operator type and kernel, the last call:", "",
                "| operator (kernel) | " + " | ".join(f"{s} {m[:3]}" for s, m in cols) + " |",
                "|---|" + "---:|" * len(cols)]
        for k in sorted(types, key=types.get, reverse=True)[:top]:
            cells = []
            for s, m in cols:
                ms, n = results[s][graph][shape][m]["types"].get(k, (0.0, 0))
                cells.append(f"{ms:.2f} ({n})" if n else "-")
            out.append(f"| {k} | " + " | ".join(cells) + " |")
        out.append("| **sum of counters** | " + " | ".join(
            f"{sum(v[0] for v in results[s][graph][shape][m]['types'].values()):.1f}" for s, m in cols) + " |")
        out += ["", f"slowest nodes, {graph} {shape}, dynamic:", ""]
        for s in sets:
            slow = results[s][graph][shape]["dynamic"]["slowest"][:4]
            out.append(f"- {s}: " + "; ".join(f"{name} {key} {ms:.2f} ms" for ms, name, key in slow))
    return out


def main(args: argparse.Namespace) -> int:
    report(args)
    return 0


def report(args: argparse.Namespace) -> dict:
    """Profile, print the tables; the counters, per set, graph, shape and mode."""
    from load_tests.tiers import machine
    from serve_app.inference.predictor import cpu_has_bf16
    from serve_app.inference.weights import set_files

    python = openvino_python(args.openvino_python)
    sets = list(dict.fromkeys(args.sets.split(",")))
    precision = ("bf16" if cpu_has_bf16() else "f32") if args.precision == "auto" else args.precision
    det = [[1, 3, *map(int, hw.split("x"))] for hw in args.det.split(",")]
    rec = [[int(n), 3, 48, 320] for n in args.rec.split(",")]
    load0 = " ".join(f"{x:.1f}" for x in os.getloadavg())
    t0 = time.perf_counter()
    results: dict = {}
    version = "?"
    for s in sets:
        files = set_files(s)
        results[s] = {}
        for graph, stage_files, shapes in (("det", files.det, det), ("rec", files.rec, rec)):
            r = counters(python, stage_files.program, precision, args.repeat, shapes)
            version = r["openvino"]
            results[s][graph] = r["shapes"]
    print(f"# tiers-ops: OpenVINO {version} per-operator counters, {precision}, 1 thread; {args.repeat} calls per mode; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine()}; load average {load0} -> "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; {time.perf_counter() - t0:.0f} s")
    print("\n".join(render(results, sets, args.top)))
    return results


if __name__ == "__main__":
    from load_tests.cli import standalone

    sys.exit(standalone("load_tests.tiers_ops"))
