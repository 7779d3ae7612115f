"""Benchmark: this project's in-process engine against RapidOCR, CPU only.

Three systems run in ONE process, on the same images, with the same number of
CPU inference threads (``--threads N``, default: every core this process may
use):

* ``engine``: ``serve_app.engine.OcrEngine`` with ``default_engine_config()``
  (Paddle Inference, OpenVINO engine), its ``cpu_math_library_num_threads``
  set to N. ``--engine-config reference`` uses RapidOCR's stage parameters
  instead (``serve_app.config.reference_config``), same predictor options.
* ``rapidocr-paddle``: ``rapidocr_paddle.RapidOCR`` (1.4.5, Paddle Inference)
  with its defaults and ``cpu_math_library_num_threads=N`` (a Global key that
  RapidOCR copies to Det, Cls and Rec; a ``det_``-prefixed key would be
  overwritten by that copy).
* ``rapidocr-onnxruntime``: ``rapidocr_onnxruntime.RapidOCR`` (1.4.4) with its
  defaults and ``intra_op_num_threads=N`` (likewise copied to Det, Cls, Rec).

A RapidOCR package that fails to import or load is reported as skipped; the
others still run.

Protocol
--------
1. Load every system (load time reported, not part of the throughput).
2. Warm-up: one untimed pass over all images per system. Its outputs are the
   ones scored for accuracy.
3. ``--repeats R`` timed passes (default 3). Each pass runs the systems
   interleaved -- engine over all images, then rapidocr-paddle, then
   rapidocr-onnxruntime -- so drift on a shared, noisy machine hits all
   systems alike. One call = one image path in, OCR lines out, timed with
   ``time.perf_counter`` around the call (file read and decode included).
4. Per system: mean and median of the per-image medians, p90 over all timed
   samples, images/s = images * repeats / (sum of the system's timed call
   seconds), and the det/cls/rec split = the summed stage times as % of that
   total ("other" is the rest: decode, resizing, cropping, bookkeeping).
   Stage times: the engine's own ``timings_ms`` (det includes its crops); for
   RapidOCR, timers wrapped around its ``text_det``/``text_cls``/``text_rec``
   calls (pre- and post-processing included, crops in "other"), since its own
   ``elapse`` leaves out pre-processing and is None when nothing is found.
   "lines read" = text lines returned over all images in the warm-up pass
   (how much work each system did: the engine's default detector settings
   differ from RapidOCR's, so the counts can differ a lot).
5. Accuracy on the images of kind ``ground-truth-label`` in ``expected.json``:
   CER over all labels (tests/peer.py, the metric the tests use): each label
   is matched to the recognised line where it needs the fewest edits
   (whitespace removed; surrounding text in the line is free), errors summed
   over all labels and divided by their characters; label recall = fraction
   of labels found as a case-sensitive substring of the recognised text.
6. Ratios: engine images/s divided by each baseline's images/s, and the
   geometric mean of the per-image median-time ratios.

Memory: the process RSS is sampled every 0.1 s and its peak recorded per
system. Between passes (untimed) the glibc heap is trimmed (``malloc_trim``;
``--no-trim`` to skip): rapidocr-paddle grows by ~0.3-0.7 GiB for every new
recognition batch width it meets (~11 GiB on the dense image) and glibc keeps
that freed memory, which got a first full run OOM-killed on a 24 GiB machine.
If the machine's MemAvailable falls under ``--min-free-gb`` (default 1) the
run stops at once with a message rather than let the OOM killer choose.
``--malloc-mmap-threshold 1048576`` (glibc ``mallopt``, applies to every
system, off by default) caps rapidocr-paddle's peak at ~2.6 GiB instead.

Outputs are also checked for stability: a timed pass whose text differs from
the warm-up pass is counted in the notes.

Run (from the repository root)::

    .venv/bin/python load_tests/bench_engine.py --quick        # ~1-2 minutes
    .venv/bin/python load_tests/bench_engine.py --per-image --out docs/bench.md

Options: ``--threads N``, ``--repeats R``, ``--images DIR``, ``--quick``
(8 representative images, 1 repeat), ``--per-image``, ``--out FILE``,
``--engine-config {default,reference}``, ``--systems a,b,c``,
``--min-free-gb G``, ``--no-trim``, ``--malloc-mmap-threshold BYTES``.
Markdown goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional


REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # peer.py: the CER metric shared with the tests

from load_tests.procfs import mem_available_gb, rss_gb  # noqa: E402
from load_tests.stats import Record, percentile  # noqa: E402

DEFAULT_IMAGES = REPO / "tests/data/peer"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}
SYSTEMS = ("engine", "rapidocr-paddle", "rapidocr-onnxruntime")
STAGES = ("det", "cls", "rec")

# --quick: dense text, a receipt, a word crop, RapidOCR's mixed-script test
# image, a scene image with labels, a Chinese page, an empty image and a
# 65x11 sliver (RapidOCR's limit_type=min blows it up to 736x4416).
QUICK_IMAGES = (
    "mmocr_demo_densetext_det.jpg",
    "mmocr_wildreceipt_2.jpeg",
    "mmocr_word_1223731.jpg",
    "rapidocr_ch_en_num.jpg",
    "mmocr_icdar15_img_1.jpg",
    "paddleocr_1.jpg",
    "rapidocr_empty_black.jpg",
    "rapidocr_short.png",
)


# --------------------------------------------------------------------------
# systems


@dataclass
class CallOutput:
    texts: list[str]
    stages_s: dict[str, float]
    error: Optional[str] = None


@dataclass
class System:
    name: str
    call: Callable[[str], CallOutput]
    load_s: float
    detail: str
    close: Callable[[], None] = lambda: None


def make_engine(threads: int, which: str, device: str = "cpu") -> System:
    from serve_app.engine import OcrEngine, default_engine_config

    base = default_engine_config()
    if which == "reference":
        from serve_app.config import reference_config

        base = reference_config(predictor=base.predictor)
    update = {"cpu_math_library_num_threads": threads}
    if device == "gpu":  # the GPU run (load_tests/gpu_run.sh)
        update.update(device="gpu", enable_openvino_engine=False, cpu_affinity=None)
    cfg = base.model_copy(update={"predictor": base.predictor.model_copy(update=update)})
    t0 = time.perf_counter()
    eng = OcrEngine(cfg)
    load_s = time.perf_counter() - t0

    def call(path: str) -> CallOutput:
        res = eng.read(path)
        t = res.timings_ms
        return CallOutput([ln.text for ln in res.lines], {s: t.get(s, 0.0) / 1000.0 for s in STAGES})

    p = cfg.predictor
    detail = (
        f"config={which}, cpu_math_library_num_threads={p.cpu_math_library_num_threads}, "
        f"openvino={p.enable_openvino_engine}, mkldnn={p.enable_mkldnn}, affinity={p.cpu_affinity}, "
        f"det limit {cfg.det.limit_side_len}/{cfg.det.limit_type}"
    )
    return System("engine", call, load_s, detail, eng.close)


def _wrap_rapidocr(ocr) -> tuple[Callable[[str], CallOutput], dict[str, float]]:
    """Time RapidOCR's det/cls/rec calls (instance attributes shadow the
    objects RapidOCR.__call__ looks up as self.text_det etc.)."""
    acc = {s: 0.0 for s in STAGES}

    def timed(stage: str, fn):
        def inner(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[stage] += time.perf_counter() - t

        return inner

    ocr.text_det = timed("det", ocr.text_det)
    ocr.text_cls = timed("cls", ocr.text_cls)
    ocr.text_rec = timed("rec", ocr.text_rec)

    def call(path: str) -> CallOutput:
        for s in STAGES:
            acc[s] = 0.0
        result, _elapse = ocr(path)
        texts = [str(r[1]) for r in result] if result else []
        return CallOutput(texts, dict(acc))

    return call, acc


def make_rapidocr(name: str, threads: int) -> System:
    if name == "rapidocr-paddle":
        from rapidocr_paddle import RapidOCR
        import rapidocr_paddle as pkg

        kwargs = {"cpu_math_library_num_threads": threads}
    else:
        from rapidocr_onnxruntime import RapidOCR
        import rapidocr_onnxruntime as pkg

        kwargs = {"intra_op_num_threads": threads}
    if threads > (os.cpu_count() or 1):
        print(f"warning: {name} ignores {threads} threads > os.cpu_count(); it will use its default",
              file=sys.stderr)
    t0 = time.perf_counter()
    ocr = RapidOCR(**kwargs)
    load_s = time.perf_counter() - t0
    call, _ = _wrap_rapidocr(ocr)
    version = _dist_version(name)
    detail = f"{name} {version} ({Path(pkg.__file__).parent.name}), " + ", ".join(
        f"{k}={v}" for k, v in kwargs.items()
    ) + ", other settings default"
    return System(name, call, load_s, detail)


def _dist_version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


# --------------------------------------------------------------------------
# accuracy


def squash(s: str) -> str:
    return "".join(s.split())


def score_image(expected: list[str], texts: list[str]) -> tuple[float, int, int, int, int]:
    """(CER, labels found, labels, character errors, label characters) for
    one image. CER is the project's one metric (tests/peer.py): each label
    matched to the read line where it needs the fewest edits."""
    from peer import label_errors

    errors, chars = label_errors(texts, expected)
    hyp = squash("".join(texts))
    found = sum(1 for e in expected if squash(e) and squash(e) in hyp)
    return errors / max(chars, 1), found, len(expected), errors, chars


# --------------------------------------------------------------------------
# statistics


@dataclass
class SystemLog:
    """What one system did: a `load_tests.stats.Record` per timed call
    (latency = the call's wall time, timings = its stage seconds), the
    warm-up pass's texts (scored), first error per image, unstable outputs."""

    records: list[Record] = field(default_factory=list)
    warm_texts: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # image -> first error
    unstable: list[tuple[str, int]] = field(default_factory=list)

    @property
    def walls(self) -> dict[str, list[float]]:
        """image -> seconds per timed pass"""
        out: dict[str, list[float]] = {}
        for r in self.records:
            out.setdefault(r.image, []).append(r.latency_s)
        return out

    @property
    def stages(self) -> dict[str, float]:
        """stage -> summed seconds over the timed calls"""
        return {s: sum((r.timings or {}).get(s, 0.0) for r in self.records) for s in STAGES}


def summarise(rec: SystemLog, images: list[str], repeats: int, labels: dict[str, list[str]]) -> dict:
    walls, stages = rec.walls, rec.stages
    medians = {im: percentile(walls[im], 50) for im in images}
    p90s = {im: percentile(walls[im], 90) for im in images}
    samples = [w for im in images for w in walls[im]]
    total = sum(samples)
    cers, found, n_labels, errors, chars = [], 0, 0, 0, 0
    for im in images:
        if im in labels:
            c, f, n, e, k = score_image(labels[im], rec.warm_texts.get(im, []))
            cers.append(c)
            found += f
            n_labels += n
            errors += e
            chars += k
    return {
        "medians": medians,
        "p90s": p90s,
        "mean_med_ms": 1000 * statistics.fmean(medians.values()),
        "med_med_ms": 1000 * percentile(medians.values(), 50),
        "p90_ms": 1000 * percentile(samples, 90),
        "ips": len(images) * repeats / total if total > 0 else float("nan"),
        "total_s": total,
        "split": {s: 100 * stages[s] / total if total > 0 else float("nan") for s in STAGES},
        "cer": errors / chars if chars else float("nan"),
        "n_gt": len(cers),
        "recall": found / n_labels if n_labels else float("nan"),
        "n_labels": n_labels,
        "found": found,
    }


# --------------------------------------------------------------------------
# memory


def trim_heap() -> bool:
    """Hand freed heap memory back to the OS (glibc). rapidocr-paddle leaves
    gigabytes freed-but-held after its first pass over new shapes; without
    this the next system runs on top of it (the first full run here was
    OOM-killed that way). Called between passes only, never inside timing."""
    gc.collect()
    try:
        import ctypes

        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except Exception:
        return False


class MemoryWatch:
    """Samples the process RSS every 0.1 s and keeps the peak per system.
    If the machine's MemAvailable falls under `min_free_gb`, exits at once
    with a clear message (the kernel's OOM killer would otherwise pick this
    process, or worse, a neighbour's)."""

    def __init__(self, min_free_gb: float):
        self.min_free_gb = min_free_gb
        self.current: Optional[str] = None
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memwatch", daemon=True)

    def start(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            r = rss_gb()
            if self.current is not None and not math.isnan(r):
                self.peaks[self.current] = max(self.peaks.get(self.current, 0.0), r)
            avail = mem_available_gb()
            if self.min_free_gb > 0 and avail < self.min_free_gb:
                msg = (f"ABORTED: MemAvailable {avail:.2f} GiB < --min-free-gb {self.min_free_gb} "
                       f"while {self.current} ran (process RSS {r:.2f} GiB); no results written")
                print(msg, flush=True)
                print(msg, file=sys.stderr, flush=True)
                os._exit(3)


# --------------------------------------------------------------------------
# main


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="CPU inference threads for every system (default: all cores, %(default)s)")
    ap.add_argument("--repeats", type=int, default=None, help="timed passes (default 3; 1 with --quick)")
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES, help="image folder (default %(default)s)")
    ap.add_argument("--quick", action="store_true", help="8 representative images, 1 repeat")
    ap.add_argument("--per-image", action="store_true", help="also print the per-image table")
    ap.add_argument("--out", type=Path, help="also write the markdown here")
    ap.add_argument("--engine-config", choices=("default", "reference"), default="default")
    ap.add_argument("--engine-device", choices=("cpu", "gpu"), default="cpu",
                    help="run the engine's predictors on the GPU (paddlepaddle-gpu)")
    ap.add_argument("--min-free-gb", type=float, default=1.0,
                    help="abort if the machine's MemAvailable drops below this (0 = never; default %(default)s)")
    ap.add_argument("--malloc-mmap-threshold", type=int, default=0, metavar="BYTES",
                    help="glibc mallopt(M_MMAP_THRESHOLD, BYTES) at start, for every system: big buffers are "
                         "mmapped and returned on free, which caps rapidocr-paddle's ~11 GiB peak at ~2.6 GiB "
                         "(1048576 does); changes allocation costs, so off by default")
    ap.add_argument("--no-trim", action="store_true",
                    help="do not malloc_trim the heap between passes (see trim_heap)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ", ".join(SYSTEMS))
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads must be at least 1")
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in args.systems if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown system(s) {bad}; choose from {SYSTEMS}")
    return args


def list_images(folder: Path, quick: bool) -> list[str]:
    if not folder.is_dir():
        sys.exit(f"image folder {folder} not found (use --images DIR)")
    names = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not names:
        sys.exit(f"no jpg/jpeg/png images in {folder}")
    if quick:
        chosen = [n for n in QUICK_IMAGES if n in names]
        missing = [n for n in QUICK_IMAGES if n not in names]
        if missing:
            print(f"note: quick images not in {folder}: {missing}", file=sys.stderr)
        names = chosen or names[:8]
    return names


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


def fmt(x: float, nd: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def set_mmap_threshold(nbytes: int) -> bool:
    try:
        import ctypes

        return bool(ctypes.CDLL("libc.so.6").mallopt(-3, nbytes))  # -3 = M_MMAP_THRESHOLD
    except Exception:
        return False


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.malloc_mmap_threshold > 0 and not set_mmap_threshold(args.malloc_mmap_threshold):
        print("warning: mallopt(M_MMAP_THRESHOLD) failed; running with glibc's default", file=sys.stderr)
        args.malloc_mmap_threshold = 0
    folder = args.images.resolve()
    images = list_images(folder, args.quick)
    labels = {k: v for k, v in load_labels(folder).items() if k in images}
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")

    systems: list[System] = []
    skipped: list[str] = []
    for name in args.systems:
        print(f"loading {name} ...", file=sys.stderr)
        try:
            sysobj = make_engine(args.threads, args.engine_config, args.engine_device) if name == "engine" else make_rapidocr(name, args.threads)
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
    rss_start = rss_gb()
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
    args.rss_start = rss_start
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


def render(args, folder, images, labels, systems, skipped, records, stats,
           started, load_before, load_after, run_s) -> str:
    names = [s.name for s in systems]
    out: list[str] = []
    w = out.append
    w(f"# Engine benchmark{' (quick)' if args.quick else ''}")
    w("")
    w(f"- started {started}; {platform.node()}, {platform.processor() or platform.machine()}, "
      f"os.cpu_count()={os.cpu_count()}, affinity={sorted(os.sched_getaffinity(0))}")
    w(f"- threads per system: {args.threads}; images: {len(images)} from `{folder}`; "
      f"timed passes: {args.repeats} (+1 warm-up), systems interleaved per pass; wall {run_s:.0f}s")
    w(f"- load average before {tuple(round(x, 2) for x in load_before)}, "
      f"after {tuple(round(x, 2) for x in load_after)} (shared machine: absolute times are noisy)")
    w(f"- python {platform.python_version()}, paddlepaddle {_dist_version('paddlepaddle')}, "
      f"onnxruntime {_dist_version('onnxruntime')}")
    for s in systems:
        w(f"- `{s.name}`: {s.detail}; load {s.load_s:.2f}s")
    w(f"- memory: process RSS {args.rss_start:.2f} GiB after loading all systems; peak RSS column = the "
      f"process's peak while that system ran (shared process: includes what the others hold); "
      f"{'heap NOT trimmed between passes' if args.no_trim else 'glibc heap trimmed (malloc_trim) between passes, untimed'}; "
      f"{f'mallopt(M_MMAP_THRESHOLD, {args.malloc_mmap_threshold}) for all systems' if args.malloc_mmap_threshold else 'glibc malloc defaults'}")
    for line in skipped:
        w(f"- **{line}**")
    w("")
    w("| system | images/s | mean of per-image medians (ms) | median of per-image medians (ms) | p90 all samples (ms) "
      "| det % | cls % | rec % | other % | lines read | CER (GT images) | label recall | errors | peak RSS (GiB) |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in names:
        st = stats[n]
        sp = st["split"]
        other = 100 - sum(sp.values())
        w(f"| {n} | {fmt(st['ips'], 2)} | {fmt(st['mean_med_ms'])} | {fmt(st['med_med_ms'])} | {fmt(st['p90_ms'])} "
          f"| {fmt(sp['det'])} | {fmt(sp['cls'])} | {fmt(sp['rec'])} | {fmt(other)} "
          f"| {sum(len(t) for t in records[n].warm_texts.values())} "
          f"| {fmt(st['cer'], 3)} (n={st['n_gt']}) | {fmt(st['recall'], 3)} ({st['found']}/{st['n_labels']}) "
          f"| {len(records[n].errors)} | {fmt(args.rss_peaks.get(n, float('nan')), 2)} |")
    w("")
    ratio_lines = []
    if "engine" in stats:
        e = stats["engine"]
        for base in ("rapidocr-paddle", "rapidocr-onnxruntime"):
            if base not in stats:
                continue
            b = stats[base]
            thr = e["ips"] / b["ips"]
            logs = [math.log(b["medians"][im] / e["medians"][im]) for im in images
                    if e["medians"][im] > 0 and b["medians"][im] > 0]
            geo = math.exp(statistics.fmean(logs)) if logs else float("nan")
            ratio_lines.append((base, thr, geo))
            w(f"- engine / {base} throughput: **{thr:.2f}x** "
              f"(geometric mean of per-image median speed-ups: {geo:.2f}x)")
        w("")

    if args.per_image:
        w("## Per image (median / p90 ms over the timed passes; lines = lines read in the warm-up; CER for labelled images)")
        w("")
        head = "| image | " + " | ".join(f"{n} med | {n} p90" for n in names) + " | lines (" + " / ".join(names) + ") | CER (" + " / ".join(names) + ") |"
        w(head)
        w("|---|" + "---:|---:|" * len(names) + "---|---|")
        for im in images:
            cells = []
            for n in names:
                cells += [fmt(1000 * stats[n]["medians"][im]), fmt(1000 * stats[n]["p90s"][im])]
            lines = " / ".join(
                ("ERR" if im in records[n].errors else str(len(records[n].warm_texts.get(im, [])))) for n in names)
            if im in labels:
                cer = " / ".join(fmt(score_image(labels[im], records[n].warm_texts.get(im, []))[0], 3) for n in names)
            else:
                cer = ""
            w(f"| {im} | " + " | ".join(cells) + f" | {lines} | {cer} |")
        w("")

    notes = []
    for n in names:
        r = records[n]
        for im, err in r.errors.items():
            notes.append(f"`{n}` failed on `{im}`: {err}")
        if r.unstable:
            ims = sorted({im for im, _ in r.unstable})
            notes.append(f"`{n}`: text differed from the warm-up pass in {len(r.unstable)} timed call(s) "
                         f"({', '.join(ims[:6])}{', ...' if len(ims) > 6 else ''})")
        empty = [im for im in images if not r.warm_texts.get(im) and im not in r.errors]
        if empty:
            notes.append(f"`{n}` read no text on {len(empty)} image(s): {', '.join(empty)}")
    if notes:
        w("## Notes")
        w("")
        for nline in notes:
            w(f"- {nline}")
        w("")

    parts = [f"{n} {stats[n]['ips']:.2f} img/s, CER {fmt(stats[n]['cer'], 3)}" for n in names]
    summary = f"Summary ({len(images)} images x {args.repeats}, {args.threads} threads): " + "; ".join(parts)
    if ratio_lines:
        summary += "; engine speed-up " + ", ".join(f"{thr:.2f}x vs {b}" for b, thr, _ in ratio_lines)
    if skipped:
        summary += f"; skipped: {', '.join(l.split(':')[0].replace('SKIPPED ', '') for l in skipped)}"
    w(summary)
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
