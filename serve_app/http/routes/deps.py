"""What every router's routes share: their dependencies (the front, the
request id, the bearer token, PaddleX's error shape, `?format=`) and the
helpers that shape an answer (the lane, the rendered format, a batch
item's error). No Ray."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import replace
from typing import Annotated, Optional

from fastapi import Depends, Header, Query, Request
from fastapi.responses import Response

from serve_app.core.errors import OcrError, TooLarge, Unauthorized
from serve_app.core.request_options import FORMATS, OcrOptions
from serve_app.flow.render_pool import render_here
from serve_app.http.front import Front
from serve_app.http.headers import priority

log = logging.getLogger("ray.serve")


# The dependencies are coroutines: FastAPI runs a plain `def` dependency in its
# thread pool, a thread hop per dependency per request (three on /v1/ocr) for
# a few attribute reads.
async def current_front(request: Request) -> Front:
    """The front the app was built over (serve_app.http.app.build_app)."""
    return request.app.state.front


CurrentFront = Annotated[Front, Depends(current_front)]


def assign_request_id(request: Request, x_request_id: Optional[str]) -> str:
    """X-Request-ID, or a new id; kept on request.state for the error
    handlers (the proxy echoes the header)."""
    request.state.request_id = x_request_id or uuid.uuid4().hex
    return request.state.request_id


async def request_id(request: Request, x_request_id: Annotated[Optional[str], Header()] = None) -> str:
    return assign_request_id(request, x_request_id)


RequestId = Annotated[str, Depends(request_id)]


async def authorized(request: Request, _: RequestId, front: CurrentFront) -> None:
    """Bearer-token check for /v1 routes (when ingress.auth_token_env is set)."""
    if not front.clients.authorized(request.headers.get("authorization"), front.token):
        raise Unauthorized("missing or wrong bearer token (Authorization: Bearer TOKEN)")


V1 = [Depends(authorized)]


async def paddlex_shape(request: Request) -> None:
    """PaddleX's route: its log id, and its error shape for every error of
    the request (the exception handlers read request.state.api)."""
    request.state.api = "paddlex"
    request.state.log_id = str(uuid.uuid4())


# The same token check as /v1, its refusal in PaddleX's error shape.
PADDLEX = [Depends(paddlex_shape), Depends(authorized)]

# `?format=json|text|hocr|alto` on the OCR routes (serve_app.flow.formats); it
# wins over the options' own `format`.
Format = Annotated[Optional[str], Query(alias="format", description=f"one of {', '.join(FORMATS)} (default json)")]


def with_lane(opts: OcrOptions, request: Request, default: str) -> OcrOptions:
    """The options with the request's lane: X-Priority, else the options'
    own `priority`, else the route's default (serve_app.core.lanes)."""
    header = priority(request.headers)
    return replace(opts, priority=header) if header is not None else opts.with_lane(default)


async def formatted(body: dict, fmt: str, front: Optional[Front] = None) -> Response:
    """A synchronous answer in the asked format, written off the event loop
    (JSON in a worker thread; text, hOCR, ALTO in the front's bounded
    RenderPool's child processes: a long document's XML takes seconds), at most
    ingress.max_answer_bytes (TooLarge naming the jobs API)."""
    if fmt == "json":
        content, media_type = await asyncio.to_thread(_json_bytes, body), "application/json"
    elif front is None:
        content, media_type = await asyncio.to_thread(render_here, body, fmt)
    else:
        content, media_type = await front.renders.render(body, fmt)
    limit = front.args.max_answer_bytes if front is not None else None
    size = len(content)
    if limit is not None and size > limit:
        raise TooLarge(f"the answer is {size} bytes, over the limit of {limit} for a synchronous request "
                       f"(ingress.max_answer_bytes); submit it as a job (POST /v1/ocr/jobs) and fetch its result "
                       f"from GET /v1/ocr/jobs/{{job_id}}, or ask for fewer pages or no per-character boxes")
    return Response(content, media_type=media_type)


def _json_bytes(body: dict) -> bytes:
    """As JSONResponse writes it."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


def item_error(index: int, e: OcrError) -> dict:
    """A batch item's failure: its own error body, the others unaffected."""
    return {"index": index, "error": {"code": e.code, "message": e.message}}
