"""Benchmark: bounded work per image (issue 38): the tile merge (a grid
index against all pairs, same input), the layout of a page of nested
columns, and the byte walks of floods (check_structure against Pillow
walking the same file). No Ray, no models.

    .venv/bin/python -m load_tests hostile bounded-work [--smoke]

Each row: what, its size, seconds (median of --repeat), and for the merge
and the walks the baseline measured in the same run and the ratio."""

from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np


def _timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001  a refusal is the answer being measured
            out = e
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _band_iou(a: tuple, b: tuple, band: tuple) -> float:
    def clip(r):
        return max(r[0], band[0]), max(r[1], band[1]), min(r[2], band[2]), min(r[3], band[3])

    ca, cb = clip(a), clip(b)
    area = lambda r: max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])  # noqa: E731
    ia, ib = area(ca), area(cb)
    if ia <= 0 or ib <= 0:
        return 0.0
    inter = area((max(ca[0], cb[0]), max(ca[1], cb[1]), min(ca[2], cb[2]), min(ca[3], cb[3])))
    return inter / (ia + ib - inter)


def _all_pairs(tiles, boxes, min_iou=0.5) -> int:
    """The merge's groups counted as merge_tile_boxes did before its index
    (the baseline): every box of each overlapping tile pair against every
    other, through the same band IoU."""
    flat = [b for bs in boxes for b in bs]
    owner = [k for k, bs in enumerate(boxes) for _ in bs]
    rect = [(float(b[:, 0].min()), float(b[:, 1].min()), float(b[:, 0].max()), float(b[:, 1].max())) for b in flat]
    parent = list(range(len(flat)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    by_tile: dict[int, list[int]] = {}
    for i, k in enumerate(owner):
        by_tile.setdefault(k, []).append(i)
    for k, a in enumerate(tiles):
        for m in range(k + 1, len(tiles)):
            b = tiles[m]
            band = (max(a.x0, b.x0), max(a.y0, b.y0), min(a.x1, b.x1), min(a.y1, b.y1))
            if band[2] <= band[0] or band[3] <= band[1]:
                continue
            for i in by_tile.get(k, []):
                for j in by_tile.get(m, []):
                    if _band_iou(rect[i], rect[j], band) >= min_iou:
                        parent[find(j)] = find(i)
    return len({find(i) for i in range(len(flat))})


def merge_rows(smoke: bool, repeat: int) -> list[tuple]:
    from serve_app.ocr.tiling import merge_tile_boxes, plan_grid

    h, w = (2000, 1500) if smoke else (7300, 5475)
    per_tile = 30 if smoke else 150
    tiles = plan_grid(h, w, 640, 0.15)
    rng = np.random.default_rng(0)
    boxes = []
    for t in tiles:
        bs = []
        for _ in range(per_tile):
            y, x, bw = rng.uniform(t.y0, t.y1 - 12), rng.uniform(t.x0, t.x1 - 100), rng.uniform(30, 300)
            bs.append([[x, y], [x + bw, y], [x + bw, y + 12], [x, y + 12]])
        boxes.append(np.array(bs, np.float32))
    new_s, merged = _timed(lambda: merge_tile_boxes(tiles, boxes), repeat)
    old_s, groups = _timed(lambda: _all_pairs(tiles, boxes), 1)
    what = f"tile merge, {len(tiles)} tiles x {per_tile} boxes"
    return [(what, f"{len(merged)} boxes (all pairs: {groups})", new_s, old_s)]


def layout_rows(smoke: bool, repeat: int) -> list[tuple]:
    from serve_app.ocr.layout import layout_blocks

    rows = []
    for levels in ((50, 260) if smoke else (100, 200, 260, 1000)):
        lines = []
        for k in range(levels):  # a title over [a line | the same again], `levels` deep
            x, y = k * 120, k * 30
            lines.append([[x, y], [x + (levels - k) * 120 + 100, y], [x + (levels - k) * 120 + 100, y + 20],
                          [x, y + 20]])
            lines.append([[x, y + 30], [x + 100, y + 30], [x + 100, y + 50], [x, y + 50]])
        boxes = np.array(lines, np.float32)
        s, blocks = _timed(lambda: layout_blocks(boxes), repeat)
        rows.append((f"layout, {levels} nested levels", f"{2 * levels} lines, {len(blocks)} blocks", s, None))
    return rows


def flood_rows(smoke: bool, repeat: int) -> list[tuple]:
    from PIL import Image

    from harness.hostile import chunks_after_idat_png, empty_idats_png, gif_frames, jpeg_comments
    from serve_app.ocr.image_header import check_structure

    mib = 1 if smoke else 19
    floods = [(f"PNG, {mib} MiB of chunks after IDAT", chunks_after_idat_png(mib)),
              (f"PNG, {mib} MiB of empty IDATs", empty_idats_png(mib)),
              (f"GIF, {50_000 if smoke else 1_000_000:,} frames", gif_frames(50_000 if smoke else 1_000_000)),
              (f"JPEG, {mib} MiB of empty comments", jpeg_comments(mib))]

    def pillow(data: bytes):  # what decoding walked before: open, first frame, every frame counted
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return getattr(img, "n_frames", 1)

    rows = []
    for what, data in floods:
        s, out = _timed(lambda: check_structure(data), repeat)
        base, _ = _timed(lambda: pillow(data), 1)
        rows.append((what, type(out).__name__ if isinstance(out, Exception) else f"{out} frames", s, base))
    return rows


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true", help="small inputs (seconds)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each new path (median)")


def main(args: argparse.Namespace) -> None:
    rows = merge_rows(args.smoke, args.repeat) + layout_rows(args.smoke, args.repeat) + \
        flood_rows(args.smoke, args.repeat)
    print("| what | outcome | seconds | baseline (s) | ratio |")
    print("|---|---|---|---|---|")
    for what, outcome, s, base in rows:
        ratio = f"{base / s:.0f}x" if base and s > 0 else ""
        shown = f"{base:.2f}" if base is not None else ""
        print(f"| {what} | {outcome} | {s:.3f} | {shown} | {ratio} |")


def smoke(args: argparse.Namespace) -> None:
    """Every row at its smallest size, once (main under --smoke)."""
    main(args)


if __name__ == "__main__":
    import sys

    from load_tests.cli import standalone

    sys.exit(standalone(__name__))
