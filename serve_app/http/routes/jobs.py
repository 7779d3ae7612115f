"""The jobs API: POST /v1/ocr/jobs (checked, then handed to the JobStore) and
GET /v1/ocr/jobs/{job_id}."""

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from serve_app.core.engine_config import DocumentLimits, ImageLimits
from serve_app.core.lanes import BULK
from serve_app.core.request_options import parse_options, with_format
from serve_app.flow.documents import check_document
from serve_app.flow.upload import Upload
from serve_app.http.body import parse_body
from serve_app.http.front import downstream
from serve_app.http.headers import idempotency_key
from serve_app.http.routes.deps import V1, CurrentFront, Format, with_lane
from serve_app.http.schema import ocr_request_body
from serve_app.http.policies.admission import current_client
from serve_app.http.policies.answers import job_answer
from serve_app.ocr.image_header import check_image_header

router = APIRouter()


@router.post("/v1/ocr/jobs", status_code=202, dependencies=V1, openapi_extra=ocr_request_body(),
             summary="Submit an image; poll the job for the result")
async def http_submit_job(request: Request, front: CurrentFront, fmt: Format = None):
    key = idempotency_key(request.headers)
    async with front.lease(request, submit=True) as lease:  # a gate of their own: a submit is short, a sync request long
        # A format is kept with the job (its pipeline run then makes
        # word boxes for hOCR/ALTO); the job's result stays JSON.
        upload, opts = await parse_body(request, lease.body, front.limits)
        opts = with_lane(with_format(opts, fmt).for_pipeline(), request, BULK)  # a job is bulk unless it asks otherwise
        opts = opts.with_model(front.models)  # an unserved model set: 400 before the job is accepted
        # Junk is a 400 now, not a failed job later (header only, off
        # the loop); a document is opened, its pages counted, none rendered.
        await asyncio.to_thread(check_upload, upload, front.limits, front.documents)
        job = await downstream(front.jobs.submit.remote(upload.data, opts, key, current_client() or "addr:?"))
    return JSONResponse({"job_id": job["job_id"], "status": job["status"]}, status_code=202,
                        headers={"Location": f"/v1/ocr/jobs/{job['job_id']}"})


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
