"""The jobs API: POST /v1/ocr/jobs (checked, then handed to the JobStore) and
GET /v1/ocr/jobs/{job_id}. A mixin of OcrIngress
(serve_app/http/ingress.py), on the one FastAPI app."""

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse

from serve_app.flow.documents import check_document
from serve_app.core.errors import NotFound
from serve_app.http.body import parse_body
from serve_app.http.headers import idempotency_key
from serve_app.http.schema import ocr_request_body
from serve_app.ocr.image_header import check_image_header
from serve_app.serving.admission import current_client
from serve_app.core.lanes import BULK
from serve_app.core.request_options import parse_options, with_format
from serve_app.flow.upload import Upload
from serve_app.http.api import Format, V1, api, downstream, formatted, with_lane


class JobRoutes:
    """Submit a job; a job's status and result."""

    @api.post("/v1/ocr/jobs", status_code=202, dependencies=V1, openapi_extra=ocr_request_body(),
              summary="Submit an image; poll the job for the result")
    async def http_submit_job(self, request: Request, fmt: Format = None):
        key = idempotency_key(request.headers)
        async with self.lease(request, submit=True) as lease:  # a gate of their own: a submit is short, a sync request long
            # A format is kept with the job (its pipeline run then makes
            # word boxes for hOCR/ALTO); the job's result stays JSON.
            upload, opts = await parse_body(request, lease.body, self.limits)
            opts = with_lane(with_format(opts, fmt).for_pipeline(), request, BULK)  # a job is bulk unless it asks otherwise
            # Junk is a 400 now, not a failed job later (header only, off
            # the loop); a document is opened, its pages counted, none rendered.
            await asyncio.to_thread(self._check_upload, upload)
            job = await downstream(self.jobs.submit.remote(upload.data, opts, key, current_client() or "addr:?"))
        return JSONResponse({"job_id": job["job_id"], "status": job["status"]}, status_code=202,
                            headers={"Location": f"/v1/ocr/jobs/{job['job_id']}"})

    def _check_upload(self, upload: Upload) -> None:
        if upload.is_document:  # a PDF, a multi-page TIFF
            check_document(upload.data, self.documents)
        else:
            check_image_header(upload.data, self.limits)

    @api.get("/v1/ocr/jobs/{job_id}", dependencies=V1, summary="A job's status, and its result once done")
    async def http_get_job(self, job_id: str, fmt: Format = None):
        """JSON status (and result once done); with `?format=text|hocr|alto`
        a succeeded job's result in that format (while it is not done, the
        JSON status whatever the format)."""
        fmt = with_format(parse_options(None), fmt).format
        job = await downstream(self.jobs.get.remote(job_id))
        if job is None:
            raise NotFound(f"no job {job_id!r}: unknown, or expired after its time to live")
        if job.get("status") != "succeeded":
            return JSONResponse(job)
        return await formatted(job, fmt)
