"""Pydantic models at the HTTP edge."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict


class ImagePayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base64: str


class OcrJsonRequest(BaseModel):
    """`POST /v1/ocr` (and `/v1/ocr/jobs`) with `Content-Type: application/json`."""

    model_config = ConfigDict(extra="forbid")

    image: ImagePayload
    # Checked by serve_app.options.parse_options (one message format for
    # every entry point).
    options: Optional[dict[str, Any]] = None
