"""What a request costs, and when admission refuses it (serve_app/http/policies/admission.py
holds the ledger): its size at the door (pixels from the image header, a
PDF's pages), the cost model learned online (seconds = base + per_mp x
megapixels + per_line x lines), the calibration of the
estimates and the decision (the drain rate: drain.py). No Ray import; the model and formulas are
described in serve_app/http/policies/admission.py."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from serve_app.flow.documents import open_document
from serve_app.ocr.image_header import png_dimensions
from serve_app.flow.upload import upload_of

# When a request's size cannot be read from its header (junk: the pipeline
# refuses it cheaply), it is costed as an image of this many pixels.
UNKNOWN_PIXELS = 1_000_000

# Decoding a TIFF page walks each strip or tile it is stored in: Pillow took
# 0.9 s for a 16 MP page of 65,536 tiles of 16 x 16 px here idle (0.18 s of
# directory set-up, 0.74 s decoding; Pillow 11, 2-core EPYC, 2026-12-07) and
# ~2.5 s beside other work (issue 61). A page's chunks past CHUNKS_FREE are
# priced at S_PER_CHUNK each, the loaded figure; an ordinary page (a strip
# per few rows, or 256 px tiles) is under it.
CHUNKS_FREE = 1024
S_PER_CHUNK = 40e-6


# -- size at the door ------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """What admission knows of a request before decoding it: pixels of one
    page (an image is one page; a document: its largest) and its pages,
    and for a document each page's own pixels and tiles (from its header:
    a TIFF's directories, PDFium's page sizes); the work the options add
    (extra tiles of a fine pass, a re-read of turned pages, a picture)."""

    pixels: int
    pages: int = 1
    tiles: int = 1  # detector calls per page (a long image's tiles)
    known: bool = True  # False: read from no header (costed as UNKNOWN_PIXELS)
    width: int = 0  # an image's (or an array's) pixels across and down, when read; 0 for documents
    height: int = 0
    page_pixels: tuple[int, ...] = ()  # a document's pages, each its own (empty: `pages` x `pixels`)
    page_tiles: tuple[int, ...] = ()  # (with page_pixels) each page's detector calls
    page_chunks: tuple[int, ...] = ()  # a TIFF's pages: the strips or tiles each is stored in (decode_seconds)
    extra_tiles: int = 0  # per page: the fine pass's tiles (options.limit_side_len), at most max_tiles
    orientation: bool = False  # turned pages are read twice (options.page_orientation)
    picture: bool = False  # a `visualize` picture is drawn
    model: Optional[str] = None  # the model set that reads it (options.model): its own cost model
    structure: bool = False  # document structure is read (options.structure, format markdown): layout and tables

    @property
    def megapixels(self) -> float:
        return self.pixels / 1e6

    def each_page(self) -> list[tuple[int, int]]:
        """(pixels, tiles) of every page."""
        if self.page_pixels:
            return list(zip(self.page_pixels, self.page_tiles or (1,) * len(self.page_pixels)))
        return [(self.pixels, self.tiles)] * self.pages

    @property
    def total_megapixels(self) -> float:
        return sum(px for px, _ in self.each_page()) / 1e6

    @property
    def decode_seconds(self) -> float:
        """What decoding its pages' strips or tiles costs past an ordinary page's (CHUNKS_FREE)."""
        return S_PER_CHUNK * sum(max(0, c - CHUNKS_FREE) for c in self.page_chunks)

    def with_options(self, options: Any) -> "Size":
        """This size as `options` (OcrOptions, or None) read it."""
        if options is None:
            return self
        from dataclasses import replace
        from serve_app.core.engine_config import PipelineOptions

        extra = 0
        side = getattr(options, "limit_side_len", None)
        if side and self.width and self.height and getattr(options, "det", True):
            cap = PipelineOptions().max_tiles
            extra = min(cap, math.ceil(self.width / side) * math.ceil(self.height / side)) - 1
        orient = getattr(options, "page_orientation", None)
        structure = bool(getattr(options, "structure", False)) or getattr(options, "format", None) == "markdown"
        return replace(self, extra_tiles=max(0, extra), structure=structure,
                       orientation=orient is not False and getattr(options, "det", True)
                       and getattr(options, "cls", None) is not False,
                       picture=bool(getattr(options, "visualize", False)),
                       model=getattr(options, "model", None))


def image_size(data: Any, documents: Any = None, header_bytes: int = 256 * 1024, options: Any = None) -> Size:
    """A request's Size from headers only: an encoded image's header (from
    its first `header_bytes`; a PNG's chunk headers walked, at most a few
    hundred), an array's shape, a document's every page (a PDF opened in a
    PDF worker, each page's size from PDFium without loading the page; a
    TIFF's directories; nothing rendered or decoded). An image whose header
    cannot be read is costed as UNKNOWN_PIXELS (the pipeline refuses it
    cheaply); a document that is bad (broken, encrypted, too many pages, a
    page without area, too long or over the pixel limit) raises its 4xx
    here, before it is priced. `options` (OcrOptions): the work they add."""
    try:
        upload = upload_of(data)
    except Exception:
        return Size(UNKNOWN_PIXELS, known=False).with_options(options)
    if documents is not None and upload.is_document:  # a PDF, a multi-page TIFF
        return document_size(bytes(upload.data), documents).with_options(options)
    return _image_size(upload, header_bytes).with_options(options)


def document_size(data: bytes, documents: Any) -> Size:
    """Every page's pixels (as read: a PDF page at the render DPI, within
    the page pixel limit) and tiles; the document's own error if it is bad."""
    with open_document(data, documents) as doc:
        sizes = doc.page_sizes()
        chunks = tuple(doc.page_chunks()) if doc.kind == "tiff" else ()
    pixels = tuple(w * h for w, h in sizes)
    return Size(max(pixels), len(sizes), max(_tiles(h, w) for w, h in sizes),
                page_pixels=pixels, page_tiles=tuple(_tiles(h, w) for w, h in sizes), page_chunks=chunks)


def _image_size(upload: Any, header_bytes: int) -> Size:
    try:
        data = upload.data
        if isinstance(data, np.ndarray):
            if data.ndim < 2:
                return Size(UNKNOWN_PIXELS, known=False)
            h, w = int(data.shape[0]), int(data.shape[1])
            return Size(max(1, h * w), tiles=_tiles(h, w), width=w, height=h)
        from PIL import Image

        if isinstance(data, (str, Path)):
            with open(data, "rb") as f:
                head = f.read(header_bytes)
        else:
            head = bytes(memoryview(data)[:header_bytes])
        found = png_dimensions(head)
        if found is None:
            with Image.open(io.BytesIO(head)) as img:
                found = img.size
        w, h = found
        return Size(max(1, w * h), tiles=_tiles(h, w), width=w, height=h)
    except Exception:
        return Size(UNKNOWN_PIXELS, known=False)


def _tiles(h: int, w: int) -> int:
    """Detector tiles of an h x w image with the default pipeline options
    and detector ladder (an estimate: admission does not see the engine's)."""
    from serve_app.core.engine_config import PipelineOptions
    from serve_app.ocr.tiling import tile_count

    return tile_count(h, w, PipelineOptions(), 1280) if h > 0 and w > 0 else 1


# -- the cost model ----------------------------------------------------------------


class CostModel:
    """seconds = base + per_mp * mp + per_line * lines, fitted online by
    exponentially weighted least squares (each observation's weight decays
    by `forget` per new one) over a prior given as pseudo-observations at a
    few typical sizes, which fade as real ones arrive; a small fixed ridge
    towards the prior keeps it solvable when every observation is the same
    image. Lines per megapixel: the decayed ratio of sums.

    A document is priced page by page, each from its own pixels and tiles.
    Options add: each fine-pass tile (s_per_tile, as a long image's), a
    picture (s_per_picture_mp of the page), and with page orientation on
    the share of pages read twice (turned), learned from answers (at least
    `min_turned`: a service never shown a turned page still prices some).
    Structure (options.structure) adds per page its layout
    (s_per_structure_page) and `tables_per_page` table regions at
    s_per_table each; an answer is drained at the table regions it had
    (read_cost), as lines are.

    Learning is bounded so that blank or adversarial pages cannot move it
    far: only answers that read text (at least one line) teach it, and a
    page's learned seconds are used within `drift` times of the prior's
    for its size, either way (a floor and a ceiling)."""

    # (megapixels, lines) of the prior's pseudo-observations: a word, a
    # receipt, a dense page, a photo.
    PRIOR_POINTS = ((0.02, 1.0), (0.3, 15.0), (1.0, 60.0), (3.0, 20.0))

    # An answer whose seconds are over FAR times (or under 1/FAR of) the
    # model's own estimate for it teaches nothing; the rest are clipped to
    # CLIP times of it.
    FAR = 10.0
    CLIP = 2.0

    def __init__(self, base_s: float, s_per_mp: float, s_per_line: float, lines_per_mp: float = 30.0,
                 forget: float = 0.97, ridge: float = 1e-3, s_per_tile: float = 0.0, drift: float = 4.0,
                 s_per_picture_mp: float = 0.05, min_turned: float = 0.1, s_per_structure_page: float = 0.0,
                 s_per_table: float = 0.0, tables_per_page: float = 1.0):
        self.prior = np.array([base_s, s_per_mp, s_per_line])
        self.prior_lines_per_mp = lines_per_mp
        self.s_per_tile = s_per_tile
        self.s_per_picture_mp = s_per_picture_mp
        self.s_per_structure_page, self.s_per_table, self.tables_per_page = s_per_structure_page, s_per_table, tables_per_page
        self.drift = drift
        self.forget = forget
        self.ridge = ridge * np.eye(3)
        self.xx = np.zeros((3, 3))
        self.xy = np.zeros(3)
        for mp, lines in self.PRIOR_POINTS:
            x = np.array([1.0, mp, lines])
            self.xx += np.outer(x, x)
            self.xy += x * float(x @ self.prior)
        self.lines_sum = lines_per_mp
        self.mp_sum = 1.0
        self.min_turned = min_turned
        self.turned_sum = min_turned * 10  # as if 10 pages were seen, min_turned of them turned
        self.pages_sum = 10.0
        self.observed = 0
        self.theta = self.prior.copy()

    def lines_per_mp(self) -> float:
        return self.lines_sum / self.mp_sum

    def _read_seconds(self, theta: np.ndarray, lines_per_mp: float, mp: float) -> float:
        base, per_mp, per_line = theta
        return float(base + per_mp * mp + per_line * lines_per_mp * mp)

    def turned_share(self) -> float:
        return min(1.0, max(self.min_turned, self.turned_sum / self.pages_sum))

    def page_seconds(self, pixels: int, tiles: int, size: Size) -> float:
        mp = pixels / 1e6
        learned = self._read_seconds(self.theta, self.lines_per_mp(), mp)
        prior = self._read_seconds(self.prior, self.prior_lines_per_mp, mp)
        read = min(max(learned, prior / self.drift), prior * self.drift)  # the drift bound: a floor and a ceiling
        read += self.s_per_tile * (max(0, tiles - 1) + size.extra_tiles)
        if size.orientation:
            read *= 1.0 + self.turned_share()
        if size.picture:
            read += self.s_per_picture_mp * mp
        if size.structure:
            read += self.s_per_structure_page + self.s_per_table * self.tables_per_page
        return max(0.01, read)

    def estimate(self, size: Size) -> float:
        """Seconds of work of a request of this size, alone (at least 10 ms a
        page), a TIFF's decoding of many strips or tiles included."""
        return sum(self.page_seconds(px, tiles, size) for px, tiles in size.each_page()) + size.decode_seconds

    def read_cost(self, size: Size, cost_s: float, lines: int, tables: int = 0) -> float:
        """A request priced at `cost_s` at the door, re-priced from what was
        detected: the lines it read over (or under) the lines its pixels
        were priced for, at the learned seconds a line, and with structure
        the table regions it had over (or under) those priced. A page of
        1,000 lone letters priced from its pixels as ~100 lines is drained
        as 1,000 (what the drain rate is credited with)."""
        expected_lines = self.lines_per_mp() * size.total_megapixels
        cost = cost_s + float(self.theta[2]) * (lines - expected_lines)
        if size.structure:
            cost += self.s_per_table * (tables - self.tables_per_page * size.pages)
        return max(0.01, cost)

    def observe_turned(self, turned: int, pages: int) -> None:
        """Of `pages` read with page orientation on, `turned` were read twice."""
        if pages > 0:
            self.turned_sum = self.forget * self.turned_sum + turned
            self.pages_sum = self.forget * self.pages_sum + pages

    def observe(self, size: Size, lines: int, seconds: float) -> None:
        """One request (one image) that ran alone: its size, the lines it
        read and its seconds (an image read twice is not one read's measure)."""
        if (size.pages != 1 or size.tiles != 1 or size.extra_tiles or size.picture or size.structure or not size.known
                or not math.isfinite(seconds) or seconds <= 0 or lines < 1):
            return  # lines < 1: a blank page is no measure of what a page with text costs
        mp = size.megapixels
        x = np.array([1.0, mp, float(lines)])
        predicted = max(0.01, float(x @ self.theta))
        if not predicted / self.FAR <= seconds <= predicted * self.FAR:
            return  # implausible for its size: a stall, or a hostile input, not a measure of the service
        seconds = min(max(seconds, predicted / self.CLIP), predicted * self.CLIP)
        self.xx = self.forget * self.xx + np.outer(x, x)
        self.xy = self.forget * self.xy + x * seconds
        self.lines_sum = self.forget * self.lines_sum + lines
        self.mp_sum = self.forget * self.mp_sum + mp
        theta = np.linalg.solve(self.xx + self.ridge, self.xy + self.ridge @ self.prior)
        self.theta = np.maximum(theta, 0.0)  # a negative coefficient (noise) would make some sizes cost nothing
        self.observed += 1

    def snapshot(self) -> dict[str, float]:
        base, per_mp, per_line = self.theta
        return {"base_s": round(float(base), 4), "s_per_mp": round(float(per_mp), 4),
                "s_per_line": round(float(per_line), 5), "lines_per_mp": round(self.lines_per_mp(), 2),
                "turned_share": round(self.turned_share(), 3), "observed": self.observed}


@dataclass(frozen=True)
class Decision:
    admit: bool
    expected_s: float  # seconds until this request is expected to finish
    reason: Optional[str] = None  # "deadline" | "cost_bound" when refused
    retry_after_s: int = 0


def retry_after(excess_s: float, rate: Optional[float], default_s: int, max_s: int) -> int:
    """Seconds until `excess_s` of work has drained at `rate` (rounded up,
    within 1..max_s); `default_s` while no rate is measured."""
    if rate is None or rate <= 0:
        return default_s
    return int(min(max_s, max(1, math.ceil(excess_s / rate))))


def expected_seconds(queued_s: float, own_s: float, rate: Optional[float], others: int,
                     slowdown: float = 1.0) -> float:
    """When a request of `own_s` seconds of work is expected to finish,
    `others` requests holding `queued_s` being ahead of it, the service
    draining `rate` seconds of work per second (None: not measured). The
    larger of: its own work; the ledger drained first (a FIFO service); its
    own work served at a 1/(others + 1) share of the rate (the recogniser
    serves the requests it holds in turn, and admission keeps about as
    many in flight while this one runs, so a large request among many
    small ones is slowed by those admitted after it). Times `slowdown`,
    the measured bias of these estimates (Calibration)."""
    if rate is None or rate <= 0:
        return own_s * slowdown
    return slowdown * max(own_s, (queued_s + own_s) / rate, own_s * (others + 1) / rate)


def decide(queued_s: float, own_s: float, rate: Optional[float], time_left_s: Optional[float],
           max_queued_s: float, deadline_share: float, default_retry_s: int = 1, max_retry_s: int = 30,
           others: int = 0, slowdown: float = 1.0, max_request_s: float = math.inf,
           held_s: Optional[float] = None) -> Decision:
    """Admit a request of `own_s` seconds of work to a ledger of `queued_s`
    still ahead of it (`others` requests), the service draining `rate`
    seconds of work per second (None: not yet measured), `time_left_s`
    before its deadline (None: no deadline)? Never one over max_request_s,
    even alone. `held_s`: the ledger's whole cost, which the bound
    max_queued_s counts (default queued_s)."""
    held_s = queued_s if held_s is None else held_s
    if own_s > max_request_s:
        return Decision(False, expected_seconds(queued_s, own_s, rate, others, slowdown), "too_big", max_retry_s)
    if held_s <= 0:
        return Decision(True, expected_seconds(0.0, own_s, rate, 0, slowdown))
    expected = expected_seconds(queued_s, own_s, rate, others, slowdown)
    if time_left_s is not None:
        budget = deadline_share * time_left_s
        if own_s * slowdown > budget:  # too big for its deadline even alone: wait for an empty ledger
            return Decision(False, expected, "deadline", retry_after(queued_s, rate, default_retry_s, max_retry_s))
        if expected > budget:
            # Work to drain before it fits: the ledger down to what the budget allows ahead of it.
            excess = queued_s + own_s - budget * (rate or 0.0) / slowdown
            return Decision(False, expected, "deadline", retry_after(excess, rate, default_retry_s, max_retry_s))
    if held_s + own_s > max_queued_s:
        excess = held_s + own_s - max_queued_s
        return Decision(False, expected, "cost_bound", retry_after(excess, rate, default_retry_s, max_retry_s))
    return Decision(True, expected)


class Calibration:
    """The bias of the expected finish times, measured: a running estimate
    of a high quantile (`q`, 0.95) of actual / expected seconds over
    answered requests, and over late ones (504) at least the time they were
    given over their expectation (they did not finish in it). Used as a
    factor of 1 to `cap` on the next estimates, so that admission keeps
    most of the answers within their deadlines whatever the model misses
    (stochastic approximation: up by step x q when above, down by step x
    (1 - q) when below)."""

    def __init__(self, q: float = 0.95, step: float = 0.05, cap: float = 3.0):
        self.q, self.step, self.cap = q, step, cap
        self.value = 1.0

    def observe(self, ratio: float) -> None:
        if not math.isfinite(ratio) or ratio <= 0:
            return
        if ratio > self.value:
            self.value += self.step * self.q
        else:
            self.value -= self.step * (1 - self.q)
        self.value = min(self.cap, max(0.5, self.value))

    @property
    def factor(self) -> float:
        return min(self.cap, max(1.0, self.value))
