"""The detector with its input shape written into its program file
(static) against the program as served (dynamic height and width), both
run by Paddle's OpenVINO engine: ms per call, the largest output
difference, the static predictor's build time and the memory it adds.

    python -m load_tests engine static-shapes                        # every set, 960x960 and 640x480
    python -m load_tests engine static-shapes --shapes 1280x736 --precision auto
    python -m load_tests engine static-shapes --smoke                # v6 tiny at 320x320, two calls

Paddle's OpenVINO engine hands OpenVINO the program file as it is
(`OpenVINOEngine::BuildEngine` reads `model_program_path`), so the feed
variable's dims in the file are the input shape OpenVINO compiles: the
served files say [-1, 3, -1, -1] (one compiled model for the detector's
21 ladder shapes); a copy whose feed says [1, 3, H, W] is compiled for
that one shape. Each set's dynamic and static predictors run the same
random input, interleaved call by call, one inference thread each,
`--precision` fp32 by default (what a CPU without bf16 runs). Nothing
in the service is changed by this program.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    from serve_app.core.model_sets import SETS

    parser.add_argument("--sets", default=",".join(SETS), help="model sets, comma separated")
    parser.add_argument("--shapes", default="960x960,640x480", help="detector inputs HxW, comma separated")
    parser.add_argument("--precision", default="fp32", choices=["auto", "fp32", "bf16"],
                        help="OpenVINO's inference precision for both predictors")
    parser.add_argument("--calls", type=int, default=8, help="timed calls of each predictor per shape")
    parser.add_argument("--threads", type=int, default=1, help="inference threads per predictor")


def static_program(program: Path, shape: list[int], out_dir: Path) -> Path:
    """A copy of a legacy `.pdmodel` whose one feed variable has `shape`."""
    from paddle.base.proto import framework_pb2

    prog = framework_pb2.ProgramDesc()
    prog.ParseFromString(program.read_bytes())
    block = prog.blocks[0]
    feeds = {op.outputs[0].arguments[0] for op in block.ops if op.type == "feed"}
    found = [v for v in block.vars if v.name in feeds]
    if len(found) != 1:
        raise SystemExit(f"{program}: expected one feed variable, found {sorted(feeds)}")
    dims = found[0].type.dense_tensor.tensor.dims
    del dims[:]
    dims.extend(shape)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / program.name
    out.write_bytes(prog.SerializeToString())
    return out


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(args: argparse.Namespace) -> list[dict]:
    import numpy as np

    from serve_app.core.predictor_options import PredictorOptions
    from serve_app.inference.predictor import PaddlePredictor
    from serve_app.inference.weights import ModelFiles, set_files

    # pinned to the cores this process may use, as a replica is (OpenVINO's threads otherwise go to CPU 0)
    opts = PredictorOptions(enable_openvino_engine=True, openvino_precision=args.precision, cache_dir=None,
                            cpu_math_library_num_threads=args.threads, cpu_affinity=sorted(os.sched_getaffinity(0)))
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes.split(",") if s.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="static-shapes-") as tmp:
        for name in [s.strip() for s in args.sets.split(",") if s.strip()]:
            det = set_files(name).det
            if not str(det.program).endswith(".pdmodel"):
                raise SystemExit(f"{name}: {det.program} is not a legacy .pdmodel program")
            dyn = PaddlePredictor(det, opts, name=f"{name}-dynamic")
            try:
                for h, w in shapes:
                    x = np.random.default_rng(0).standard_normal((1, 3, h, w)).astype(np.float32)
                    folder = Path(tmp) / f"{name}-{h}x{w}"
                    program = static_program(Path(det.program), [1, 3, h, w], folder)
                    (folder / Path(det.params).name).symlink_to(det.params)
                    files = ModelFiles(f"{name}-static", program, folder / Path(det.params).name)
                    a = dyn.run(x)  # the dynamic program's buffers for this shape, before the count starts
                    rss0, t0 = _rss_mb(), time.perf_counter()
                    st = PaddlePredictor(files, opts, name=f"{name}-static-{h}x{w}")
                    build_s = time.perf_counter() - t0
                    try:
                        b = st.run(x)
                        added = _rss_mb() - rss0  # the static predictor built and run once
                        ms: dict[str, list[float]] = {"dynamic": [], "static": []}
                        for i in range(args.calls):
                            pair = [("dynamic", dyn), ("static", st)]
                            for label, p in (pair if i % 2 == 0 else pair[::-1]):
                                t = time.perf_counter()
                                p.run(x)
                                ms[label].append((time.perf_counter() - t) * 1e3)
                    finally:
                        st.close()
                    d, s = statistics.median(ms["dynamic"]), statistics.median(ms["static"])
                    rows.append({"set": name, "shape": f"{h}x{w}", "dynamic_ms": d, "static_ms": s,
                                 "ratio": d / s, "max_diff": float(np.abs(a - b).max()), "build_s": build_s,
                                 "rss_added_mb": added})
                    print(f"{name} {h}x{w}: dynamic {d:.1f} ms, static {s:.1f} ms", flush=True)
            finally:
                dyn.close()
    return rows


def render(rows: list[dict], args: argparse.Namespace, started: str, wall_s: float) -> str:
    from load_tests.tiers import machine

    out = [f"Run {started} UTC, {wall_s:.0f} s; {machine()}; precision {args.precision}, {args.threads} thread(s), "
           f"median of {args.calls} calls each, interleaved; peak RSS "
           f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", "",
           "| set | input | dynamic ms | static ms | dynamic / static | largest output difference "
           "| static build s | static RSS added MB |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['set']} | {r['shape']} | {r['dynamic_ms']:.1f} | {r['static_ms']:.1f} | {r['ratio']:.2f} | "
                   f"{r['max_diff']:.1e} | {r['build_s']:.1f} | {r['rss_added_mb']:.0f} |")
    return "\n".join(out)


def main(args: argparse.Namespace) -> int:
    started, t0 = time.strftime("%Y-%m-%d %H:%M", time.gmtime()), time.time()
    rows = measure(args)
    print()
    print(render(rows, args, started, time.time() - t0))
    return 0


def smoke(args: argparse.Namespace) -> int:
    """v6 tiny's detector at 320x320, two calls each (measures nothing): the
    static copy loads, runs, and computes what the served program does."""
    from load_tests.cli import check

    args.sets, args.shapes, args.calls, args.precision = "ppocrv6_tiny", "320x320", 2, "fp32"
    rows = measure(args)
    print(render(rows, args, time.strftime("%Y-%m-%d %H:%M", time.gmtime()), 0))
    check(len(rows) == 1 and rows[0]["static_ms"] > 0 and rows[0]["dynamic_ms"] > 0, "both predictors timed")
    check(rows[0]["max_diff"] < 1e-3, f"the static program's output differs by {rows[0]['max_diff']:.2g}")
    return 0
