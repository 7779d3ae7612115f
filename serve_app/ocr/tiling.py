"""Long images read in overlapping tiles: a long receipt, a full-page
screenshot of a web page, a panorama of a shop sign.

Scaled as a whole onto the detector's largest input (1280 px on the long
side by default), a 1600x7200 receipt scan would become 284x1280 and its
20 px text 3.5 px: the detector finds almost nothing (31 of ~310 lines on
six stacked WildReceipt scans). Instead such an image is cut along its long
axis into overlapping tiles about as long as its short side (at least the
top rung), each tile is detected at its own scale like a normal photo, the
boxes are moved back into the whole image, and the pieces of one text line
that two neighbouring tiles both saw (in their overlap) are merged into one
box. Crops are then cut from the whole working image, so a line that
crosses a seam is still read in one piece.

Pure numpy/OpenCV: no Ray, no models (unit-tested on synthetic boxes)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import cv2
import numpy as np

from serve_app.core.engine_config import PipelineOptions
from serve_app.ocr.db_postprocess import order_clockwise


@dataclass(frozen=True)
class Tile:
    """A window of the working image: rows y0:y1, columns x0:x1."""

    y0: int
    y1: int
    x0: int
    x1: int


def wants_tiles(h: int, w: int, opts: PipelineOptions) -> bool:
    """Whether an h x w image (as decoded) is read in tiles: its long side
    is over `tile_min_long` and over `tile_aspect` times its short side."""
    if not opts.tile_aspect:
        return False
    long, short = max(h, w), max(1, min(h, w))
    return long > opts.tile_min_long and long / short > opts.tile_aspect


def tiled_scale(h: int, w: int, opts: PipelineOptions) -> float:
    """The scale (<= 1) of the working image of a tiled read: the short side
    within max_side_len (what bounds an untiled image's long side) and the
    whole within tile_max_pixels."""
    ratio = 1.0
    if opts.max_side_len and min(h, w) > opts.max_side_len:
        ratio = opts.max_side_len / min(h, w)
    if h * w * ratio * ratio > opts.tile_max_pixels:
        ratio = math.sqrt(opts.tile_max_pixels / (h * w))
    return min(1.0, ratio)


def plan_tiles(h: int, w: int, tile_long: int, overlap: float) -> list[Tile]:
    """Tiles along the long axis, each `tile_long` long (or the whole side),
    neighbours sharing at least `overlap` of a tile's length (at least 32
    px), spread evenly from one end to the other."""
    vertical = h >= w
    length = h if vertical else w
    size = min(length, max(32, tile_long))
    ov = max(32, int(round(overlap * size)))
    if size >= length:
        starts = [0]
    else:
        n = max(2, math.ceil((length - ov) / max(1, size - ov)))
        step = (length - size) / (n - 1)
        starts = [int(round(k * step)) for k in range(n)]
    if vertical:
        return [Tile(s, s + size, 0, w) for s in starts]
    return [Tile(0, h, s, s + size) for s in starts]


def plan_grid(h: int, w: int, tile: int, overlap: float) -> list[Tile]:
    """Tiles of at most tile x tile over both sides, overlapping as
    plan_tiles does along each side, row by row."""
    def spans(length: int) -> list[tuple[int, int]]:
        # up to 5% over a tile's size: one tile (the detector scales it a little)
        if length <= 1.05 * tile:
            return [(0, length)]
        return [(t.y0, t.y1) for t in plan_tiles(length, 1, tile, overlap)]

    rows, cols = spans(h), spans(w)
    return [Tile(y0, y1, x0, x1) for y0, y1 in rows for x0, x1 in cols]


def _grid_side(length: int, tile: int, overlap: float) -> int:
    """How many tiles plan_grid puts along a side of `length` (counted, not
    listed: a tiny tile on a large page would be millions)."""
    if length <= 1.05 * tile:
        return 1
    size = min(length, max(32, tile))
    ov = max(32, int(round(overlap * size)))
    if size >= length:
        return 1
    return max(2, math.ceil((length - ov) / max(1, size - ov)))


def grid_count(h: int, w: int, tile: int, overlap: float) -> int:
    """len(plan_grid(h, w, tile, overlap)), without planning it."""
    return _grid_side(h, tile, overlap) * _grid_side(w, tile, overlap)


def tile_long_side(h: int, w: int, top_rung: int) -> int:
    """A tile's length along the long axis: the image's short side (square
    tiles: each is detected at the scale of a normal photo of that width),
    but at least the detector's top rung (a narrow banner is cut into
    pieces the detector takes whole)."""
    return max(min(h, w), top_rung)


def _overlap_pairs(tiles: list[Tile]) -> list[tuple[int, int, tuple[int, int, int, int]]]:
    """(k, m, band) of every two tiles k < m that overlap, band = their
    shared rectangle (x0, y0, x1, y1). At most max_tiles**2 / 2 checks."""
    pairs = []
    for k, a in enumerate(tiles):
        for m in range(k + 1, len(tiles)):
            b = tiles[m]
            band = (max(a.x0, b.x0), max(a.y0, b.y0), min(a.x1, b.x1), min(a.y1, b.y1))
            if band[2] > band[0] and band[3] > band[1]:
                pairs.append((k, m, band))
    return pairs


def _clipped(rects: np.ndarray, band: tuple) -> np.ndarray:
    """(N, 4) rectangles clipped to the band (empty ones have x1 <= x0 or y1 <= y0)."""
    out = rects.copy()
    out[:, 0] = np.maximum(out[:, 0], band[0])
    out[:, 1] = np.maximum(out[:, 1], band[1])
    out[:, 2] = np.minimum(out[:, 2], band[2])
    out[:, 3] = np.minimum(out[:, 3], band[3])
    return out


def _cells(r: np.ndarray, cell: float) -> Optional[list[tuple[int, int]]]:
    """The grid cells (of side `cell`) rectangle r = (x0, y0, x1, y1)
    touches, or None for more than _MAX_CELLS of them (a box compared with
    every box of the other side instead)."""
    cx0, cy0 = int(r[0] // cell), int(r[1] // cell)
    cx1, cy1 = int(r[2] // cell), int(r[3] // cell)
    if (cx1 - cx0 + 1) * (cy1 - cy0 + 1) > _MAX_CELLS:
        return None
    return [(cx, cy) for cy in range(cy0, cy1 + 1) for cx in range(cx0, cx1 + 1)]


_MAX_CELLS = 256


def _iou_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of rectangle a (4,) with each of b (M, 4) (both already clipped)."""
    ix = np.clip(np.minimum(a[2], b[:, 2]) - np.maximum(a[0], b[:, 0]), 0, None)
    iy = np.clip(np.minimum(a[3], b[:, 3]) - np.maximum(a[1], b[:, 1]), 0, None)
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) - inter
    return inter / np.maximum(union, 1e-9)


def _band_matches(ra: np.ndarray, rb: np.ndarray, band: tuple, min_iou: float) -> list[tuple[int, int]]:
    """(i, j) of rectangles ra[i], rb[j] whose parts inside the band have
    IoU >= min_iou. A grid index over the band (cells about two typical
    box heights, at most 64 a side) gives each box only the boxes of its
    own cells to compare with: linear in the boxes for text, whose lines
    do not pile up on one another (all pairs, 66 tiles x 150 boxes, took
    ~50 s)."""
    ca, cb = _clipped(ra, band), _clipped(rb, band)
    ia = np.flatnonzero((ca[:, 2] > ca[:, 0]) & (ca[:, 3] > ca[:, 1]))
    ib = np.flatnonzero((cb[:, 2] > cb[:, 0]) & (cb[:, 3] > cb[:, 1]))
    if not len(ia) or not len(ib):
        return []
    sides = np.concatenate([np.minimum(ca[ia, 2] - ca[ia, 0], ca[ia, 3] - ca[ia, 1]),
                            np.minimum(cb[ib, 2] - cb[ib, 0], cb[ib, 3] - cb[ib, 1])])
    span = max(band[2] - band[0], band[3] - band[1])
    cell = max(2.0 * float(np.median(sides)), span / 64.0, 1.0)
    index: dict[tuple[int, int], list[int]] = {}
    big_b: list[int] = []  # boxes over _MAX_CELLS cells: candidates of every box
    for j in ib:
        cells = _cells(cb[j], cell)
        if cells is None:
            big_b.append(int(j))
        for c in cells or ():
            index.setdefault(c, []).append(int(j))
    out = []
    for i in ia:
        cells = _cells(ca[i], cell)
        if cells is None:
            near = [int(j) for j in ib]
        else:
            near = sorted({j for c in cells for j in index.get(c, ())}.union(big_b))
        if not near:
            continue
        iou = _iou_rows(ca[i], cb[near])
        out.extend((int(i), near[n]) for n in np.flatnonzero(iou >= min_iou))
    return out


def merge_tile_boxes(tiles: list[Tile], boxes: list[np.ndarray], min_iou: float = 0.5) -> np.ndarray:
    """One set of boxes (N,4,2) in whole-image coordinates from each tile's
    (already moved into whole-image coordinates). Two boxes of overlapping
    tiles that cover the same part of their overlap (IoU >= min_iou of their
    parts inside it) are one text line seen twice, or cut at a seam: they
    become one box, the minimum-area rectangle around both (chains too: a
    line across three tiles is one box). Tiles may form a strip or a grid."""
    per_tile = [np.asarray(bs, dtype=np.float32).reshape(-1, 4, 2) for bs in boxes]
    if not sum(len(b) for b in per_tile):
        return np.zeros((0, 4, 2), dtype=np.float32)
    flat = np.concatenate(per_tile)
    starts = np.cumsum([0] + [len(b) for b in per_tile])
    rects = np.concatenate([flat.min(axis=1), flat.max(axis=1)], axis=1).astype(np.float64)
    parent = list(range(len(flat)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for k, m, band in _overlap_pairs(tiles):
        a0, b0 = int(starts[k]), int(starts[m])
        for i, j in _band_matches(rects[a0:starts[k + 1]], rects[b0:starts[m + 1]], band, min_iou):
            parent[find(b0 + j)] = find(a0 + i)
    groups: dict[int, list[int]] = {}
    for i in range(len(flat)):
        groups.setdefault(find(i), []).append(i)
    out = []
    for members in groups.values():
        if len(members) == 1:
            out.append(flat[members[0]])
            continue
        points = flat[members].reshape(-1, 2).astype(np.float32)
        out.append(order_clockwise(cv2.boxPoints(cv2.minAreaRect(points))).astype(np.float32))
    return np.stack(out).astype(np.float32)


def tiled_plan(oh: int, ow: int, opts: PipelineOptions, top_rung: int) -> tuple[float, int, int, list[Tile]]:
    """(scale, working h, working w, tiles) of a long image's tiled read:
    tiled_scale, lowered until the tiles are at most opts.max_tiles (the
    image is read at a lower resolution rather than in hundreds of tiles)."""
    ratio = tiled_scale(oh, ow, opts)
    for _ in range(32):
        h, w = max(1, int(round(oh * ratio))), max(1, int(round(ow * ratio)))
        tiles = plan_tiles(h, w, tile_long_side(h, w, top_rung), opts.tile_overlap)
        if len(tiles) <= opts.max_tiles:
            break
        ratio *= 0.97 * opts.max_tiles / len(tiles)
    return ratio, h, w, tiles


def tile_count(h: int, w: int, opts: PipelineOptions, top_rung: int) -> int:
    """Detector calls an h x w image costs: its tiles, or 1."""
    if not wants_tiles(h, w, opts):
        return 1
    return len(tiled_plan(h, w, opts, top_rung)[3])


def prepare_tiled(img: np.ndarray, opts: PipelineOptions, top_rung: int):
    """(working image, its scale factors (original / working) as (sx, sy),
    tiles) for a long image (wants_tiles), at most opts.max_tiles tiles."""
    oh, ow = img.shape[:2]
    ratio, _, _, _ = tiled_plan(oh, ow, opts, top_rung)
    work = img
    if ratio < 1.0:
        work = cv2.resize(img, (max(1, int(round(ow * ratio))), max(1, int(round(oh * ratio)))),
                          interpolation=cv2.INTER_AREA)
    h, w = work.shape[:2]
    return work, (ow / w, oh / h), plan_tiles(h, w, tile_long_side(h, w, top_rung), opts.tile_overlap)


def box_heights(boxes: np.ndarray) -> np.ndarray:
    """Each box's height: its shorter side (a line's height, whichever way it runs)."""
    b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4, 2)
    return np.minimum(np.linalg.norm(b[:, 0] - b[:, 1], axis=1), np.linalg.norm(b[:, 0] - b[:, 3], axis=1))


def grid_scale(oh: int, ow: int, scale: float, opts: PipelineOptions, tile: int) -> float:
    """`scale` (of an oh x ow original), lowered until its grid of tiles of
    at most tile x tile (plan_grid) is at most opts.max_tiles: a small
    detector input (limit_side_len 640) on a 40 MP page would otherwise
    be 64-66 tiles."""
    for _ in range(32):
        h, w = max(1, int(round(oh * scale))), max(1, int(round(ow * scale)))
        n = grid_count(h, w, tile, opts.tile_overlap)
        if n <= opts.max_tiles:
            break
        scale *= 0.97 * math.sqrt(opts.max_tiles / n)
    else:  # not reached in 32 steps: the whole image in one tile
        scale = min(scale, tile / max(oh, ow, 1))
    return scale


def fine_tiles_at_most(h: int, w: int, opts: PipelineOptions, tile: int) -> int:
    """The most detector calls the second pass (finer_scale) can add to an
    h x w image: its grid at the largest scale allowed, within max_tiles;
    0 when it never runs (fine_text_px 0)."""
    if not opts.fine_text_px:
        return 0
    scale = grid_scale(h, w, min(opts.fine_max_upscale, math.sqrt(opts.tile_max_pixels / max(1, h * w))), opts, tile)
    return grid_count(max(1, int(round(h * scale))), max(1, int(round(w * scale))), tile, opts.tile_overlap)


def finer_scale(boxes: np.ndarray, det_scale: float, orig_hw: tuple[int, int], opts: PipelineOptions,
                tile: int = 0) -> float:
    """Small text on a large image (a dense scan, a newspaper page): the
    scale (of the original) to detect it again at, in a grid of tiles, or 0
    for no second pass. `boxes` are the first pass's, in the original's
    coordinates; `det_scale` is the detector's input size over the
    original's. Only when the detector saw the image shrunk (det_scale under
    fine_max_scale), found at least fine_min_boxes boxes, and their median
    height in its input was under fine_text_px: then the scale that brings
    that median to fine_target_px, at most fine_max_upscale times the
    original, within tile_max_pixels and (with `tile`, the grid's tile
    side) within max_tiles tiles (grid_scale), if it is at least 1.25
    times det_scale."""
    if not opts.fine_text_px or len(boxes) < opts.fine_min_boxes or det_scale >= opts.fine_max_scale:
        return 0.0
    median = float(np.median(box_heights(boxes)))
    if median <= 0 or median * det_scale >= opts.fine_text_px:
        return 0.0
    h, w = orig_hw
    scale = min(opts.fine_max_upscale, opts.fine_target_px / median, math.sqrt(opts.tile_max_pixels / (h * w)))
    if tile:
        scale = grid_scale(h, w, scale, opts, tile)
    return scale if scale >= det_scale * 1.25 else 0.0


def prepare_grid(img: np.ndarray, scale: float, opts: PipelineOptions, tile: int):
    """(working image at `scale` of the original (lowered to at most
    max_tiles tiles: grid_scale), its scale factors (original / working) as
    (sx, sy), a grid of tiles of at most tile x tile)."""
    oh, ow = img.shape[:2]
    scale = grid_scale(oh, ow, scale, opts, tile)
    work = img
    if scale != 1.0:
        work = cv2.resize(img, (max(1, int(round(ow * scale))), max(1, int(round(oh * scale)))),
                          interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    h, w = work.shape[:2]
    return work, (ow / w, oh / h), plan_grid(h, w, tile, opts.tile_overlap)
