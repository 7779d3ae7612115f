"""The jobs API: POST /v1/ocr/jobs (checked, then handed to the JobStore),
GET /v1/ocr/jobs/{job_id} and GET /v1/ocr/jobs/{job_id}/pages (NDJSON)."""

import asyncio
import json
import weakref
from typing import Annotated, AsyncIterator, Optional

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from serve_app.core.engine_config import DocumentLimits, ImageLimits
from serve_app.core.errors import BadRequest, NotFound
from serve_app.core.lanes import BULK
from serve_app.core.request_options import parse_options, with_format
from serve_app.flow.documents import check_document
from serve_app.flow.upload import Upload
from serve_app.http.body import JSON, MAX_JSON_CONTAINERS, MULTIPART, media_type, parse_body
from serve_app.http.front import downstream
from serve_app.http.headers import idempotency_key
from serve_app.http.routes.deps import V1, CurrentFront, Format, with_lane
from serve_app.http.schema import ocr_request_body
from serve_app.http.policies.admission import current_client
from serve_app.jobs.page_stream import POLL_S, StreamSlots, error_line, page_markdown
from serve_app.http.policies.answers import job_answer
from serve_app.ocr.image_header import check_image_header

router = APIRouter()
NDJSON = "application/x-ndjson"
DONE = ("succeeded", "failed")
STREAM_SLOTS = StreamSlots()  # this ingress replica's open page streams (serve_app.jobs.page_stream)
FromPage = Annotated[int, Query(alias="from", ge=1, le=1_000_000, description="the first page to send (1-based)")]

CallbackQuery = Annotated[Optional[str], Query(
    alias="callback_url", description="where to POST a signed event when the job ends (docs/jobs.md#callbacks); "
    "also a top-level `callback_url` of a JSON body, or a multipart field")]


@router.post("/v1/ocr/jobs", status_code=202, dependencies=V1, openapi_extra=ocr_request_body(),
             summary="Submit an image; poll the job for the result")
async def http_submit_job(request: Request, front: CurrentFront, fmt: Format = None, callback: CallbackQuery = None):
    key = idempotency_key(request.headers)
    async with front.lease(request, submit=True) as lease:  # a gate of their own: a submit is short, a sync request long
        # A format is kept with the job (its pipeline run then makes
        # word boxes for hOCR/ALTO); the job's result stays JSON.
        body, ctype, in_body = lease.body, media_type(request.headers), None
        if ctype == JSON:
            body, in_body = await asyncio.to_thread(split_callback, body)
        upload, opts = await parse_body(request, body, front.limits)
        if ctype == MULTIPART:  # the form parse_body read, as Starlette keeps it
            field = (await request.form()).get("callback_url")
            in_body = field if isinstance(field, str) and field else None
        if callback and in_body:
            raise BadRequest("callback_url is given twice (the query and the body): give it once")
        opts = with_lane(with_format(opts, fmt).for_pipeline(), request, BULK)  # a job is bulk unless it asks otherwise
        opts = opts.with_model(front.models)  # an unserved model set: 400 before the job is accepted
        # Junk is a 400 now, not a failed job later (header only, off
        # the loop); a document is opened, its pages counted, none rendered.
        await asyncio.to_thread(check_upload, upload, front.limits, front.documents)
        image = await front.handle_arg(upload.data)  # a large one put into the object store off the loop
        # (an event's data.url is built in the store from jobs.callbacks.public_url, never from this request's Host)
        job = await downstream(front.jobs.submit.remote(image, opts, key, current_client() or "addr:?",
                                                        callback or in_body))
    return JSONResponse({"job_id": job["job_id"], "status": job["status"]}, status_code=202,
                        headers={"Location": f"/v1/ocr/jobs/{job['job_id']}"})


def split_callback(body: bytes) -> tuple[bytes, Optional[str]]:
    """A JSON job body's top-level `callback_url` taken out: the rest is the
    sync body's shape, which parse_body checks (the body is parsed twice
    only when it names one)."""
    if b'"callback_url"' not in body:
        return body, None
    if body.count(b"{") + body.count(b"[") > MAX_JSON_CONTAINERS:
        return body, None  # parse_body refuses it, unparsed
    try:
        doc = json.loads(body)
    except ValueError:
        return body, None  # parse_body says what is wrong
    if not isinstance(doc, dict) or "callback_url" not in doc:
        return body, None
    url = doc.pop("callback_url")
    if url is not None and not isinstance(url, str):
        raise BadRequest("callback_url must be a string (an http or https URL)")
    return json.dumps(doc).encode(), url or None


def check_upload(upload: Upload, limits: ImageLimits, documents: DocumentLimits) -> None:
    if upload.is_document:  # a PDF, a multi-page TIFF
        check_document(upload.data, documents)
    else:
        check_image_header(upload.data, limits)


@router.get("/v1/ocr/jobs/{job_id}", dependencies=V1, summary="A job's status, and its result once done")
async def http_get_job(job_id: str, front: CurrentFront, fmt: Format = None):
    """JSON status (and result once done); with `?format=text|hocr|alto`
    a succeeded job's result in that format (while it is not done, the
    JSON status whatever the format)."""
    fmt = with_format(parse_options(None), fmt).format
    return await job_answer(front, job_id, fmt, downstream)  # made once, kept, streamed (policies/answers.py)


@router.get("/v1/ocr/jobs/{job_id}/pages", dependencies=V1, response_class=StreamingResponse,
            summary="A document job's pages as NDJSON, in page order, as they are read")
async def http_job_pages(job_id: str, front: CurrentFront, start: FromPage = 1, fmt: Format = None):
    """One line per page (the page's result as the job's result holds it;
    `?format=markdown`: {"page", "markdown"}), from page `from` on, each
    sent once it and the pages before it are read and the reader has taken
    the line before; a failed job's stream ends with an error line; the
    stream closes when the job has ended. A job that is not a document is a
    400 at once, running or not."""
    if fmt not in (None, "json", "markdown"):
        raise BadRequest(f"bad query parameter format: {fmt!r}; a job's page stream is json or markdown")
    found = await downstream(front.jobs.page.remote(job_id, start))
    if found is None:
        raise NotFound(f"no job {job_id!r}: unknown, or expired after its time to live")
    if found[0].get("document") is False:
        raise BadRequest(f"job {job_id!r} reads an image, not a document: it has no pages; GET /v1/ocr/jobs/{job_id}")
    place = STREAM_SLOTS.take(current_client() or "addr:?")  # 503 past the client's or the replica's streams
    lines = page_lines(front, job_id, start, place, found, fmt == "markdown")
    weakref.finalize(lines, STREAM_SLOTS.give, place)  # (a stream never started still gives its place back)
    return StreamingResponse(lines, media_type=NDJSON)


async def page_lines(front, job_id: str, n: int, place: int, first=None,
                     markdown: bool = False) -> AsyncIterator[bytes]:
    """Page n, n + 1, ... one store call a page, while the job runs and
    after (one page held here at a time; the next asked for once the last
    is sent), then a failed job's error line; with `markdown`, each page
    written so (off the loop)."""
    try:
        found = first
        while True:
            if found is None:
                found = await downstream(front.jobs.page.remote(job_id, n))
            if found is None:
                return
            head, page = found
            found = None
            if page is not None:
                yield await asyncio.to_thread(page_markdown, page) if markdown else page + b"\n"
                n = (head.get("page") or n) + 1
            elif head["status"] == "failed":
                yield error_line(head)
                return
            elif head["status"] in DONE:
                return
            else:
                await asyncio.sleep(POLL_S)
    finally:
        STREAM_SLOTS.give(place)
