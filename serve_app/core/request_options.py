"""Per-request options: one frozen carrier, parsed once at the edge (HTTP
ingress, handle API, CLI, engine) and passed down unchanged."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from serve_app.core.engine_config import DetOptions
from serve_app.core.errors import BadRequest

FORMATS = ("json", "text", "hocr", "alto", "markdown")
# Formats that place every word: they need word boxes from the pipeline.
WORD_FORMATS = ("hocr", "alto")
# Formats written from the page's typed regions: they need structure.
STRUCTURE_FORMATS = ("markdown",)

# Bounds of the numeric options: (low, high, low included, high included).
# One table for the validation and for its error message.
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "limit_side_len": (32, 4096, True, True),
    "thresh": (0.0, 1.0, False, False),
    "box_thresh": (0.0, 1.0, False, False),
    "unclip_ratio": (0.5, 5.0, True, True),
    "drop_score": (0.0, 1.0, True, True),
}


def _bounded(name: str, kind: type) -> Any:
    lo, hi, lo_in, hi_in = RANGES[name]
    field = Field(**{("ge" if lo_in else "gt"): lo, ("le" if hi_in else "lt"): hi})
    return Annotated[Optional[kind], field]


def describe_range(name: str) -> str:
    lo, hi, lo_in, hi_in = RANGES[name]
    return f"{'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


@dataclass(frozen=True)
class OcrOptions:
    __pydantic_config__ = ConfigDict(extra="forbid", strict=False)

    det: bool = True  # False: read the whole image as one text line
    cls: Optional[bool] = None  # None: the service's configured default
    return_chars: bool = False  # add each character's box to every line
    return_words: bool = False  # add each word's box (and score) to every line
    # How the answer is written (serve_app.flow.formats); the pipeline always
    # makes the JSON body, the edge renders it.
    format: Literal["json", "text", "hocr", "alto", "markdown"] = "json"
    # Detection, per request (None: the service's config). limit_side_len
    # caps the detector's long side (with the closed "ladder" input policy:
    # rounded down to a rung of det.side_ladder, never a new input shape);
    # thresh, box_thresh and unclip_ratio are DB post-processing; drop_score
    # drops lines read with a lower score.
    limit_side_len: _bounded("limit_side_len", int) = None
    thresh: _bounded("thresh", float) = None
    box_thresh: _bounded("box_thresh", float) = None
    unclip_ratio: _bounded("unclip_ratio", float) = None
    drop_score: _bounded("drop_score", float) = None
    # Add a JPEG picture of the result (serve_app.ocr.visualize): true or
    # "panels", the boxes and the text side by side; "boxes", the image
    # itself with the boxes drawn on it and the image as read (PaddleX's
    # ocrImage and inputImage).
    visualize: Union[bool, Literal["panels", "boxes"]] = False
    # PDF input: a page that has a text layer takes its lines from it
    # (page "source": "text_layer") instead of OCR; never done unasked.
    pdf_text_layer: bool = False
    # A page turned 90/180/270 degrees found and read upright (None: the
    # service's engine.pipeline.page_orientation); blocks and column order
    # (None: engine.pipeline.blocks).
    page_orientation: Optional[bool] = None
    blocks: Optional[bool] = None
    # Priority lane (serve_app.core.lanes): "interactive" or "bulk"; None: the
    # entry point's default (sync HTTP and handle calls interactive, jobs
    # bulk). It orders work, never changes a result (not in the cache key).
    priority: Optional[Literal["interactive", "bulk"]] = None
    # The model set to read with (serve_app.core.model_sets); None: the
    # application's default (the first it serves). An unknown or unserved
    # name is a 400 listing the served sets (resolve_model), before any work.
    # Part of the cache key: each set's result is its own.
    model: Annotated[Optional[str], Field(max_length=64)] = None
    # Document structure (serve_app.structure): the page's layout regions in
    # reading order, each table as rows and cells. Off: the answer has the
    # fields and text it has without it, at no cost. format "markdown"
    # implies it (for_pipeline).
    structure: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def key_dict(self) -> dict[str, Any]:
        """What a result depends on: every option but the lane (the result
        cache's and an Idempotency-Key's view of the options)."""
        d = asdict(self)
        del d["priority"]
        return d

    def with_lane(self, default: str) -> "OcrOptions":
        """These options with their lane resolved (its own, else `default`)."""
        return self if self.priority is not None else replace(self, priority=default)

    def with_model(self, served: tuple[str, ...]) -> "OcrOptions":
        """These options with their model set resolved against what is
        served (the first: the default); BadRequest listing the served sets
        for an unknown or unserved one."""
        from serve_app.core.model_sets import resolve_model

        name = resolve_model(self.model, served)
        return self if name == self.model else replace(self, model=name)

    def det_params(self) -> "DetParams":
        return DetParams(self.limit_side_len, self.thresh, self.box_thresh, self.unclip_ratio)

    def for_pipeline(self) -> "OcrOptions":
        """What the pipeline is asked: word boxes too when the format
        places words (hOCR, ALTO), structure too when it is written from
        the page's regions (Markdown)."""
        out = self
        if self.format in WORD_FORMATS and not self.return_words:
            out = replace(out, return_words=True)
        if self.format in STRUCTURE_FORMATS and not self.structure:
            out = replace(out, structure=True)
        return out


@dataclass(frozen=True)
class DetParams:
    """One request's detection options, as the detector gets them (None:
    the detector's own config). Hashable: images with equal params share
    their effective DetOptions."""

    limit_side_len: Optional[int] = None
    thresh: Optional[float] = None
    box_thresh: Optional[float] = None
    unclip_ratio: Optional[float] = None

    def apply(self, opts: DetOptions) -> DetOptions:
        """The detector's options for this request. limit_side_len under the
        closed "ladder" policy keeps only the rungs at or below it (at least
        the first): every input shape stays one of the warmed set. Under the
        open "max"/"min" modes it replaces limit_side_len."""
        update: dict[str, Any] = {k: v for k, v in (("thresh", self.thresh), ("box_thresh", self.box_thresh),
                                                    ("unclip_ratio", self.unclip_ratio)) if v is not None}
        if self.limit_side_len is not None:
            if opts.limit_type == "ladder":
                update["side_ladder"] = [r for r in opts.side_ladder if r <= self.limit_side_len] or opts.side_ladder[:1]
            else:
                update["limit_side_len"] = self.limit_side_len
        return opts.model_copy(update=update) if update else opts


_ADAPTER = TypeAdapter(OcrOptions)
FIELDS = tuple(OcrOptions.__dataclass_fields__)


def parse_options(options: Any) -> OcrOptions:
    """None, a mapping (JSON `options`, a handle call's dict) or an
    OcrOptions -> OcrOptions; anything else is a BadRequest naming the field
    (and, for a number out of bounds, its range)."""
    if isinstance(options, OcrOptions):
        return options
    if options is None:
        return OcrOptions()
    if not isinstance(options, dict):
        raise BadRequest(f"options must be an object, got {type(options).__name__}")
    try:
        return _ADAPTER.validate_python(options)
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(x) for x in first.get("loc", ())]
        where = ".".join(loc) or "options"
        name = loc[0] if loc else ""
        if name in RANGES and first.get("type") in ("greater_than", "greater_than_equal", "less_than",
                                                   "less_than_equal"):
            raise BadRequest(f"bad option {name}: {first.get('input')!r} is out of range; "
                             f"{name} must be in {describe_range(name)}") from None
        if name == "priority":
            raise BadRequest(f"bad option priority: {first.get('input')!r}; priority is interactive or bulk") from None
        if name == "model":
            raise BadRequest(f"bad option model: {first.get('msg')}; model is the name of a served model set "
                             f"(GET /v1/models)") from None
        if name == "format":
            raise BadRequest(f"bad option format: {first.get('input')!r}; format is one of "
                             f"{', '.join(FORMATS)}") from None
        if name in RANGES:
            raise BadRequest(f"bad option {name}: {first.get('msg')}; {name} must be a number in "
                             f"{describe_range(name)}") from None
        raise BadRequest(f"bad option {where}: {first.get('msg')} (allowed: {', '.join(FIELDS)})") from None


def with_format(options: OcrOptions, fmt: Optional[str]) -> OcrOptions:
    """options with the `format` query parameter applied (it wins over the
    options' own field); 400 for an unknown format."""
    if fmt is None:
        return options
    if fmt not in FORMATS:
        raise BadRequest(f"bad query parameter format: {fmt!r}; format is one of {', '.join(FORMATS)}")
    return replace(options, format=fmt)
