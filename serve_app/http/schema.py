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
    # Checked by serve_app.core.request_options.parse_options (one message format for
    # every entry point).
    options: Optional[dict[str, Any]] = None


class OcrBatchJsonRequest(BaseModel):
    """`POST /v1/ocr/batch` with `Content-Type: application/json`."""

    model_config = ConfigDict(extra="forbid")

    images: list[ImagePayload]
    options: Optional[dict[str, Any]] = None


def _inline(node: Any, defs: dict) -> Any:
    if isinstance(node, dict):
        if set(node) == {"$ref"} and node["$ref"].startswith("#/$defs/"):
            return _inline(defs[node["$ref"].removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def ocr_request_body() -> dict:
    """OpenAPI `requestBody` of the OCR routes: the three ways to send an
    image (the routes read the body themselves, so FastAPI cannot infer it)."""
    schema = OcrJsonRequest.model_json_schema()
    binary = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": True, "content": {
        "multipart/form-data": {"schema": {
            "type": "object", "required": ["file"],
            "properties": {"file": {"type": "string", "format": "binary"},
                           "options": {"type": "string", "description": "a JSON object of options"}}}},
        "image/*": binary,
        "application/octet-stream": binary,
        "application/json": {"schema": _inline(schema, schema.get("$defs", {}))},
    }}}


def batch_request_body() -> dict:
    """OpenAPI `requestBody` of POST /v1/ocr/batch."""
    schema = OcrBatchJsonRequest.model_json_schema()
    return {"requestBody": {"required": True, "content": {
        "multipart/form-data": {"schema": {
            "type": "object", "required": ["file"],
            "properties": {"file": {"type": "array", "items": {"type": "string", "format": "binary"}},
                           "options": {"type": "string", "description": "a JSON object of options"}}}},
        "application/json": {"schema": _inline(schema, schema.get("$defs", {}))},
    }}}
