"""What a run's points say: the targets of the issue, queueing with the image
mix taken out, per-image paired differences, signs of a disturbed machine.
Reads only a `Run` rebuilt from raw JSON (pure: no Ray, no models)."""

from __future__ import annotations

from typing import Optional

from load_tests.runs import Point, Run, SERVICE_TARGETS
from load_tests.stats import fmt as f, image_medians, percentile, percentiles


def medians(p: Point) -> dict[str, float]:
    """Median latency per image over the point's successful requests sent in its window."""
    return image_medians(p.records, p.window)


def reference_point(run: Run, p: Point) -> Optional[Point]:
    """The same system unloaded: its own 1-client point (the loop itself for
    in-process baselines), else the service's HTTP 1-client point."""
    if p.mode == "loop":
        return p
    for target in (p.target, "http") if p.target in SERVICE_TARGETS | {"cold"} else (p.target,):
        ref = [q for q in run.get(target, "closed") if q.load == 1]
        if ref:
            return ref[0]
    return None


def slowdowns(run: Run, p: Point) -> tuple[list[float], Optional[Point]]:
    """Each request's latency over the median latency of the same image on
    the same system at 1 client: queueing, with the image mix taken out."""
    ref = reference_point(run, p)
    if ref is None:
        return [], None
    med = medians(ref)
    ws, we = p.window
    return [r.latency_ms / med[r.image] for r in p.records
            if r.ok and ws <= r.t_start < we and med.get(r.image, 0) > 0], ref


def paired_diff(a: Point, b: Point) -> tuple[float, int]:
    """Median over the images both points read of (a's median - b's median), ms."""
    ma, mb = medians(a), medians(b)
    common = sorted(set(ma) & set(mb))
    return percentile([ma[i] - mb[i] for i in common], 50), len(common)


def disturbance_warnings(run: Run, others_max: float = 0.3, slack_ms: float = 5.0) -> list[str]:
    """Signs that other work on the machine distorted the comparisons."""
    out = []
    hit = [f"{p.label} [{p.load_str()}] {p.cpu['others']:.2f}" for p in run.points
           if p.cpu and p.cpu["others"] >= others_max]
    if hit:
        out.append(f"other users' work took >= {others_max} cores during: {'; '.join(hit)}")
    eng, s1 = run.get("engine", "loop"), [p for p in run.get("simple", "closed") if p.load == 1]
    if eng and s1:
        d, n = paired_diff(s1[0], eng[0])
        if d < -slack_ms:
            out.append(f"the simple server at 1 client (the same engine plus HTTP) was faster than the in-process "
                       f"engine by {-d:.0f} ms per image (median over {n} images): the engine point was disturbed"
                       f"{' (or cold: --quick skips its warm-up pass)' if run.args.quick else ''}, "
                       f"so the ratios against it are not trustworthy; the simple server at 1 client is the "
                       f"better reference in this run")
    return out


def targets_check(run: Run) -> list[tuple[str, str, str, Optional[bool]]]:
    """(target, measured, requirement, met) for each target of the issue."""
    rows: list[tuple[str, str, str, Optional[bool]]] = []
    eng = run.get("engine", "loop")
    http = run.get("http", "closed")
    simple = run.get("simple", "closed")
    e = eng[0].summary if eng else None
    sat = max(http, key=lambda p: p.summary["throughput"]) if http else None
    if e and sat:
        r = sat.summary["throughput"] / e["throughput"]
        rows.append(("service throughput at saturation >= 1.0x in-process engine",
                     f"{sat.summary['throughput']:.2f} img/s ({sat.load_str()}) vs {e['throughput']:.2f} img/s "
                     f"= **{r:.2f}x**", ">= 1.0x", r >= 1.0))
    low = [p for p in http if p.load == min(q.load for q in http)] if http else []
    if e and low:
        d = low[0].summary["p50_ms"] - e["p50_ms"]
        per_image = f"; per image (median of per-image median differences): service - engine " \
                    f"{paired_diff(low[0], eng[0])[0]:+.0f} ms"
        s1 = [p for p in simple if p.load == 1]
        if s1:
            per_image += (f", service - simple server (1 client) {paired_diff(low[0], s1[0])[0]:+.0f} ms, "
                          f"simple server - engine {paired_diff(s1[0], eng[0])[0]:+.0f} ms")
        rows.append(("service p50 at low load <= engine p50 + 15 ms",
                     f"{low[0].summary['p50_ms']:.0f} ms ({low[0].load_str()}) vs {e['p50_ms']:.0f} ms "
                     f"= **{d:+.0f} ms**{per_image}", "<= +15 ms", d <= 15))
    op = run.get("open", "open")
    if op:
        s = op[0].summary
        r = s["p99_ms"] / s["p50_ms"] if s["p50_ms"] else float("nan")
        frac = s.get("fraction_of_saturation")
        sl, _ = slowdowns(run, op[0])
        mix = ""
        if sl:
            sp = percentiles(sl)
            mix = (f"; with the image mix taken out (latency / the image's 1-client median): p50 "
                   f"{sp['p50']:.2f}, p99 {sp['p99']:.2f}")
        if e:
            mix += f"; the engine alone, one at a time, has p99/p50 = {e['p99_ms'] / e['p50_ms']:.1f}x on these images"
        rows.append(("p99 <= 2.5x p50 at 70% of saturation",
                     f"open loop {op[0].load:.2f}/s ({f(100 * frac) if frac else '?'}% of saturation): "
                     f"p50 {s['p50_ms']:.0f}, p99 {s['p99_ms']:.0f} ms = **{r:.2f}x**; errors {s['errors']}{mix}",
                     "<= 2.5x", bool(r <= 2.5)))
    first = run.cold.get("first_request")
    if first and low:
        steady = low[0].summary["p50_ms"]
        r_all = first["latency_ms"] / steady
        same = medians(low[0]).get(first["image"])
        if same:  # judged against the same image: the image mix is not a cold-start cost
            r = first["latency_ms"] / same
            text = (f"`{first['image']}`: {first['latency_ms']:.0f} ms vs that image's steady median at 1 client "
                    f"{same:.0f} ms = **{r:.2f}x** (against the p50 of all images, {steady:.0f} ms: {r_all:.2f}x)")
        else:
            r = r_all
            text = f"{first['latency_ms']:.0f} ms vs {steady:.0f} ms = **{r:.2f}x**"
        rows.append(("first request after ready <= 1.5x steady p50", text, "<= 1.5x", r <= 1.5))
    if http and simple:
        s_sat = max(p.summary["throughput"] for p in simple)
        v_sat = sat.summary["throughput"]
        rows.append(("service > simple server: throughput at saturation",
                     f"{v_sat:.2f} vs {s_sat:.2f} img/s = **{v_sat / s_sat:.2f}x**", "> 1.0x", v_sat > s_sat))
        common = sorted({p.load for p in http} & {p.load for p in simple} - {1})
        for c in common:
            hp = [p for p in http if p.load == c][0].summary
            sp = [p for p in simple if p.load == c][0].summary
            rows.append((f"service > simple server: p99 at {int(c)} clients",
                         f"{hp['p99_ms']:.0f} vs {sp['p99_ms']:.0f} ms (throughput {hp['throughput']:.2f} vs "
                         f"{sp['throughput']:.2f} img/s)", "lower p99", hp["p99_ms"] < sp["p99_ms"]))
    return rows
