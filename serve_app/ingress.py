"""The HTTP ingress (FastAPI under @serve.ingress) and the handle API.

Only this module turns domain errors into HTTP responses."""



import base64
import hmac
import os
import binascii
import json
import logging
import time
import uuid
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

import asyncio

from .options import parse_options
from .config import ImageLimits
from .errors import (
    BadRequest, ConfigError, DeadlineExceeded, NotFound, OcrError, Overloaded, TooLarge, Unauthorized,
    Unavailable, UnsupportedMediaType,
)
from .metrics import RequestMetrics
from .settings import IngressArgs

log = logging.getLogger("ray.serve")

api = FastAPI(
    title="OCR service",
    description="PP-OCRv4 (detection, direction, recognition) on Paddle Inference, served by Ray Serve.",
    version="1",
)

RAW_TYPES = ("application/octet-stream",)


def unwrap(e: BaseException) -> BaseException:
    """The domain error behind a Ray task error, if any; Serve's own
    back-pressure refusal becomes our 503."""
    from ray.exceptions import ActorUnavailableError, RayActorError
    from ray.serve.exceptions import BackPressureError

    if isinstance(e, BackPressureError):
        return Overloaded("the service is at capacity; retry shortly")
    if isinstance(e, (RayActorError, ActorUnavailableError)):
        return Unavailable("a replica serving this request stopped; retry shortly")
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


def deadline_s(request: Request, args: IngressArgs) -> float:
    """The request's deadline: X-Request-Timeout (seconds), else the default."""
    raw = request.headers.get("x-request-timeout")
    if raw is None:
        return args.default_timeout_s
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"X-Request-Timeout must be a number of seconds, got {raw!r}") from None
    if not 0 < value <= args.max_timeout_s:
        raise BadRequest(f"X-Request-Timeout must be in (0, {args.max_timeout_s}] seconds, got {value}")
    return value


def error_response(e: OcrError, request_id: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else {}  # the proxy echoes X-Request-ID
    retry = getattr(e, "retry_after_s", None)
    if retry is not None:
        headers["Retry-After"] = str(retry)
    return JSONResponse({"request_id": request_id, "error": {"code": e.code, "message": e.message}},
                        status_code=e.status, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to be over `limit`:
    from Content-Length before reading, else while streaming."""
    length = request.headers.get("content-length")
    if length is not None:
        try:
            if int(length) > limit:
                raise TooLarge(f"request body is {int(length)} bytes, over the limit of {limit}")
        except ValueError:
            raise BadRequest(f"bad Content-Length header {length!r}") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def image_and_options(request: Request, limits: ImageLimits) -> tuple[bytes, dict]:
    """The three ways to send an image: multipart field `file`, raw body
    (image/* or application/octet-stream), or JSON with base64."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    # base64 and multipart framing make the body larger than the image.
    body_limit = limits.max_bytes * 4 // 3 + 64 * 1024
    options: dict = {}
    if ctype == "multipart/form-data":
        await read_body_check_length(request, body_limit)
        try:
            form = await request.form(max_files=1, max_fields=4)
        except Exception:
            raise BadRequest("malformed multipart body; send the image in a field named `file`") from None
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise BadRequest("multipart body has no file field named `file`")
        data = await upload.read()
        raw_opts = form.get("options")
        if isinstance(raw_opts, str) and raw_opts:
            options = _json_object(raw_opts, "options")
    elif ctype.startswith("image/") or ctype in RAW_TYPES:
        data = await read_body(request, body_limit)
    elif ctype == "application/json":
        body = await read_body(request, body_limit)
        doc = _json_object(body, "request body")
        image = doc.get("image")
        if set(doc) - {"image", "options"}:
            raise BadRequest(f"unknown fields {sorted(set(doc) - {'image', 'options'})}; expected image and options")
        if not isinstance(image, dict) or not isinstance(image.get("base64"), str) or set(image) != {"base64"}:
            raise BadRequest('JSON body must be {"image": {"base64": "..."}, "options": {...}}')
        try:
            data = base64.b64decode(image["base64"], validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest("image.base64 is not valid base64") from None
        options = doc.get("options") or {}
    elif not ctype:
        raise UnsupportedMediaType("missing Content-Type; send multipart/form-data, image/*, "
                                   "application/octet-stream or application/json")
    else:
        raise UnsupportedMediaType(f"unsupported Content-Type {ctype!r}; send multipart/form-data, image/*, "
                                   f"application/octet-stream or application/json")
    if len(data) > limits.max_bytes:
        raise TooLarge(f"image is {len(data)} bytes, over the limit of {limits.max_bytes}")
    return data, options


async def read_body_check_length(request: Request, limit: int) -> None:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise TooLarge(f"request body is {int(length)} bytes, over the limit of {limit}")


def _json_object(raw, what: str) -> dict:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadRequest(f"{what} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return doc


@serve.deployment(name="OcrIngress")
@serve.ingress(api)
class OcrIngress:
    def __init__(self, pipeline: DeploymentHandle, jobs: DeploymentHandle, limits: ImageLimits,
                 args: IngressArgs = IngressArgs()):
        self.pipeline = pipeline
        self.jobs = jobs
        self.limits = limits
        self.args = args
        self.in_flight = 0
        self.metrics = RequestMetrics()
        self.token: Optional[bytes] = None
        if args.auth_token_env:
            token = os.environ.get(args.auth_token_env, "")
            if not token:
                raise ConfigError(f"ingress.auth_token_env names {args.auth_token_env!r}, but that environment "
                                  f"variable is empty or unset in the ingress replica (set it, e.g. through "
                                  f"runtime_env.env_vars, or remove auth_token_env)")
            self.token = token.encode()

    def _authorize(self, request: Request) -> None:
        if self.token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token):
            raise Unauthorized("missing or wrong bearer token (Authorization: Bearer TOKEN)")

    # -- handle API (other Ray jobs and deployments) -------------------------
    async def ocr(self, image: Any, options: Optional[dict] = None) -> dict:
        """`serve.get_app_handle("ocr").ocr.remote(image_bytes_or_array)`:
        the same dict as the HTTP body. Domain errors raise."""
        request_id = uuid.uuid4().hex
        parse_options(options)  # refuse bad options here, before any work
        try:
            result = await self.pipeline.ocr.remote(image, options)
        except Exception as e:
            raise unwrap(e) from None
        return {"request_id": request_id, **result}

    # -- HTTP -----------------------------------------------------------------
    async def _guard(self, route: str, request_id: str, work) -> JSONResponse:
        t0 = time.perf_counter()
        try:
            response = await work()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this request itself is being cancelled (client gone, shutdown)
            # The downstream call was cancelled (its replica went away).
            e = Unavailable("a replica serving this request stopped; retry shortly")
            response = error_response(e, request_id)
            self.metrics.errors.inc(tags={"code": e.code})
        except OcrError as e:
            response = error_response(e, request_id)
            self.metrics.errors.inc(tags={"code": e.code})
        except Exception:
            log.exception("request %s failed", request_id)
            self.metrics.errors.inc(tags={"code": "internal"})
            response = error_response(OcrError("internal error; the request was not completed"), request_id)
        self.metrics.requests.inc(tags={"route": route, "code": str(response.status_code)})
        self.metrics.latency.observe((time.perf_counter() - t0) * 1000, tags={"route": route})
        return response

    @api.post("/v1/ocr", summary="Read the text in one image")
    async def http_ocr(self, request: Request):
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex

        async def work():
            self._authorize(request)
            if self.in_flight >= self.args.max_in_flight:
                raise Overloaded(f"{self.in_flight} requests in progress here; retry shortly",
                                 retry_after_s=self.args.retry_after_s)
            self.in_flight += 1
            try:
                timeout = deadline_s(request, self.args)
                data, options = await image_and_options(request, self.limits)
                parse_options(options)
                response = self.pipeline.ocr.remote(data, options)
                try:
                    result = await asyncio.wait_for(asyncio.shield(response), timeout)
                except asyncio.TimeoutError:
                    response.cancel()  # frees the replicas' work for it
                    raise DeadlineExceeded(f"not done within the {timeout:g} s deadline") from None
                except Exception as e:
                    raise unwrap(e) from None
            finally:
                self.in_flight -= 1
            for step, ms in result.get("timings_ms", {}).items():
                self.metrics.stage_latency.observe(ms, tags={"step": step})
            return JSONResponse({"request_id": request_id, **result})

        return await self._guard("/v1/ocr", request_id, work)

    @api.post("/v1/ocr/jobs", status_code=202, summary="Submit an image; poll the job for the result")
    async def http_submit_job(self, request: Request):
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex

        async def work():
            self._authorize(request)
            data, options = await image_and_options(request, self.limits)
            parse_options(options)
            key = request.headers.get("idempotency-key")
            if key is not None and not (0 < len(key) <= 200):
                raise BadRequest("Idempotency-Key must be 1 to 200 characters")
            try:
                job = await self.jobs.submit.remote(data, options, key)
            except Exception as e:
                raise unwrap(e) from None
            location = f"/v1/ocr/jobs/{job['job_id']}"
            return JSONResponse({"job_id": job["job_id"], "status": job["status"]}, status_code=202,
                                headers={"Location": location})

        return await self._guard("/v1/ocr/jobs", request_id, work)

    @api.get("/v1/ocr/jobs/{job_id}", summary="A job's status, and its result once done")
    async def http_get_job(self, job_id: str, request: Request):
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex

        async def work():
            self._authorize(request)
            try:
                job = await self.jobs.get.remote(job_id)
            except Exception as e:
                raise unwrap(e) from None
            if job is None:
                raise NotFound(f"no job {job_id!r}: unknown, or expired after its time to live")
            return JSONResponse(job)

        return await self._guard("/v1/ocr/jobs/{id}", request_id, work)

    @api.get("/healthz", summary="Alive")
    async def healthz(self):
        return {"status": "ok"}

    @api.get("/readyz", summary="Every model loaded and warmed")
    async def readyz(self):
        try:
            stages = await self.pipeline.ready.remote()
        except Exception:
            stages = {}
        ready = bool(stages) and all(stages.values())
        return JSONResponse({"ready": ready, "stages": stages}, status_code=200 if ready else 503)
