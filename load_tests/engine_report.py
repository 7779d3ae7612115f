"""bench_engine.py's numbers and report: accuracy against the peer labels
(harness/peer.py's CER), per-system statistics from `load_tests.stats`
records and percentile, and the markdown."""

from __future__ import annotations

import math
import os
import platform
import statistics
from dataclasses import dataclass, field

from harness.procfs import load_line
from load_tests.baselines import STAGES
from load_tests.runs import dist_version
from load_tests.stats import Record, fmt as stats_fmt, md_table, percentile


# --------------------------------------------------------------------------
# accuracy


def squash(s: str) -> str:
    return "".join(s.split())


def score_image(expected: list[str], texts: list[str]) -> tuple[float, int, int, int, int]:
    """(CER, labels found, labels, character errors, label characters) for
    one image. CER is the project's one metric (harness/peer.py, on sys.path
    as bench_engine.py sets it): each label matched to the read line where
    it needs the fewest edits."""
    from harness.peer import label_errors

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
    scored = [score_image(labels[im], rec.warm_texts.get(im, [])) for im in images if im in labels]
    found, n_labels, errors, chars = (sum(x[i] for x in scored) for i in range(1, 5))
    return {
        "medians": medians,
        "p90s": p90s,
        "mean_med_ms": 1000 * statistics.fmean(medians.values()),
        "med_med_ms": 1000 * percentile(medians.values(), 50),
        "p90_ms": 1000 * percentile(samples, 90),
        "ips": len(images) * repeats / total if total > 0 else float("nan"),
        "split": {s: 100 * stages[s] / total if total > 0 else float("nan") for s in STAGES},
        "cer": errors / chars if chars else float("nan"),
        "n_gt": len(scored),
        "recall": found / n_labels if n_labels else float("nan"),
        "n_labels": n_labels,
        "found": found,
    }


def fmt(x: float, nd: int = 1) -> str:
    return stats_fmt(x, nd)


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
    w(f"- {load_line(load_before, load_after)} (shared machine: absolute times are noisy)")
    w(f"- python {platform.python_version()}, paddlepaddle {dist_version('paddlepaddle')}, "
      f"onnxruntime {dist_version('onnxruntime')}")
    for s in systems:
        w(f"- `{s.name}`: {s.detail}; load {s.load_s:.2f}s")
    w(f"- memory: process RSS {args.rss_start:.2f} GiB after loading all systems; peak RSS column = the "
      f"process's peak while that system ran (shared process: includes what the others hold); "
      f"{'heap NOT trimmed between passes' if args.no_trim else 'glibc heap trimmed (malloc_trim) between passes, untimed'}; "
      f"{f'mallopt(M_MMAP_THRESHOLD, {args.malloc_mmap_threshold}) for all systems' if args.malloc_mmap_threshold else 'glibc malloc defaults'}")
    for line in skipped:
        w(f"- **{line}**")
    w("")
    out += md_table(["system", "images/s", "mean of per-image medians (ms)", "median of per-image medians (ms)",
                     "p90 all samples (ms)", "det %", "cls %", "rec %", "other %", "lines read", "CER (GT images)",
                     "label recall", "errors", "peak RSS (GiB)"], (
        [n, fmt(st["ips"], 2), fmt(st["mean_med_ms"]), fmt(st["med_med_ms"]), fmt(st["p90_ms"]),
         *(fmt(st["split"][k]) for k in ("det", "cls", "rec")), fmt(100 - sum(st["split"].values())),
         sum(len(t) for t in records[n].warm_texts.values()), f"{fmt(st['cer'], 3)} (n={st['n_gt']})",
         f"{fmt(st['recall'], 3)} ({st['found']}/{st['n_labels']})", len(records[n].errors),
         fmt(args.rss_peaks.get(n, float("nan")), 2)] for n, st in ((n, stats[n]) for n in names)))
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
        out += md_table(["image", *(f"{n} {k}" for n in names for k in ("med", "p90")),
                         f"lines ({' / '.join(names)})", f"CER ({' / '.join(names)})"], (
            [im, *(fmt(1000 * stats[n][k][im]) for n in names for k in ("medians", "p90s")),
             " / ".join("ERR" if im in records[n].errors else str(len(records[n].warm_texts.get(im, []))) for n in names),
             " / ".join(fmt(score_image(labels[im], records[n].warm_texts.get(im, []))[0], 3) for n in names)
             if im in labels else ""] for im in images), "l" + "r" * 2 * len(names) + "ll")
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
