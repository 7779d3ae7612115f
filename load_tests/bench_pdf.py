"""Benchmark: a 20-page PDF end to end through the service, against the
in-process engine reading the same rendered pages one by one, and the
service with 1 and 2 recogniser replicas. One run, one machine.

The PDF is made from the first 20 peer images that are whole pages, each a
JPEG page (quality 90, as a scanner stores it; lossless pages would pass
the 20 MiB body limit) sized to its pixels at the render DPI
(harness/pdfs.py); the engine reads the pages as the service renders them.

1. Engine (no Ray): OcrEngine with its defaults, warmed; the pages rendered
   once with serve_app.flow.documents (the service's renderer and DPI); one
   untimed pass, then `--repeats` timed passes of `engine.read(page)` one
   after another, and of `engine.read_document` on the PDF (the service's
   pipeline code, pages concurrent within one process).
2. Service, per recogniser replica count in `--replicas` (1 then 2):
   deployments.yaml with TextRecognizer pinned to that count, deployed as
   `serve deploy` does; one untimed document, then `--repeats` timed
   POST /v1/ocr of the PDF, one at a time (latency: the whole document).
3. Per system: pages/s = pages x repeats / summed document seconds; p50 and
   max document latency; lines read (last pass); the service's mean render
   ms per page (its timings_ms "render").

    timeout 900 .venv/bin/python -m load_tests documents pdf --repeats 5   # under the shared lock"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import cv2
import requests

from harness.pdfs import image_pdf
from harness.peer import PEER, peer_names
from harness.service import load_config, served
from load_tests.stats import md_table
from serve_app.core.app_args import AppArgs

CROPS = ("_word_", "_rec", "text_recog", "_short", "empty_black", "without_det", "text_cls")


def page_images(n: int) -> list[tuple[str, "object"]]:
    pages = [name for name in peer_names() if not any(c in name for c in CROPS)][:n]
    if len(pages) < n:
        raise SystemExit(f"only {len(pages)} whole-page peer images in {PEER}")
    return [(name, cv2.imread(str(PEER / name), cv2.IMREAD_COLOR)) for name in pages]


def summary(name: str, seconds: list[float], pages: int, lines: int, render_ms: str = "") -> dict:
    return {"system": name, "pages/s": pages * len(seconds) / sum(seconds),
            "p50 s": statistics.median(seconds), "max s": max(seconds), "lines": lines, "render": render_ms}


def bench_engine(pdf: bytes, repeats: int, dpi: int) -> list[dict]:
    from serve_app.flow.documents import PdfFile
    from serve_app.engine import OcrEngine

    with OcrEngine() as engine:
        engine.warm()
        limits = engine.config.documents
        assert limits.render_dpi == dpi, (limits.render_dpi, dpi)
        with PdfFile(pdf, limits, engine.config.limits.max_pixels) as doc:
            pages = [doc.render(k) for k in range(doc.pages)]
        one_by_one, whole = [], []
        lines = doc_lines = 0
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            results = [engine.read(p) for p in pages]
            s1 = time.perf_counter() - t0
            t0 = time.perf_counter()
            doc_result = engine.read_document(pdf)
            s2 = time.perf_counter() - t0
            if r:  # the first pass is a warm-up
                one_by_one.append(s1)
                whole.append(s2)
            lines = sum(len(x.lines) for x in results)
            doc_lines = sum(len(p.lines) for p in doc_result.pages)
            print(f"engine pass {r}: {s1:.2f} s one by one, {s2:.2f} s read_document", file=sys.stderr)
    return [summary("engine, pages one by one (baseline)", one_by_one, len(pages), lines),
            summary("engine, read_document (pages concurrently)", whole, len(pages), doc_lines)]


def bench_service(pdf: bytes, repeats: int, replicas: int) -> dict:
    config = load_config()  # a fresh dict each call
    for d in config["applications"][0]["deployments"]:
        if d["name"] == "TextRecognizer":
            d.pop("num_replicas", None)
            d["autoscaling_config"] = {**d.get("autoscaling_config", {}), "min_replicas": replicas,
                                       "max_replicas": replicas}
    t0 = time.perf_counter()
    with served(config) as url:
        print(f"service ({replicas} recogniser replicas) started and ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        seconds, lines, renders = [], 0, []
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            resp = requests.post(f"{url}/v1/ocr", data=pdf, headers={"Content-Type": "application/pdf"}, timeout=600)
            s = time.perf_counter() - t0
            resp.raise_for_status()
            body = resp.json()
            lines = sum(len(p["results"]) for p in body["pages"])
            renders += [p["timings_ms"]["render"] for p in body["pages"]]
            if r:
                seconds.append(s)
            print(f"service x{replicas} pass {r}: {s:.2f} s, {lines} lines", file=sys.stderr)
        n = body["document"]["pages"]
    return summary(f"service, {replicas} recogniser replica{'s' if replicas > 1 else ''}", seconds, n, lines,
                   f"{statistics.mean(renders):.1f} ms")


def table(rows: list[dict], base: float) -> str:
    return "\n".join(md_table(["system", "pages/s", "vs baseline", "p50 document s", "max s", "lines read", "render/page"], (
        [r["system"], f"{r['pages/s']:.2f}", f"{r['pages/s'] / base:.2f}x", f"{r['p50 s']:.2f}", f"{r['max s']:.2f}",
         r["lines"], r["render"] or "-"] for r in rows)))


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pages", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--replicas", default="1,2", help="recogniser replica counts to run the service with")


def main(args: argparse.Namespace) -> int:
    dpi = AppArgs.model_validate(load_config()["applications"][0]["args"]).engine.documents.render_dpi
    images = page_images(args.pages)
    pdf = image_pdf([img for _, img in images], dpi=dpi, jpeg_quality=90)
    print(f"PDF: {args.pages} pages at {dpi} DPI, {len(pdf) / 1e6:.1f} MB, from "
          f"{', '.join(n for n, _ in images)}", file=sys.stderr)
    rows = bench_engine(pdf, args.repeats, dpi)
    for n in (int(x) for x in args.replicas.split(",")):
        rows.append(bench_service(pdf, args.repeats, n))
    print(f"{args.pages}-page PDF ({len(pdf) / 1e6:.1f} MB, {dpi} DPI), {args.repeats} timed passes per system\n")
    print(table(rows, rows[0]["pages/s"]))
    return 0
