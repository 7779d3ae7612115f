"""Pydantic models at the HTTP edge."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict


class OcrOptions(BaseModel):
    """Per-request options (JSON `options`, or query parameters)."""

    model_config = ConfigDict(extra="forbid")

    det: bool = True  # False: read the whole image as one text line
    cls: Optional[bool] = None  # None: the service's configured default
    return_chars: bool = False  # add each character's box to every line


class ImagePayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base64: str


class OcrJsonRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: ImagePayload
    options: OcrOptions = OcrOptions()


def parse_options(options) -> OcrOptions:
    from pydantic import ValidationError

    from .errors import BadRequest

    if isinstance(options, OcrOptions):
        return options
    if options is None:
        return OcrOptions()
    if not isinstance(options, dict):
        raise BadRequest(f"options must be an object, got {type(options).__name__}")
    try:
        return OcrOptions.model_validate(options)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "options"
        raise BadRequest(f"bad option {where}: {first.get('msg')} (allowed: det, cls, return_chars)") from None
