"""Benchmark: the front beside heavy or hostile work (issue 49). Each class
of harness.stall (`CLASSES`; each function's docstring says what it
sends) runs against the light profile (`make serve`'s, behind a token and
16 named tokens, a 2 s page budget) beside harness.stall's `Beside`
probes: /healthz every 0.1 s, a word image read one request after another
by another client (127.0.0.2), the ingress's and the service's PSS.

    timeout 900 .venv/bin/python -m load_tests hostile front [--seconds 20] [--only readers,bomb]

First the probes alone (this run's baseline), then each class: /healthz
p99, the normal request's worst time and statuses, the ingress's and the
service's peak PSS growth, what the workload got; one markdown table."""

from __future__ import annotations

import argparse
import time

from harness.peer import PEER
from load_tests.stats import md_table


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=20.0, help="each class's workload runs this long")
    p.add_argument("--only", default="", help="the classes to run, comma-separated (default: all)")


def row(name: str, outcome: dict, report) -> list[str]:
    codes = sorted({c for c, _ in report.normal})
    extra = f"; /readyz p99 {outcome['readyz_p99_ms']:.0f} ms" if "readyz_p99_ms" in outcome else ""
    extra += "".join(f"; {k} {outcome[k]}" for k in ("worst_s", "one_page_pdf", "job", "newcomer") if k in outcome)
    return [name, outcome["sent"], f"{report.healthz_p99_ms:.0f} ms",
            f"{report.normal_worst_s:.2f} s ({len(report.normal)} x {'/'.join(map(str, codes))})",
            f"{report.ingress_growth_mb:.0f} MB", f"{report.service_growth_mb:.0f} MB", f"{outcome['codes']}{extra}"]


def main(args: argparse.Namespace) -> int:
    from harness import service, stall

    names = [n for n in (args.only.split(",") if args.only else stall.CLASSES) if n]
    small = (PEER / "mmocr_word_1036169.jpg").read_bytes()
    rows = []
    with service.served(stall.front_config()) as url:
        service.wait_shapes_built()
        front = stall.started(url, small)
        for _ in range(3):
            with front.beside():
                time.sleep(1)  # warm: the normal client's first reads
        with front.beside() as alone:
            time.sleep(args.seconds)
        print(f"baseline (probes alone): {alone.report.line()}", flush=True)
        rows.append(row("none (baseline)", {"sent": "the probes alone", "codes": {}}, alone.report))
        for name in names:
            outcome, report = stall.run_class(front, name, args.seconds)
            print(f"{name}: {outcome}; {report.line()}", flush=True)
            rows.append(row(name, outcome, report))
    print("\n" + "\n".join(md_table(["class", "sent", "/healthz p99", "normal request: worst (n x statuses)",
                                    "ingress PSS growth", "service PSS growth", "workload's answers"], rows, "llrlrrl")))
    return 0


def smoke(args: argparse.Namespace) -> int:
    """Every class's request bodies built (no service): each within the
    body limit, the probes' statistics on made numbers."""
    from harness import stall
    from load_tests.cli import check

    from harness.pages import tiled_tiff

    bodies = {"long text PDF": stall.long_text_pdf(2), "chunks PNG": stall.big_chunks_png(),
              "lone letters": stall.dots_page(), "TIFF": stall.multipage_tiff(2),
              "tiled TIFF": tiled_tiff(40), "199-page TIFF": tiled_tiff(199, tile=256, first=16)}
    for name, body in bodies.items():
        check(0 < len(body) < 20 << 20, f"{name}: {len(body)} bytes")
        print(f"{name}: {len(body):,} bytes")
    check(stall.percentile(list(range(1, 101)), 99) == 99, "percentile")
    check(sorted(stall.CLASSES) == ["bomb", "documents", "door", "flood", "layout", "probes", "readers", "submits",
                                    "tiled"], "classes")
    return 0
