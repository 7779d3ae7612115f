"""Documents as people have them (#25): reading order against the truth,
page orientation, multi-page TIFF. One in-process engine (the default
config, the real models); every comparison is measured side by side in
this run.

    .venv/bin/python -m load_tests documents layout [--only order,tiff,orientation] [--json F]

Tables:
1. order on made pages (harness/pages.py): blocks on (default) vs off (the
   former top-to-bottom order), as the fraction of line pairs in the
   truth's order (1.000 = the truth's order) and exact pages;
3. orientation: made pages and the peer images turned 0/90/180/270 ->
   the angle found; lines read turned vs upright;
5. a 3-page CCITT G4 fax TIFF read as a document.
(Tables 2, 4 and 6, the peer images' order, orientation's cost and
upper-case spacing, were removed; commit 75b3e9c has them.)"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np


from harness.pages import fax_tiff, made_pages, order_score
from harness.peer import PEER, reference
from load_tests.stats import md_table

ANGLES = (0, 90, 180, 270)


def texts(result) -> list[str]:
    return [line.text for line in result.lines]


def order_table(engine, out: dict) -> None:
    print("\n## 1. Order on made pages: fraction of line pairs in the truth's order (lines matched / truth)\n")
    rows = []
    for page in made_pages():
        on = engine.read(page.image)
        off = engine.read(page.image, blocks=False)
        s_on, m_on, n = order_score(texts(on), page.truth)
        s_off, _, _ = order_score(texts(off), page.truth)
        rows.append({"page": page.name, "on": s_on, "off": s_off, "blocks": len(on.blocks), "matched": m_on,
                     "truth": n})
    exact_on, exact_off = sum(r["on"] == 1.0 for r in rows), sum(r["off"] == 1.0 for r in rows)
    print("\n".join(md_table(["page", "blocks on", "blocks off", "blocks", "lines"], [
        *([r["page"], f"{r['on']:.3f}", f"{r['off']:.3f}", r["blocks"], f"{r['matched']}/{r['truth']}"] for r in rows),
        ["**pages in the truth's order**", f"**{exact_on}/{len(rows)}**", f"{exact_off}/{len(rows)}", "", ""]])))
    out["order_made"] = rows


def orientation_table(engine, out: dict) -> None:
    print("\n## 3. Orientation found (pages turned clockwise by each angle)\n")
    from serve_app.ocr.decode import decode_image

    res, table = {}, []
    for label, items in (("made pages", [(p.name, p.image, p) for p in made_pages()]),
                         ("peer images", [(n, decode_image((PEER / n).read_bytes()), None) for n in sorted(reference())])):
        right = {a: 0 for a in ANGLES}
        wrong: list[str] = []
        order = {a: [] for a in ANGLES}
        lines = {a: 0 for a in ANGLES}
        few = {a: [0, 0] for a in ANGLES}
        for name, img, page in items:
            n_up = None
            for a in ANGLES:
                k = {0: 0, 90: 3, 180: 2, 270: 1}[a]
                r = engine.read(np.ascontiguousarray(np.rot90(img, k)))
                ok = r.orientation == a
                right[a] += ok
                lines[a] += len(r.lines)
                if a == 0:
                    n_up = len(r.lines)
                if n_up is not None and n_up <= 3:
                    few[a][0] += ok
                    few[a][1] += 1
                if not ok:
                    wrong.append(f"{name}@{a}->{r.orientation}")
                if page is not None:
                    order[a].append(order_score(texts(r), page.truth)[0])
        n = len(items)
        table.append([label, n, *(f"{right[a]}/{n}" for a in ANGLES)])
        res[label] = {"right": right, "wrong": wrong, "lines": lines, "few_lines": few,
                      "order": {a: (statistics.mean(v) if v else None) for a, v in order.items()}}
    print("\n".join(md_table(["set", "images", *map(str, ANGLES)], table)))
    for label, r in res.items():
        print(f"\n{label}: lines read per angle {r['lines']}; pages with <= 3 lines found right "
              f"{ {a: f'{x}/{t}' for a, (x, t) in r['few_lines'].items()} }")
        if r["order"][0] is not None:
            print(f"{label}: mean order score per angle {({a: round(v, 3) for a, v in r['order'].items()})}")
        print(f"{label}: wrong: {', '.join(r['wrong']) or 'none'}")
    out["orientation"] = res


def tiff_table(engine, out: dict) -> None:
    made = {p.name: p for p in made_pages()}
    pages = [made["invoice"], made["2col_title"], made["table"]]
    data = fax_tiff(pages)
    doc = engine.read_document(data)
    print(f"\n## 5. A 3-page CCITT G4 fax TIFF ({len(data)} bytes)\n")
    print(f"document type {doc.kind}, pages {len(doc.pages)}")
    rows = []
    for p, truth in zip(doc.pages, pages):
        s, m, n = order_score([line.text for line in p.lines], truth.truth)
        rows.append((p.page, len(p.lines), s, m, n))
        print(f"- page {p.page}: {len(p.lines)} lines, order {s:.3f}, matched {m}/{n}")
    out["tiff"] = rows


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", default="", help="comma-separated tables: order,tiff,orientation")
    ap.add_argument("--json", help="write the figures here")


def main(args: argparse.Namespace) -> int:
    from serve_app.engine import OcrEngine

    only = set(filter(None, args.only.split(",")))
    out: dict = {}
    t0 = time.perf_counter()
    with OcrEngine() as engine:
        engine.warm()
        for name, fn in (("order", order_table), ("tiff", tiff_table), ("orientation", orientation_table)):
            if not only or name in only:
                fn(engine, out)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0
