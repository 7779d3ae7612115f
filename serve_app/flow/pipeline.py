"""The OCR pipeline, written once: decode -> detect -> crop -> classify ->
recognise -> assemble, over three stage callables.

The in-process engine gives it its local predictors; the Serve pipeline
deployment gives it deployment handles. Same code path, so the service
answers what the engine answers by construction. No Ray import."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, Union

import numpy as np

from serve_app.core.engine_config import EngineConfig, ImageLimits
from serve_app.flow.documents import PdfFile, open_document_async
from serve_app.core.errors import BadImage, BadRequest, PageOverBudget, TooLarge
from serve_app.core.lanes import BULK, PriorityGate
from serve_app.core.request_options import OcrOptions
from serve_app.core.request_context import RequestContext
from serve_app.core.results import Direction, DocumentResult, OcrResult, PageResult, Recognition, TextLine
from serve_app.flow.assemble import all_or_none, assemble, crop_lines, whole_image_box
from serve_app.flow.structure_step import read_structure, text_layer_words
from serve_app.ocr.crop import is_vertical
from serve_app.ocr.visualize import draw_result
from serve_app.ocr.decode import array_to_bgr, check_aspect, decode_image, frame_count
from serve_app.ocr.det_preprocess import Geometry, boxes_to_original, det_layout, prepare_image
from serve_app.ocr.direction import apply_direction, is_flipped
from serve_app.ocr.layout import arrange
from serve_app.ocr.orientation import OrientationParams, decide, line_vote, quality, turn_lines, upright
from serve_app.ocr.tiling import Tile, finer_scale, merge_tile_boxes, prepare_grid, prepare_tiled, wants_tiles
from serve_app.flow.upload import Upload, upload_of

CLS_PART = 48  # crops a classifier call at most: others' calls wait a part, not a page of 1,000 crops (7 s)
ORIENTATION = OrientationParams()  # serve_app.ocr.orientation: when a page is called turned

ImageInput = Union[bytes, bytearray, memoryview, np.ndarray, str, Path]

# What the pipeline needs from each model: awaitables (a coroutine, or a
# Serve DeploymentResponse) of the stage's answer. Every call is given the
# request's context as `ctx=` (serve_app.core.request_context: its deadline and
# lane, so that a model replica drops work whose request is gone and serves
# the interactive lane first).
# working image, the request's detection options -> boxes (N,4,2)
Detect = Callable[..., Awaitable[np.ndarray]]  # (work, params, *, ctx)
Classify = Callable[..., Awaitable[list[Direction]]]  # (crops, *, ctx) -> directions
Recognize = Callable[..., Awaitable[list[Recognition]]]  # (crops, *, ctx) -> readings
# Document structure (serve_app.structure), only for requests that ask:
# the page image (BGR) -> its layout regions (list[LayoutBox]), and a table
# region's crop (BGR) -> its structure (serve_app.structure.TableStructure:
# tokens, cells' boxes in the crop).
Layout = Callable[..., Awaitable[Any]]  # (page, *, ctx) -> list[LayoutBox]
TableStructure = Callable[..., Awaitable[Any]]  # (table crop, *, ctx) -> structure.TableStructure
Progress = Callable[[int, int], None]  # (pages done, pages in all) of a document
OnPage = Callable[[PageResult], None]  # each page of a document as it is read (in any order)


Context = Union[RequestContext, float, None]  # a context, or just a deadline (time.time())


def context_of(ctx: Context, options: OcrOptions) -> RequestContext:
    """The request's context; a bare deadline (or None) with the options' lane."""
    if isinstance(ctx, RequestContext):
        return ctx
    return RequestContext("", ctx, options.priority or "interactive")


@dataclass(frozen=True)
class Stages:
    detect: Detect
    classify: Optional[Classify]  # None: no direction classifier
    recognize: Recognize
    layout: Optional[Layout] = None  # None: structure not served here
    table: Optional[TableStructure] = None


class Pipeline:
    """`await read(image, options)` -> OcrResult. Whole-image work (decode,
    resize, crop) runs in a worker thread, never on the event loop."""

    def __init__(self, stages: Stages, config: EngineConfig,
                 admit: Optional[Callable[[str, int], contextlib.AbstractAsyncContextManager]] = None):
        self.stages, self.config = stages, config
        # admit(lane, owner): held while one image (or page) is read, e.g. the Serve pipeline's cap on bulk work in
        # the stages (serve_app.core.lanes.PriorityGate.hold); owner: whose turn it takes (the request's client).
        self.admit = admit
        self.pages = PriorityGate(config.documents.page_concurrency, max_wait_s=30.0)  # document pages here, at once

    async def read(self, image: ImageInput, options: OcrOptions = OcrOptions(), ctx: Context = None) -> OcrResult:
        """With a deadline (the context's, time.time()), a step not started
        when it has passed is not started: DeadlineExceeded instead. The
        context goes to every stage call."""
        ctx = context_of(ctx, options)
        if self.admit is None:
            return await self._read(image, options, ctx)
        async with self.admit(ctx.lane, owner=ctx.client or id(ctx)):
            return await self._read(image, options, ctx)

    async def _read(self, image: ImageInput, options: OcrOptions, ctx: RequestContext) -> OcrResult:
        cfg = self.config
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        ctx.check("decoding")
        img, frames = await asyncio.to_thread(load_image_frames, image, cfg.limits, cfg.pipeline.exif_transpose)
        h, w = img.shape[:2]
        timings["decode"] = _ms(t0)
        orient = (options.page_orientation if options.page_orientation is not None
                  else cfg.pipeline.page_orientation) and options.det and self.stages.classify is not None \
            and options.cls is not False
        asked = options
        if options.structure:
            self._check_structure()
            options = dataclasses.replace(options, return_words=True)  # a line is split between cells at its words
        lines, votes = await self._lines(img, options, ctx, timings, orient)
        orientation = 0 if orient else None
        angle = decide(votes) if orient else 0
        if angle:
            # Turned: read once more upright (never more than once), kept
            # only if the recogniser reads it at least as well and its lines
            # then vote upright.
            t = time.perf_counter()
            ctx.check("reading the page upright")
            turned = await asyncio.to_thread(upright, img, angle)
            again, votes_again = await self._lines(turned, options, ctx, {}, True)
            if quality(again) >= ORIENTATION.accept * quality(lines) and decide(votes_again) == 0:
                lines, orientation = turn_lines(again, angle, w, h), angle
            timings["orientation"] = _ms(t)
        blocks = None
        if options.blocks if options.blocks is not None else cfg.pipeline.blocks:
            lines, blocks = await asyncio.to_thread(arrange, lines, orientation or 0, w, h)  # not on the loop
        regions = None
        if options.structure:
            t = time.perf_counter()
            regions = await read_structure(self.stages, self.config.structure, img, lines, ctx, orientation or 0)
            if not asked.return_words:
                lines = tuple(dataclasses.replace(line, words=None) for line in lines)
            timings["structure"] = _ms(t)
        options = asked
        picture = None
        if options.visualize:
            t = time.perf_counter()
            picture = await asyncio.to_thread(draw_result, img, lines, cfg.pipeline, options.visualize)  # ocr.visualize
            timings["visualize"] = _ms(t)
        timings["total"] = _ms(t0)
        return OcrResult(w, h, lines, timings, picture, frames, blocks, orientation, regions)

    async def _lines(self, img: np.ndarray, options: OcrOptions, ctx: RequestContext,
                     timings: dict[str, float], votes: bool) -> tuple[tuple[TextLine, ...], list]:
        """One image's lines (detect, crop, classify, recognise, assemble),
        and with `votes` each line's vote on the page's orientation."""
        cfg = self.config
        h, w = img.shape[:2]
        t = time.perf_counter()
        if options.det:
            ctx.check("detection")
            if wants_tiles(h, w, cfg.pipeline):
                work, geometry, boxes = await self._detect_long(img, options, ctx)
            else:
                work, geometry = await asyncio.to_thread(prepare_image, img, cfg.pipeline)
                boxes = await self.stages.detect(work, options.det_params(), ctx=ctx)
                finer = finer_scale(boxes_to_original(boxes, geometry), self._det_scale(work, geometry, options),
                                    (h, w), cfg.pipeline, self._top_rung(options))
                if finer:
                    ctx.check("detecting small text again in tiles")
                    work, geometry, boxes = await self._detect_fine(img, options, finer, ctx)
            ctx.check("cropping")
            boxes, crops = await asyncio.to_thread(crop_lines, work, boxes, cfg.limits)
        else:
            geometry = Geometry(1.0, 1.0, 0, w, h)
            boxes, crops = np.array([whole_image_box(w, h)], dtype=np.float32), [img]
        timings["det"] = _ms(t)

        t = time.perf_counter()
        flipped = [False] * len(crops)
        use_cls = options.cls is not False and self.stages.classify is not None
        if use_cls and crops:
            ctx.check("direction classification")
            dirs = []
            for at in range(0, len(crops), CLS_PART):  # in turns: another request's call waits a part, not a page
                dirs += await self.stages.classify(crops[at:at + CLS_PART], ctx=ctx)
            flipped = [is_flipped(d, cfg.cls) for d in dirs]
            crops = [apply_direction(c, d, cfg.cls) for c, d in zip(crops, dirs)]
        timings["cls"] = _ms(t)

        t = time.perf_counter()
        ctx.check("recognition")
        recs = await self.stages.recognize(crops, ctx=ctx) if crops else []
        timings["rec"] = _ms(t)
        drop_score = cfg.pipeline.drop_score if options.drop_score is None else options.drop_score
        lines = assemble(boxes, recs, geometry, drop_score, flipped, options.return_chars, options.return_words)
        if not votes:
            return lines, []
        return lines, [line_vote(is_vertical(b), f, len(r.text.strip()), r.score, b)
                       for b, r, f in zip(boxes, recs, flipped) if r.score >= drop_score]

    def _top_rung(self, options: OcrOptions) -> int:
        """The detector's largest input side for this request."""
        det = options.det_params().apply(self.config.det)
        return det.side_ladder[-1] if det.limit_type == "ladder" else det.limit_side_len

    def _det_scale(self, work: np.ndarray, geometry: Geometry, options: OcrOptions) -> float:
        """The detector's input over the original image (long sides)."""
        (rh, rw), _ = det_layout(work.shape[0], work.shape[1], options.det_params().apply(self.config.det))
        return max(rh, rw) / max(1, geometry.orig_h, geometry.orig_w)

    async def _detect_long(self, img: np.ndarray, options: OcrOptions,
                           ctx: RequestContext) -> tuple[np.ndarray, Geometry, np.ndarray]:
        """A long image's boxes from overlapping tiles along its long side
        (serve_app.ocr.tiling): (working image, its geometry, boxes in
        working coordinates)."""
        work, (sx, sy), tiles = await asyncio.to_thread(prepare_tiled, img, self.config.pipeline,
                                                        self._top_rung(options))
        return work, Geometry(sx, sy, 0, img.shape[1], img.shape[0]), await self._detect_tiles(work, tiles, options, ctx)

    async def _detect_fine(self, img: np.ndarray, options: OcrOptions, scale: float,
                           ctx: RequestContext) -> tuple[np.ndarray, Geometry, np.ndarray]:
        """Small text on a large image, detected again at `scale` of the
        original in a grid of tiles of the detector's largest input."""
        work, (sx, sy), tiles = await asyncio.to_thread(prepare_grid, img, scale, self.config.pipeline,
                                                        self._top_rung(options))
        return work, Geometry(sx, sy, 0, img.shape[1], img.shape[0]), await self._detect_tiles(work, tiles, options, ctx)

    async def _detect_tiles(self, work: np.ndarray, tiles: list[Tile], options: OcrOptions,
                            ctx: RequestContext) -> np.ndarray:
        """Each tile prepared and detected as an image of its own,
        concurrently; boxes moved back and merged where tiles overlap."""
        cfg, params = self.config, options.det_params()

        tctx = dataclasses.replace(ctx, lane=BULK) if len(tiles) > 1 else ctx  # many tiles: behind others' one call

        async def one(tile: Tile) -> np.ndarray:
            sub = np.ascontiguousarray(work[tile.y0:tile.y1, tile.x0:tile.x1])
            tile_work, geo = await asyncio.to_thread(prepare_image, sub, cfg.pipeline)
            boxes = boxes_to_original(await self.stages.detect(tile_work, params, ctx=tctx), geo)
            return boxes + np.array([tile.x0, tile.y0], dtype=np.float32)

        window = asyncio.Semaphore(cfg.pipeline.tile_window)  # a bounded window, not every tile at once

        async def windowed(tile: Tile) -> np.ndarray:
            async with window:
                return await one(tile)

        found = await all_or_none([windowed(t) for t in tiles])
        return await asyncio.to_thread(merge_tile_boxes, tiles, found)

    async def read_any(self, data: Union[ImageInput, Upload], options: OcrOptions = OcrOptions(), ctx: Context = None,
                       progress: Optional[Progress] = None,
                       on_page: Optional[OnPage] = None) -> Union[OcrResult, DocumentResult]:
        """A document (its kind decided at the door: serve_app.flow.upload; a PDF,
        a TIFF of several pages) -> read_document; an image -> read."""
        upload = upload_of(data, self.config.limits)
        if isinstance(upload.data, (str, Path)):  # a name, not content: its kind is read where its file is
            upload = upload_of(upload.data)
        if upload.is_document:
            return await self.read_document(upload.data, options, ctx, progress, on_page)
        return await self.read(upload.data, options, ctx)

    async def read_document(self, data: Union[bytes, str, Path], options: OcrOptions = OcrOptions(),
                            ctx: Context = None, progress: Optional[Progress] = None,
                            on_page: Optional[OnPage] = None) -> DocumentResult:
        """Every page of a document (a PDF, a multi-page TIFF), in order. Pages are rendered here (in a worker
        thread, from the PDF's bytes) and read concurrently, at most documents.page_concurrency at a time (of
        this document, and of all this pipeline reads), so a page's bitmap exists only while it is read.
        `progress(done, total)` after each page, and `on_page(page)` before it (a job streams its pages as
        they finish)."""
        cfg = self.config
        ctx = context_of(ctx, options)
        t0 = time.perf_counter()
        if isinstance(data, (str, Path)):
            data = await asyncio.to_thread(read_file, Path(data), cfg.limits)
        data = upload_of(data, cfg.limits).data  # the byte limit (serve_app.flow.upload)
        pdf = await open_document_async(data, cfg.documents, cfg.limits.max_pixels, cfg.pipeline.exif_transpose,
                                        ctx.deadline)
        try:
            total = pdf.pages
            if progress is not None:
                progress(0, total)
            gate = asyncio.Semaphore(cfg.documents.page_concurrency)
            done = 0
            chars = [0]  # text-layer characters taken so far (limits.max_document_chars)

            async def one(index: int) -> PageResult:
                nonlocal done
                async with gate, self.pages.hold(ctx.lane, 1, ctx.client or id(ctx)):  # clients take turns here
                    try:
                        page = await self._read_page(pdf, index, options, ctx, chars)
                    except PageOverBudget as e:  # this page only: the others are still read
                        page = PageResult(index + 1, 0, 0, (), {}, "none", None,
                                          error={"code": e.code, "message": e.message})
                        failed.append((index, e))
                        if len(failed) >= cfg.documents.max_pages_over_budget and len(failed) < total:
                            # a document of slow pages is given up, not read to its end (the rest cancelled)
                            raise PageOverBudget(
                                f"the document was abandoned after {len(failed)} pages over their budget (pages "
                                f"{', '.join(str(i + 1) for i, _ in sorted(failed))}; "
                                f"engine.documents.max_pages_over_budget): {failed[0][1].message}") from None
                done += 1
                if on_page is not None:
                    on_page(page)
                if progress is not None:
                    progress(done, total)
                return page

            failed: list[tuple[int, PageOverBudget]] = []
            pages = await all_or_none([one(i) for i in range(total)])
            if len(failed) == total:
                raise failed[0][1]
        finally:
            pdf.close()
        return DocumentResult(tuple(pages), {"total": _ms(t0)}, pdf.kind)

    def _check_structure(self) -> None:
        if self.stages.layout is None or self.stages.table is None:
            raise BadRequest("options.structure: this service reads no document structure (its layout and "
                             "table models are not served here); send the request without structure")

    async def _read_page(self, pdf: PdfFile, index: int, options: OcrOptions, ctx: RequestContext,
                         chars: Optional[list[int]] = None) -> PageResult:
        t0 = time.perf_counter()
        if options.pdf_text_layer:
            got = await pdf.run(pdf.text_lines, index, options.return_chars or options.structure)
            if got is not None:
                geo, lines = got
                if chars is not None:
                    chars[0] += sum(len(line.text) for line in lines)
                    if chars[0] > pdf.limits.max_document_chars:
                        raise TooLarge(f"the PDF's text layer passed {pdf.limits.max_document_chars} characters "
                                       f"at page {index + 1} (engine.documents.max_document_chars)")
                timings = {"text_layer": _ms(t0)}
                regions = None
                if options.structure:  # the layout and tables from the page's rendering, the text layer's lines in them
                    self._check_structure()
                    ctx.check(f"rendering page {index + 1}")
                    image = await pdf.run(pdf.render, index)
                    t = time.perf_counter()
                    # a row of a table is one run of the text layer: split between its cells at its words
                    regions = await read_structure(self.stages, self.config.structure, image,
                                                   text_layer_words(lines), ctx)
                    del image
                    if not options.return_chars:
                        lines = tuple(dataclasses.replace(line, chars=None) for line in lines)
                    timings["structure"] = _ms(t)
                timings["total"] = _ms(t0)
                return PageResult(index + 1, geo.width, geo.height, lines, timings, "text_layer", regions=regions)
        ctx.check(f"rendering page {index + 1}")
        image = await pdf.run(pdf.render, index)
        render_ms = _ms(t0)
        if options.visualize and index >= self.config.documents.max_picture_pages:
            options = dataclasses.replace(options, visualize=False)  # pictures of the first pages only
        result = await self.read(image, options, ctx)
        del image
        timings = {"render": render_ms, **result.timings_ms}
        timings["total"] = _ms(t0)
        return PageResult(index + 1, result.width, result.height, result.lines, timings, "ocr",
                          result.visualization, result.blocks, result.orientation, regions=result.regions)


# -- whole-image steps around the models ---------------------------------------


def load_image(image: ImageInput, limits: ImageLimits, exif_transpose: bool) -> np.ndarray:
    """Bytes (encoded image), a path, or an array (HxW or HxWxC, BGR order
    for colour, as OpenCV gives) -> BGR uint8."""
    if isinstance(image, np.ndarray):
        if image.size > limits.max_pixels * 4:
            raise BadImage(f"image array of shape {image.shape} is over the pixel limit")
        if image.ndim >= 2:
            check_aspect(int(image.shape[1]), int(image.shape[0]), limits)
        return array_to_bgr(image)
    if isinstance(image, (str, Path)):
        image = read_file(Path(image), limits)
    if not isinstance(image, (bytes, bytearray, memoryview)):
        raise BadImage(f"an image is bytes, a path or a numpy array, not {type(image).__name__}")
    return decode_image(bytes(image), limits, exif_transpose)


def load_image_frames(image: ImageInput, limits: ImageLimits, exif_transpose: bool) -> tuple[np.ndarray, int]:
    """load_image, and how many frames the encoded image has (an animated
    GIF, WebP or PNG: only the first is read)."""
    if isinstance(image, (str, Path)):
        image = read_file(Path(image), limits)
    img = load_image(image, limits, exif_transpose)
    return img, frame_count(bytes(image)) if isinstance(image, (bytes, bytearray, memoryview)) else 1


def read_file(path: Path, limits: ImageLimits) -> bytes:
    if not path.is_file():
        raise BadImage(f"{path}: no such file")
    limits.check_bytes(path.stat().st_size, str(path))
    return path.read_bytes()


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0
