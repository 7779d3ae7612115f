"""1-bit pages (faxes, bilevel scans): how much of a page's text survives
being saved as 1 bit, read as a 1-bit G4 TIFF (decode smooths it back to
gray, serve_app.ocr.decode.BILEVEL_SIGMA) against the same pixels sent as
an 8-bit PNG of 0s and 255s (read as they are: the baseline, as 1-bit pages
were read before). One in-process engine, the default config.

    flock /tmp/ray-tests.lock .venv/bin/python -m load_tests documents bilevel [--json F]

Sources: four made pages (harness/pages.py, their truth as labels) and five
peer photos (their gray reading as labels). Each is made 1-bit three ways:
a threshold at 128 (a text-mode fax), Otsu's threshold, and PIL's
convert("1") (Floyd-Steinberg dithering, as a photo-mode fax). Table:
character errors over label characters (serve_app-independent matching,
harness.peer.label_errors), lines read, and the median read time."""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from harness.pages import made_pages
from harness.peer import PEER, label_errors
from load_tests.cli import standalone  # noqa: E402

PHOTOS = ("rapidocr_en.jpg", "mmocr_wildreceipt_1.jpeg", "paddleocr_00018069.jpg", "paddleocr_00006737.jpg",
          "paddleocr_11.jpg")


def one_bit(gray: np.ndarray, how: str) -> Image.Image:
    if how == "threshold 128":
        return Image.fromarray(np.where(gray > 128, 255, 0).astype(np.uint8)).convert("1", dither=Image.NONE)
    if how == "otsu":
        return Image.fromarray(cv2.threshold(gray, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)[1]).convert(
            "1", dither=Image.NONE)
    return Image.fromarray(gray).convert("1")  # Floyd-Steinberg


def encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    if fmt == "tiff":
        img.save(buf, format="TIFF", compression="group4", dpi=(200, 200))
    else:
        img.convert("L").save(buf, format="PNG")
    return buf.getvalue()


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--json", help="write the figures here")


def main(args: argparse.Namespace) -> int:
    from serve_app.engine import OcrEngine

    sources = [(p.name, p.image[..., 0], list(p.truth)) for p in made_pages()[:4]]
    sources += [(n, np.asarray(Image.open(PEER / n).convert("L")), None) for n in PHOTOS]
    kinds = ("threshold 128", "otsu", "dithered")
    ways = (("as 8-bit 0/255 PNG (before)", "png"), ("as 1-bit G4 TIFF (smoothed)", "tiff"))
    tally = {(k, f): [0, 0, 0, []] for k in kinds for _, f in ways}  # errors, chars, lines, seconds
    gray_tally = [0, 0, 0]
    t0 = time.perf_counter()
    with OcrEngine() as engine:
        engine.warm()
        for name, gray, truth in sources:
            up = [line.text for line in engine.read(np.ascontiguousarray(gray)).lines]
            labels = truth or up
            e, c = label_errors(up, labels)
            gray_tally[0] += e
            gray_tally[1] += c
            gray_tally[2] += len(up)
            row = []
            for kind in kinds:
                img = one_bit(gray, kind)
                for _, fmt in ways:
                    data = encode(img, fmt)
                    t = time.perf_counter()
                    got = [line.text for line in engine.read(data).lines]
                    s = time.perf_counter() - t
                    e, c = label_errors(got, labels)
                    cell = tally[(kind, fmt)]
                    cell[0] += e
                    cell[1] += c
                    cell[2] += len(got)
                    cell[3].append(s)
                    row.append(f"{kind}/{fmt} {e}/{c}")
            print(f"{name}: " + ", ".join(row), flush=True)
    print("\n| 1-bit page made by | read | CER | lines | median s per page |")
    print("|---|---|---:|---:|---:|")
    print(f"| (the gray page) | 8-bit | {gray_tally[0] / gray_tally[1]:.4f} | {gray_tally[2]} | |")
    out = {"gray": gray_tally}
    for kind in kinds:
        for label, fmt in ways:
            e, c, n, secs = tally[(kind, fmt)]
            print(f"| {kind} | {label} | {e / c:.4f} | {n} | {statistics.median(secs):.3f} |")
            out[f"{kind}/{fmt}"] = {"errors": e, "chars": c, "lines": n, "median_s": statistics.median(secs)}
    print(f"\n({time.perf_counter() - t0:.0f} s; {len(sources)} pages)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(standalone(__name__))
