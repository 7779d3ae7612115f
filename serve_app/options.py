"""Per-request options: one frozen carrier, parsed once at the edge (HTTP
ingress, handle API, CLI, engine) and passed down unchanged."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

from pydantic import ConfigDict, TypeAdapter, ValidationError

from .errors import BadRequest


@dataclass(frozen=True)
class OcrOptions:
    __pydantic_config__ = ConfigDict(extra="forbid", strict=False)

    det: bool = True  # False: read the whole image as one text line
    cls: Optional[bool] = None  # None: the service's configured default
    return_chars: bool = False  # add each character's box to every line
    # PDF input: a page that has a text layer takes its lines from it
    # (page "source": "text_layer") instead of OCR; never done unasked.
    pdf_text_layer: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_ADAPTER = TypeAdapter(OcrOptions)
FIELDS = tuple(OcrOptions.__dataclass_fields__)


def parse_options(options: Any) -> OcrOptions:
    """None, a mapping (JSON `options`, a handle call's dict) or an
    OcrOptions -> OcrOptions; anything else is a BadRequest naming the field."""
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
        where = ".".join(str(x) for x in first.get("loc", ())) or "options"
        raise BadRequest(f"bad option {where}: {first.get('msg')} (allowed: {', '.join(FIELDS)})") from None
