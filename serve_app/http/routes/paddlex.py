"""PaddleX's routes, POST /ocr and PP-StructureV3's POST /layout-parsing:
adapters on the one read path (their shapes: serve_app/http/paddlex.py)."""

import asyncio
from dataclasses import replace

from fastapi import APIRouter, Request

from serve_app.core.lanes import INTERACTIVE
from serve_app.flow.upload import upload_of
from serve_app.http import paddlex
from serve_app.http.body import JSON_ONLY
from serve_app.http.routes.deps import PADDLEX, CurrentFront, RequestId, formatted, with_lane
from serve_app.http.policies.result_cache import wants_fresh

router = APIRouter()


@router.post("/ocr", dependencies=PADDLEX, summary="PaddleX-compatible OCR (PaddleX's serving API: file as base64, "
             "fileType 0 PDF / 1 image)", openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": paddlex.PaddleXOcrRequest.model_json_schema()}}}})
async def paddlex_ocr(request: Request, front: CurrentFront, rid: RequestId):
    """An adapter on the read path: PaddleX's request in, its response
    shape out (serve_app/http/paddlex.py); errors, the token's included, as
    HTTP status + {"logId", "errorCode", "errorMsg"} (the exception
    handler renders them so for this route)."""
    async with front.lease(request, JSON_ONLY) as lease:
        req = await asyncio.to_thread(paddlex.parse_request, lease.body)
        data, opts = await asyncio.to_thread(paddlex.to_call, req)
        upload = upload_of(data, front.limits, "file")
        del data
        if req.visualize is not False:  # PaddleX visualizes unless told not to: the pipeline draws it
            opts = replace(opts, visualize="boxes")
        opts = lease.take_lane(with_lane(opts, request, INTERACTIVE))
        result, cache = await front.read_upload(upload, opts, lease.context(rid, opts), lease.late(),
                                         wants_fresh(request.headers.get("cache-control")))
    images = [paddlex.images_of(page) for page in paddlex.pages_of(result)] if opts.visualize else None
    response = await formatted(paddlex.success(request.state.log_id, paddlex.result(result, opts, front.paddlex, images)),
                               "json", front)  # written off the loop, at most ingress.max_answer_bytes
    response.headers["X-Cache"] = cache
    return response


@router.post("/layout-parsing", dependencies=PADDLEX, summary="PaddleX-compatible layout parsing (PP-StructureV3's "
             "serving API: regions, tables as HTML, Markdown per page)", openapi_extra={"requestBody": {
                 "required": True, "content": {"application/json": {
                     "schema": paddlex.PaddleXLayoutRequest.model_json_schema()}}}})
async def paddlex_layout_parsing(request: Request, front: CurrentFront, rid: RequestId):
    """/ocr's adapter with options.structure on: PP-StructureV3's request
    in, its layoutParsingResults out; errors in PaddleX's shape."""
    async with front.lease(request, JSON_ONLY) as lease:
        req = await asyncio.to_thread(paddlex.parse_request, lease.body, paddlex.PaddleXLayoutRequest)
        data, opts = await asyncio.to_thread(paddlex.to_layout_call, req)
        upload = upload_of(data, front.limits, "file")
        del data
        if req.visualize:  # off unless asked: the page's regions are the answer here
            opts = replace(opts, visualize="boxes")
        opts = lease.take_lane(with_lane(opts, request, INTERACTIVE))
        result, cache = await front.read_upload(upload, opts, lease.context(rid, opts), lease.late(),
                                                wants_fresh(request.headers.get("cache-control")))
    body = await asyncio.to_thread(paddlex.layout_result, result, opts, front.paddlex, bool(opts.visualize))
    response = await formatted(paddlex.success(request.state.log_id, body), "json", front)
    response.headers["X-Cache"] = cache
    return response
