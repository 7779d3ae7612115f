"""The benchmark's report: markdown and plots rendered only from the raw
JSON of a run, so a live run and `--from-raw` write the same document (the
live run writes its raw JSON, reads it back and renders that)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Optional

from load_tests.analysis import disturbance_warnings, paired_diff, slowdowns, targets_check
from load_tests.loadgen import log
from load_tests.runs import Run, TIMING_KEYS
from harness.procfs import load_line
from harness.service import MODEL_DEPLOYMENTS as STAGES, REPO
from load_tests.stats import Record, fmt as f, md_table, percentiles, summarize


def batch_cell(b: Optional[dict], key: str) -> str:
    if not b:
        return ""
    return "/".join(f(b[s][key], 2) if key.startswith("mean") else str(b[s][key]) for s in STAGES)


def render(run: Run, plots: list[str]) -> str:
    """The markdown report of a run rebuilt from its raw JSON."""
    a = run.args
    head, dirty = run.git
    L: list[str] = []
    w = L.append

    def section(title: str, *paragraphs: str, table: tuple = ()) -> None:
        """## title, its paragraphs and a table (md_table's arguments), each followed by a blank line."""
        for block in (f"## {title}", *paragraphs):
            L.extend([block, ""])
        if table:
            L.extend([*md_table(*table), ""])
    w(f"# Load-test results{' (quick: proves the harness works, numbers mean nothing)' if a.quick else ''}")
    w("")
    w(f"Written by `load_tests/bench.py` ({' '.join(a.argv) or 'no options'}). Started {run.started}, "
      f"wall {f(run.wall_s)} s.")
    w("")
    section("Setup")
    w(f"- machine: {run.machine}; {load_line(run.loadavg_start, run.loadavg_end or ())} (each point's is in the table)")
    w(f"- code: commit {head}" + (f", with uncommitted changes in {', '.join(d.split()[-1] for d in dirty)}"
                                  if dirty else ", clean"))
    w(f"- {run.versions}")
    w(f"- service config: `{a.config.relative_to(REPO) if a.config.is_relative_to(REPO) else a.config}` "
      f"(HTTP on 127.0.0.1:{a.port}), simple server on 127.0.0.1:{a.simple_port}; request body: {a.body}")
    w(f"- images: {len(run.images)} from `{a.images}`: {', '.join(run.images)}")
    w(f"- each load point: {a.warmup:g} s warm-up, then {a.duration:g} s measured; client timeout {a.timeout:g} s; "
      f"latency statistics over requests sent in the window, throughput = successful answers received in it")
    w("")
    section("Results", table=(
        ["target", "load", "requests", "errors", "img/s", "p50 ms", "p90 ms", "p99 ms",
         "mean batch det/cls/rec (requests)", "rec crops/batch", "replicas det/cls/rec", "load avg 1 min",
         "others' CPU (cores)"],
        [[p.label, p.load_str(), p.summary["requests"],
          f"{p.summary['errors']} ({f(100 * p.summary['error_rate'], 1)}%)", f(p.summary["throughput"], 2),
          f(p.summary["p50_ms"]), f(p.summary["p90_ms"]), f(p.summary["p99_ms"]),
          batch_cell(p.batches, "mean_requests"), f(p.batches["rec"]["mean_items"], 1) if p.batches else "",
          batch_cell(p.batches, "replicas"), f(p.loadavg[0], 1) if p.loadavg else "",
          f(p.cpu["others"], 2) if p.cpu else "n/a"] for p in run.points if p.target != "cold"],
        "llrrrrrrlrlrr"))
    w("`load avg 1 min`: the machine's at the end of the point (every process, ours included). `others' CPU`: "
      "cores busy with work that is not this run's process tree during the window (from /proc; n/a in runs "
      "recorded before it was measured). Both say how much another user's work disturbed the point.")
    w("")
    errs = [(p, k, v) for p in run.points for k, v in p.summary.get("error_kinds", {}).items()]
    if errs:
        L.extend(["Errors seen (first kinds per point):", "", *(f"- {p.label} [{p.load_str()}]: {v} x `{k}`"
                                                               for p, k, v in errs), ""])
    rows = targets_check(run)
    if rows:
        section("Targets (ratios from this run; reported, not asserted)", table=(
            ["target", "measured", "wanted", "met"],
            [[t, m, want, "yes" if ok else "no" if ok is not None else "?"] for t, m, want, ok in rows], "llll"))
        for warning in disturbance_warnings(run):
            w(f"- **Warning:** {warning}")
        w("")
    if run.cold:
        c = run.cold
        section("Cold start")
        w(f"- Ray start {f(c.get('ray_init_s'), 1)} s, Serve start {f(c.get('serve_start_s'), 1)} s, "
          f"**deploy -> /readyz 200: {f(c.get('deploy_to_ready_s'), 1)} s** (deploy call "
          f"{f(c.get('deploy_call_s'), 1)} s; readiness polled every 0.25 s)")
        for s, reps in (c.get("replicas") or {}).items():
            for pid, r in reps.items():
                w(f"- {STAGES[s]} replica pid {pid}: model load {f(r.get('load_seconds'), 2)} s, warm-up "
                  f"{f(r.get('warm_seconds'), 2)} s, cores {r.get('cpu_affinity')}")
        fr = c.get("first_request")
        if fr:
            w(f"- first request after ready (`{fr['image']}`): {f(fr['latency_ms'])} ms, ok={fr['ok']}, server "
              f"timings {fr.get('timings')}; the next two of the same image: "
              f"{', '.join(f(x) for x in c.get('same_image_next_ms', []))} ms")
        w("")
    tail_rows = []
    for p in run.points:
        if p.target == "cold" or p.mode == "loop":
            continue
        sl, ref = slowdowns(run, p)
        if sl:
            sp = percentiles(sl)
            tail_rows.append([p.label, p.load_str(), f"{ref.label}, {ref.load_str()}",
                              *(f"{sp[k]:.2f}" for k in ("p50", "p90", "p99"))])
    if tail_rows:
        section("Queueing, with the image mix taken out",
                "Latency of each request divided by the median latency of the same image on the same system at 1 "
                "client (1.0 = as fast as unloaded). The images differ a lot in cost (a dense page takes ~20x a "
                "typical photo), so the plain percentiles above mix image cost with queueing; these do not.",
                table=(["target", "load", "reference", "p50", "p90", "p99"], tail_rows, "lllrrr"))
    pairs = []
    by = {(p.target, p.load) for p in run.points}
    for x, y in ((("http", 1), ("engine", 1)), (("http", 1), ("simple", 1)), (("simple", 1), ("engine", 1)),
                 (("handle", 1), ("engine", 1)), (("nobatch", 1), ("http", 1))):
        if x in by and y in by:
            px = [p for p in run.points if (p.target, p.load) == x][0]
            py = [p for p in run.points if (p.target, p.load) == y][0]
            d, n = paired_diff(px, py)
            pairs.append([f"{px.label}, {px.load_str()}", f"{py.label}, {py.load_str()}", f(d, 1), n])
    if pairs:
        section("Low-load latency, image by image",
                "Median over the images of (median latency of the image on A - on B), in ms: what A adds per "
                "request when nothing queues.", table=(["A", "B", "A - B (ms)", "images"], pairs, "llrr"))
    stage_rows = []
    for p in run.points:
        st, b, lat = p.summary.get("stage_ms"), p.batches, p.summary.get("mean_ms")
        if st:
            outside = lat - st["total"] if p.mode != "loop" and "total" in st else float("nan")
            busy = ("/".join(f(b[s]["busy_s"] / b[s]["sampled_s"] if b[s]["sampled_s"] > 0 else None, 2)
                             for s in STAGES)) if b else ""
            stage_rows.append([p.label, p.load_str(), f(lat), *(f(st.get(k), 0) for k in TIMING_KEYS), f(outside),
                               f(st.get("lock_wait")), batch_cell(b, "mean_batch_ms"), busy])
    section("Where the time goes (means over successful requests; ms)",
            "`decode`..`total` are the server's own `timings_ms` (in the service each model stage includes the hop "
            "to its deployment and the wait for a batch); `outside` = client latency minus server `total` (HTTP, "
            "proxy, ingress, queueing before the pipeline); `busy` = the model replicas' summed batch compute time "
            "per stage in the window divided by the window's length (1.0 = one replica computing all the time; "
            "batch times are wall times on the predictor thread, so CPU contention stretches them).", table=(
                ["target", "load", "latency", *TIMING_KEYS, "outside", "lock wait", "batch ms det/cls/rec",
                 "busy det/cls/rec"], stage_rows, "llrrrrrrrrll"))
    if plots:
        section("Plots", *(f"![{Path(pth).stem}](img/{Path(pth).name})" for pth in plots))
    if run.probes:
        section("Probes", "\n".join(f"- {k}: {v}" for k, v in run.probes.items()))
    if run.notes or run.failures:
        section("Notes", "\n".join([*(f"- {n}" for n in run.notes), *(f"- **{n}**" for n in run.failures)]))
    w(summary_line(run))
    return "\n".join(L) + "\n"


def summary_line(run: Run) -> str:
    parts = []
    eng = run.get("engine", "loop")
    http = run.get("http", "closed")
    simple = run.get("simple", "closed")
    if eng:
        parts.append(f"engine {eng[0].summary['throughput']:.2f} img/s p50 {eng[0].summary['p50_ms']:.0f} ms")
    if http:
        sat = max(http, key=lambda p: p.summary["throughput"])
        parts.append(f"service saturates at {sat.summary['throughput']:.2f} img/s ({sat.load_str()}, "
                     f"p99 {sat.summary['p99_ms']:.0f} ms)")
    if simple:
        sat = max(simple, key=lambda p: p.summary["throughput"])
        parts.append(f"simple server {sat.summary['throughput']:.2f} img/s ({sat.load_str()}, "
                     f"p99 {sat.summary['p99_ms']:.0f} ms)")
    if run.cold.get("deploy_to_ready_s"):
        parts.append(f"deploy->ready {run.cold['deploy_to_ready_s']:.1f} s")
    rows = targets_check(run)
    if rows:
        parts.append(f"targets met {sum(1 for r in rows if r[3])}/{len(rows)}")
    total = sum(p.summary["requests"] for p in run.points)
    bad = sum(p.summary["errors"] for p in run.points)
    parts.append(f"{total} requests, {bad} errors")
    if run.failures:
        parts.append(f"{len(run.failures)} phase(s) FAILED")
    return "Summary: " + "; ".join(parts) + "."


def write_report(raw: dict, args) -> tuple[Run, Path]:
    """Render `raw` (a run's raw JSON, as a dict) into args.out: benchmarks.md
    and img/*.png. Returns the run rebuilt from raw and the report's path."""
    run = Run.from_raw(args, raw)
    args.out.mkdir(parents=True, exist_ok=True)
    plots: list[str] = []
    try:
        from load_tests.plots import plot

        plots = plot(run, args.out / "img", "_quick" if args.quick else "")
    except Exception as e:
        run.failures.append(f"plots failed: {type(e).__name__}: {e}")
    report = args.out / "benchmarks.md"
    report.write_text(render(run, plots), encoding="utf-8")
    log(f"wrote {report}" + (f", {', '.join(plots)}" if plots else ""))
    return run, report


def write_raw(run: Run, path: Path) -> dict:
    """The run's raw JSON, written to path; returned as read back (so the
    report sees exactly what --from-raw would)."""
    run.finish()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run.to_raw(), indent=1, default=str), encoding="utf-8")
    log(f"wrote {path}")
    return json.loads(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------
# the soak's report (load_tests/soak.py), also only from its raw JSON


def soak_summary(raw: dict) -> dict:
    """Requests, errors, latency and every replica's private-memory growth
    from the first memory sample (end of warm-up) to the last."""
    recs = [Record.from_json(r) for r in raw["records"]]
    s = summarize(recs, (0.0, raw["window_s"]))
    first, last = raw["memory"][0][1], raw["memory"][-1][1]
    growth = {k: (last[k] - first[k]) / first[k] for k in sorted(first)
              if not k.endswith(" shm") and first.get(k) and last.get(k)}
    return {
        "seconds": raw["seconds"], "saturation_img_s": round(raw["saturation_img_s"], 3),
        "offered_img_s": round(raw["offered_img_s"], 3), "requests": s["requests"], "errors": s["errors"],
        "error_kinds": sorted(s["error_kinds"]), "p50_ms": round(s["p50_ms"], 1), "p99_ms": round(s["p99_ms"], 1),
        "max_memory_growth": round(max(growth.values()), 4) if growth else None,
        "memory_growth": {k: round(v, 4) for k, v in growth.items()},
        "memory_mb": {k: [round(first[k], 1), round(last[k], 1)] for k in growth},
        "shared_mb": {k: [round(first.get(f"{k} shm", 0), 1), round(last.get(f"{k} shm", 0), 1)] for k in growth},
        "images": raw.get("images"), "hostile_share": raw.get("hostile_share"), "hostile": raw.get("hostile", {}),
    }


def write_soak_report(raw: dict, out: Path) -> dict:
    """out/summary.json, soak.md, soak_memory.csv (and .png with matplotlib)."""
    out.mkdir(parents=True, exist_ok=True)
    summary = soak_summary(raw)
    rows = raw["memory"]
    keys = sorted({k for _, row in rows for k in row})
    with open(out / "soak_memory.csv", "w", newline="") as fh:
        wr = csv.writer(fh)
        wr.writerow(["t_s"] + keys)
        for t, row in rows:
            wr.writerow([round(t, 1)] + [round(row.get(k, float("nan")), 1) for k in keys])
    try:
        from load_tests.plots import soak_memory_plot

        soak_memory_plot(rows, list(summary["memory_growth"]), out / "soak_memory.png")
    except ImportError:
        pass
    first, last = rows[0][1], rows[-1][1]
    mg = summary["max_memory_growth"]
    nan = float("nan")
    lines = ["# Soak", "", f"`python -m load_tests soak --seconds {raw['seconds']:.0f}`", "", *md_table(
        ["requests", "errors", "offered img/s", "saturation img/s", "p50 ms", "p99 ms", "max replica memory growth"],
        [[summary[k] for k in ("requests", "errors", "offered_img_s", "saturation_img_s", "p50_ms", "p99_ms")]
         + [f"{mg:.2%}" if mg is not None else "n/a"]], "lllllll"), "",
        "Memory: each replica's private memory (RSS less the object store's shared pages it has touched,"
        " shown apart), from the end of warm-up to the end.", "", *md_table(
            ["replica", "private start MB", "private end MB", "growth", "shared (object store) start -> end MB"],
            [[k, f"{first[k]:.0f}", f"{last[k]:.0f}", f"{g:.2%}",
              f"{first.get(f'{k} shm', nan):.0f} -> {last.get(f'{k} shm', nan):.0f}"]
             for k, g in summary["memory_growth"].items()], "lllll")]
    if summary["error_kinds"]:
        lines += ["", "Errors: " + "; ".join(f"`{e}`" for e in summary["error_kinds"])]
    if summary.get("hostile"):
        lines += ["", f"Hostile requests mixed in ({summary['hostile_share']} per good one), answers by kind:", "",
                  *md_table(["kind", "answers"], [[k, ", ".join(f"{s} x{n}" for s, n in sorted(v.items()))]
                                                  for k, v in sorted(summary["hostile"].items())], "ll")]
    (out / "soak.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
