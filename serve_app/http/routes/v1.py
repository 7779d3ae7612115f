"""The v1 read routes: POST /v1/ocr and POST /v1/ocr/batch, adapters on the
one read path (Front.read_upload)."""

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from serve_app.core.errors import OcrError
from serve_app.core.lanes import INTERACTIVE
from serve_app.core.request_options import with_format
from serve_app.http.body import batch_items, parse_body
from serve_app.http.routes.deps import V1, CurrentFront, Format, RequestId, formatted, item_error, log, with_lane
from serve_app.http.schema import batch_request_body, ocr_request_body
from serve_app.http.policies.result_cache import wants_fresh

router = APIRouter()


@router.post("/v1/ocr", dependencies=V1, openapi_extra=ocr_request_body(), summary="Read the text in one image")
async def http_ocr(request: Request, front: CurrentFront, rid: RequestId, fmt: Format = None):
    async with front.lease(request) as lease:
        upload, opts = await parse_body(request, lease.body, front.limits)
        opts = lease.take_lane(with_lane(with_format(opts, fmt), request, INTERACTIVE))
        result, cache = await front.read_upload(upload, opts, lease.context(rid, opts), lease.late(),
                                         wants_fresh(request.headers.get("cache-control")))
    request.state.timings_ms = result.get("timings_ms")
    response = await formatted({"request_id": rid, **result}, opts.format, front)
    response.headers["X-Cache"] = cache
    return response


@router.get("/v1/models", dependencies=V1, summary="The model sets served (the default first): dictionary, "
            "languages, cost, and whether each is loaded; a request names one in options.model")
async def http_models(front: CurrentFront, rid: RequestId):
    states = await front.model_states()
    return JSONResponse({"request_id": rid, "default": front.models[0],
                         "models": [{**m, **states.get(m["name"], {"state": "unknown", "load_s": None})}
                                    for m in front.catalogue]})


@router.post("/v1/ocr/batch", dependencies=V1, openapi_extra=batch_request_body(),
             summary="Read several images (or PDFs) in one request; one result or error per item, in order")
async def http_ocr_batch(request: Request, front: CurrentFront, rid: RequestId):
    """An adapter on the read path: the items in, one result (with its
    `cache`) or error per item out. One slot per batch; its items go to
    the read path batch_concurrency at a time, under the batch's deadline."""
    async with front.lease(request) as lease:
        items, opts = await batch_items(request, lease.body, front.limits, front.args.max_batch_items)
        opts = lease.take_lane(with_lane(opts, request, INTERACTIVE).for_pipeline())
        ctx, late = lease.context(rid, opts), lease.late()
        fresh = wants_fresh(request.headers.get("cache-control"))
        gate = asyncio.Semaphore(front.args.batch_concurrency)

        async def one(index: int, item) -> dict:
            if isinstance(item, OcrError):
                return item_error(index, item)
            async with gate:
                try:
                    result, cache = await front.read_upload(item, opts, ctx, late, fresh)
                    return {"index": index, **result, "cache": cache}
                except Exception as exc:  # this item's failure only; cancellation propagates
                    e = exc if isinstance(exc, OcrError) else None
                    if e is None:
                        log.error("request %s item %d failed", rid, index, exc_info=exc)
                        e = OcrError("internal error; this item was not completed")
                    return item_error(index, e)

        out = await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
    return JSONResponse({"request_id": rid, "items": out})
