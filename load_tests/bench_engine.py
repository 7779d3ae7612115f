"""Benchmark: this project's in-process engine against RapidOCR, CPU only,
in ONE process, on the same images, each with ``--threads N`` CPU
inference threads (default: every core this process may use):

* ``engine``: ``OcrEngine`` with ``default_engine_config()`` (Paddle
  Inference, OpenVINO engine), ``cpu_math_library_num_threads`` N;
  ``--engine-config reference``: RapidOCR's stage parameters
  (``serve_app.core.engine_config.reference_config``), same predictor.
* ``rapidocr-paddle``: ``rapidocr_paddle.RapidOCR`` (1.4.5) with its
  defaults and ``cpu_math_library_num_threads=N`` (a Global key RapidOCR
  copies to Det, Cls and Rec; a ``det_`` key would be overwritten).
* ``rapidocr-onnxruntime``: ``rapidocr_onnxruntime.RapidOCR`` (1.4.4),
  ``intra_op_num_threads=N`` (copied likewise).
A RapidOCR package that fails to import or load is reported as skipped.

Protocol: load each system (timed apart); one untimed warm-up pass per
system (its texts are scored; a timed pass that reads otherwise is counted
in the notes); ``--repeats`` timed passes (default 3), the systems
interleaved per pass so a shared machine's drift hits all alike; one call
is one image path in, lines out (read and decode included). Per system:
mean and median of the per-image medians, p90 of all samples, img/s =
images x repeats / the summed call seconds, and the det/cls/rec split of
that total ("other": decode, resizing, cropping, bookkeeping): the engine's
own ``timings_ms`` (det includes its crops), timers around RapidOCR's
``text_det``/``text_cls``/``text_rec`` (its ``elapse`` leaves out
pre-processing). Lines read: in the warm-up pass (the detectors' settings
differ). Accuracy on ``expected.json``'s ``ground-truth-label`` images:
CER (harness/peer.py, the tests' metric) and label recall (labels found as
a case-sensitive substring). Ratios: engine img/s over each baseline's,
and the geometric mean of per-image median-time ratios.

Memory: RSS sampled every 0.1 s, the peak per system. Between passes the
heap is trimmed (``malloc_trim``; ``--no-trim``): rapidocr-paddle grows by
~0.3-0.7 GiB per new recognition batch width (~11 GiB on the dense image)
and glibc keeps it. Under ``--min-free-gb`` (1) MemAvailable the run stops
with a message rather than meet the OOM killer; ``--malloc-mmap-threshold
1048576`` caps rapidocr-paddle's peak at ~2.6 GiB.

    .venv/bin/python -m load_tests engine systems --quick        # ~1-2 minutes
    .venv/bin/python -m load_tests engine systems --per-image --out load_tests/out/bench_engine.md

Markdown on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from harness.procfs import MemoryWatch, rss_gb, set_mmap_threshold, trim_heap
from load_tests.baselines import STAGES, CallOutput, System, make_engine, make_rapidocr
from load_tests.engine_report import SystemLog, render, summarise
from load_tests.images import DEFAULT_IMAGES, pick_names
from load_tests.stats import Record

SYSTEMS = ("engine", "rapidocr-paddle", "rapidocr-onnxruntime")

# --quick: dense text, a receipt, a word crop, RapidOCR's mixed-script test
# image, a scene image with labels, a Chinese page, an empty image and a
# 65x11 sliver (RapidOCR's limit_type=min blows it up to 736x4416).
QUICK_IMAGES = ("mmocr_demo_densetext_det.jpg", "mmocr_wildreceipt_2.jpeg", "mmocr_word_1223731.jpg",
                "rapidocr_ch_en_num.jpg", "mmocr_icdar15_img_1.jpg", "paddleocr_1.jpg", "rapidocr_empty_black.jpg",
                "rapidocr_short.png")


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="CPU inference threads for every system (default: all cores, %(default)s)")
    ap.add_argument("--repeats", type=int, default=None, help="timed passes (default 3; 1 with --quick)")
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES, help="image folder (default %(default)s)")
    ap.add_argument("--quick", action="store_true", help="8 representative images, 1 repeat")
    ap.add_argument("--per-image", action="store_true", help="also print the per-image table")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    ap.add_argument("--engine-config", choices=("default", "reference"), default="default")
    ap.add_argument("--min-free-gb", type=float, default=1.0,
                    help="abort if the machine's MemAvailable drops below this (0 = never; default %(default)s)")
    ap.add_argument("--malloc-mmap-threshold", type=int, default=0, metavar="BYTES",
                    help="glibc mallopt(M_MMAP_THRESHOLD, BYTES) at start, for every system: big buffers are "
                         "mmapped and returned on free, which caps rapidocr-paddle's ~11 GiB peak at ~2.6 GiB "
                         "(1048576 does); changes allocation costs, so off by default")
    ap.add_argument("--no-trim", action="store_true",
                    help="do not malloc_trim the heap between passes (see trim_heap)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ", ".join(SYSTEMS))


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1 or args.threads < 1:
        raise SystemExit("--repeats and --threads must be at least 1")
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in args.systems if s not in SYSTEMS]
    if bad:
        raise SystemExit(f"unknown system(s) {bad}; choose from {SYSTEMS}")
    return args


def load_labels(folder: Path) -> dict[str, list[str]]:
    path = folder / "expected.json"
    if not path.is_file():
        return {}
    entries = json.loads(path.read_text(encoding="utf-8"))
    return {e["image"]: list(e["expected_texts"]) for e in entries
            if e.get("kind") == "ground-truth-label" and e.get("expected_texts")}


def run_pass(system: System, rec: SystemLog, folder: Path, images: list[str], pass_no: int) -> None:
    """pass_no 0 is the untimed warm-up (its texts are kept for scoring)."""
    for im in images:
        path = str(folder / im)
        t0 = time.perf_counter()
        try:
            out = system.call(path)
        except Exception as exc:  # a system failing on one image must not stop the run
            out = CallOutput([], {s: 0.0 for s in STAGES}, f"{type(exc).__name__}: {exc}")
        t1 = time.perf_counter()
        if out.error and im not in rec.errors:
            rec.errors[im] = out.error
            print(f"  ! {system.name} failed on {im}: {out.error}", file=sys.stderr)
        if pass_no == 0:
            rec.warm_texts[im] = out.texts
            continue
        rec.records.append(Record(t0, t1, 0 if out.error else 200, not out.error, out.error, im, dict(out.stages_s)))
        if out.texts != rec.warm_texts.get(im):
            rec.unstable.append((im, pass_no))


def main(args: argparse.Namespace) -> int:
    args = resolve(args)
    if args.malloc_mmap_threshold > 0 and not set_mmap_threshold(args.malloc_mmap_threshold):
        print("warning: mallopt(M_MMAP_THRESHOLD) failed; running with glibc's default", file=sys.stderr)
        args.malloc_mmap_threshold = 0
    folder = args.images.resolve()
    images = pick_names(folder, args.quick, None, None, QUICK_IMAGES)
    labels = {k: v for k, v in load_labels(folder).items() if k in images}
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")

    systems: list[System] = []
    skipped: list[str] = []
    for name in args.systems:
        print(f"loading {name} ...", file=sys.stderr)
        try:
            sysobj = make_engine(args.threads, args.engine_config) if name == "engine" else make_rapidocr(name, args.threads)
        except Exception as exc:
            line = f"SKIPPED {name}: could not import/load it ({type(exc).__name__}: {exc})"
            print(line)  # stdout, as asked: a clear line, no crash
            print(traceback.format_exc(), file=sys.stderr)
            skipped.append(line)
            continue
        print(f"  loaded in {sysobj.load_s:.2f}s: {sysobj.detail}", file=sys.stderr)
        systems.append(sysobj)
    if not systems:
        print("nothing to benchmark: every system was skipped")
        return 1

    records = {s.name: SystemLog() for s in systems}
    if not args.no_trim:
        trim_heap()
    args.rss_start = rss_gb()
    watch = MemoryWatch(args.min_free_gb).start()
    t_run = time.perf_counter()
    for pass_no in range(args.repeats + 1):
        label = "warm-up" if pass_no == 0 else f"pass {pass_no}/{args.repeats}"
        for s in systems:
            watch.current = s.name
            t0 = time.perf_counter()
            run_pass(s, records[s.name], folder, images, pass_no)
            took = time.perf_counter() - t0
            watch.current = None
            rss_end = rss_gb()
            if not args.no_trim:
                trim_heap()
            print(f"[{label}] {s.name}: {len(images)} images in {took:.1f}s; RSS {rss_end:.2f} GiB at the end, "
                  f"{rss_gb():.2f} after trim; peak so far {watch.peaks.get(s.name, float('nan')):.2f}",
                  file=sys.stderr)
    watch.stop()
    run_s = time.perf_counter() - t_run
    args.rss_peaks = dict(watch.peaks)
    load_after = os.getloadavg()
    for s in systems:
        try:
            s.close()
        except Exception:
            pass

    stats = {s.name: summarise(records[s.name], images, args.repeats, labels) for s in systems}
    md = render(args, folder, images, labels, systems, skipped, records, stats,
                started, load_before, load_after, run_s)
    print(md)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md + "\n", encoding="utf-8")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def smoke(args: argparse.Namespace) -> int:
    """The in-process engine alone over one word image (its label kept), one
    timed pass: the whole program at its smallest (loads the models)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        name = "rapidocr_text_rec.jpg"
        shutil.copy(args.images / name, Path(tmp) / name)
        labels = [e for e in json.loads((args.images / "expected.json").read_text()) if e.get("image") == name]
        (Path(tmp) / "expected.json").write_text(json.dumps(labels))
        args.images, args.systems, args.repeats, args.quick = Path(tmp), "engine", 1, False
        return main(args)
