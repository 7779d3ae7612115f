"""Benchmark: the front beside heavy or hostile work (issue 49). Each class
of harness.stall runs against the light profile (`make serve`'s, behind a
token and 16 named tokens, a 2 s page budget) while /healthz is asked every
0.1 s, another client (127.0.0.2) reads one word image one request after
another (every 0.5 s), and the ingress's and the whole service's PSS are
sampled:

    timeout 900 .venv/bin/python -m load_tests hostile front [--seconds 20]

The classes: `readers` (16 readers of one large finished job's hOCR, in a
loop), `probes` (8 clients polling /readyz and /v1/stats every 0.1 s while
one reads dense pages), `submits` (4 clients submitting 19 MB PNG jobs of 250 chunks,
1 rotating through 16 named tokens fetching a result), `layout` (2
clients reading a page of 1,600 lone letters), `door` (2 clients sending
a 199-page TIFF, its first page 16 x 16 px and the rest 16 MP, to the sync
API), `tiled` (a job of a 40-page TIFF of 16 MP pages in 16 x 16 px
tiles: when it ended), `bomb` (a job of a 500-page PDF of render-bomb
pages, another client reading a one-page PDF beside it), `documents` (a
500-page PDF render bomb and 100 4-page TIFF jobs from one client), `flood`
(one client's 100 4-page TIFF jobs, then another client's one-image job:
when it started and ended). First the probes alone (the baseline of this
run), then each class: /healthz p99, the normal request's worst time and
statuses, the ingress's and the service's peak PSS growth, what the
workload got. Prints one table (markdown)."""

from __future__ import annotations

import argparse
import time

from harness.peer import PEER


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=20.0, help="each class's workload runs this long")
    p.add_argument("--only", default="", help="the classes to run, comma-separated (default: all)")


def row(name: str, outcome: dict, report) -> str:
    codes = sorted({c for c, _ in report.normal})
    extra = f"; /readyz p99 {outcome['readyz_p99_ms']:.0f} ms" if "readyz_p99_ms" in outcome else ""
    extra += "".join(f"; {k} {outcome[k]}" for k in ("worst_s", "one_page_pdf", "job", "newcomer") if k in outcome)
    return (f"| {name} | {outcome['sent']} | {report.healthz_p99_ms:.0f} ms | {report.normal_worst_s:.2f} s "
            f"({len(report.normal)} x {'/'.join(map(str, codes))}) | {report.ingress_growth_mb:.0f} MB | "
            f"{report.service_growth_mb:.0f} MB | {outcome['codes']}{extra} |")


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
    print()
    print("| class | sent | /healthz p99 | normal request: worst (n x statuses) | ingress PSS growth | "
          "service PSS growth | workload's answers |")
    print("|---|---|---:|---|---:|---:|---|")
    print("\n".join(rows))
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
