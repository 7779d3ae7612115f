"""Reading a request's image and options: the three ways to send an image
(multipart field `file`, the raw body as image/* or application/octet-stream,
JSON with base64), each read under one size limit. Starlette types only, no
Ray: unit-tested on its own."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from typing import Any, Callable, Mapping, Optional, Union

from pydantic import ValidationError
from starlette.datastructures import FormData, Headers
from starlette.formparsers import MultiPartParser
from starlette.requests import Request

from serve_app.core.engine_config import ImageLimits
from serve_app.core.errors import (
    BadRequest, OcrError, Overloaded, RequestTimeout, TooLarge, Unavailable, UnsupportedMediaType,
)
from serve_app.http.schema import OcrBatchJsonRequest, OcrJsonRequest
from serve_app.core.request_options import OcrOptions, parse_options
from serve_app.flow.upload import Upload, upload_of

MULTIPART = "multipart/form-data"
JSON = "application/json"
PDF = "application/pdf"  # PDFs are known by their magic bytes in any shape; this type is checked against them
RAW_TYPES = ("application/octet-stream", PDF)
ACCEPTED = f"{MULTIPART}, image/*, application/pdf, application/octet-stream or {JSON}"
JSON_SHAPE = '{"image": {"base64": "..."}, "options": {...}}'


def body_limit(limits: ImageLimits) -> int:
    """Largest body taken for an image of at most limits.max_bytes: base64
    and multipart framing make the body larger than the image."""
    return limits.max_bytes * 4 // 3 + 64 * 1024


def media_type(headers: Mapping[str, str]) -> str:
    return headers.get("content-type", "").split(";")[0].strip().lower()


def content_length(headers: Mapping[str, str]) -> Optional[int]:
    """The Content-Length header as a number; None when absent (chunked)."""
    raw = headers.get("content-length")
    if raw is None:
        return None
    value = raw.strip()
    if not (value.isascii() and value.isdigit()):
        raise BadRequest(f"bad Content-Length header {raw!r}; expected a number of bytes")
    return int(value)


class BodyBudget:
    """Bytes of request bodies an ingress holds at once (being read, or
    read and still being worked on). A body that would take it over the
    limit is refused with 503 while it streams, so that many clients
    sending large bodies at once cannot take the ingress's memory."""

    def __init__(self, limit: int, retry_after_s: int = 1):
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.held = 0

    def take(self, n: int) -> None:
        if self.held + n > self.limit:
            raise Overloaded(f"the ingress holds {self.held} bytes of request bodies; retry shortly",
                             retry_after_s=self.retry_after_s)
        self.held += n

    def give(self, n: int) -> None:
        self.held -= n

    def hold(self) -> "BodyHold":
        """One request's share of the budget (given back by its release())."""
        return BodyHold(self)


class BytePace:
    """Large job bodies taken at most `rate` bytes a second, all clients
    together (0: unpaced): a body is taken when the bytes before it are paid
    for at that rate, else refused with the seconds until they are (the
    caller's 503 Retry-After). Each such body costs the proxy, the ingress
    and the job store copies of it and the door's walk of it: four clients
    submitting 19 MB PNGs back to back (44 MB/s) held /healthz at 120-160
    ms p99. `clock`: time.monotonic (a test passes its own)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.clock = clock
        self.paid_until = 0.0  # when the bytes taken so far are paid for at `rate`

    def take(self, n: int) -> Optional[float]:
        """None if taken (paced from now), else the seconds to wait."""
        if self.rate <= 0:
            return None
        now = self.clock()
        if self.paid_until > now:
            return self.paid_until - now
        self.paid_until = now + n / self.rate
        return None

    def pay(self, n: int) -> None:
        """`n` bytes more of a body already taken (one whose length was not declared)."""
        if self.rate > 0 and n > 0:
            self.paid_until = max(self.paid_until, self.clock()) + n / self.rate


class BodyHold:
    """The bytes of the budget one request holds: taken as its body
    streams in, all given back at once when the request is done."""

    def __init__(self, budget: BodyBudget):
        self.budget = budget
        self.bytes = 0

    def take(self, n: int) -> None:
        self.budget.take(n)
        self.bytes += n

    def release(self) -> None:
        self.budget.give(self.bytes)
        self.bytes = 0


JOIN_OFF_LOOP_BYTES = 1024 * 1024


async def read_body(request: Request, limit: int, timeout_s: Optional[float] = None,
                    hold: Optional[BodyHold] = None) -> bytes:
    """The whole body, refused with 413 as soon as it is known to be over
    `limit`: from Content-Length before reading, else by counting while
    streaming (a chunked upload has no Content-Length), so at most `limit`
    plus one chunk is ever held. 408 if it has not all arrived within
    `timeout_s`; 503 (retry) if not one byte of it has. Bytes read are taken into `hold` (the caller releases it
    when done with the request). The body is left in Starlette's cache,
    from which `request.form()` then parses."""
    length = content_length(request.headers)
    if length is not None and length > limit:
        raise TooLarge(f"request body is {length} bytes, over the limit of {limit}")
    chunks, size = [], 0

    async def stream() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"request body is over the limit of {limit} bytes")
            if hold is not None and chunk:
                hold.take(len(chunk))
            chunks.append(chunk)

    try:
        await asyncio.wait_for(stream(), timeout_s)
    except asyncio.TimeoutError:
        if size == 0:
            # Not one byte: the body went to a replica that died after taking
            # it from Serve's proxy, which then retried the request here
            # without it (a client that sends headers and then nothing is
            # told the same; it costs the service no more).
            raise Unavailable(f"no part of the request body reached this replica within {timeout_s:g} s "
                              "(the replica it was first sent to may have stopped); retry",
                              retry_after_s=1) from None
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s "
                             f"({size} bytes received); send it at once") from None
    # bytes.join copies without the GIL from 1 MiB on: a large body's copy
    # (~20 ms for 19 MB here) off the event loop, a small one's in place.
    body = b"".join(chunks) if size < JOIN_OFF_LOOP_BYTES else await asyncio.to_thread(b"".join, chunks)
    chunks.clear()
    request._body = body  # Starlette's own cache: stream(), body() and form() read it from here
    return body


OCR_TYPES = (MULTIPART, JSON, *RAW_TYPES, "image/*")  # what the /v1 routes take
JSON_ONLY = (JSON,)  # PaddleX's /ocr: its request is a JSON object


def check_media_type(headers: Mapping[str, str], accepted: tuple[str, ...] = OCR_TYPES) -> str:
    """The request's media type if it is one of `accepted` ("image/*": any
    image type); 415 otherwise."""
    ctype = media_type(headers)
    what = ACCEPTED if accepted == OCR_TYPES else " or ".join(accepted)
    if not ctype:
        raise UnsupportedMediaType(f"missing Content-Type; send {what}")
    if ctype not in accepted and not (ctype.startswith("image/") and "image/*" in accepted):
        raise UnsupportedMediaType(f"unsupported Content-Type {ctype!r}; send {what}")
    return ctype


async def parse_body(request: Request, body: bytes, limits: ImageLimits) -> tuple[Upload, OcrOptions]:
    """The upload (serve_app.flow.upload: its kind and byte limit decided here)
    and the parsed options from a body `read_body` has read; 400 or 413
    otherwise. JSON is parsed in a worker thread, so a large body never
    blocks the event loop."""
    ctype = media_type(request.headers)
    if ctype == MULTIPART:
        data, options = await multipart_image(request)
    elif ctype == JSON:
        data, options = await asyncio.to_thread(json_image, body)
    else:
        data, options = body, None
    upload = upload_of(data, limits)
    if ctype == PDF and upload.format != "pdf":
        raise BadRequest("the body is sent as application/pdf but is not a PDF (no %PDF- header)")
    return upload, parse_options(options)


async def image_and_options(request: Request, limits: ImageLimits,
                            timeout_s: Optional[float] = None) -> tuple[Upload, OcrOptions]:
    """The image's bytes and the parsed options, from any of the three
    request shapes; 400, 408, 413 or 415 otherwise."""
    check_media_type(request.headers)
    body = await read_body(request, body_limit(limits), timeout_s)
    return await parse_body(request, body, limits)


async def multipart_image(request: Request) -> tuple[bytes, Optional[dict]]:
    """Field `file` (the image) and optional field `options` (JSON), parsed
    from the body `read_body` has already read under the limit."""
    try:
        fields = await form_fields(request, max_files=1, max_fields=4)
    except Exception:
        raise BadRequest("malformed multipart body; send the image in a field named `file`") from None
    files = [v for k, v in fields if k == "file"]
    if not files or isinstance(files[-1], str):  # the last, as Starlette's form.get gives it
        raise BadRequest("multipart body has no file field named `file`")
    data = files[-1]
    raw = request._form.get("options")
    options = _json_object(raw, "multipart field `options`") if isinstance(raw, str) and raw else None
    return data, options


def _parse_form(headers: Headers, body: bytes, max_files: int, max_fields: int) -> list[tuple[str, Union[str, bytes]]]:
    """A multipart body's fields in order, each file's bytes read, on the
    calling thread (its own event loop: Starlette's parser is async)."""
    async def one_chunk():
        yield body

    async def parse() -> list[tuple[str, Union[str, bytes]]]:
        form = await MultiPartParser(headers, one_chunk(), max_files=max_files, max_fields=max_fields).parse()
        try:
            return [(k, v if isinstance(v, str) else await v.read()) for k, v in form.multi_items()]
        finally:
            await form.close()

    return asyncio.run(parse())


async def form_fields(request: Request, max_files: int, max_fields: int) -> list[tuple[str, Union[str, bytes]]]:
    """The multipart body `read_body` has read, parsed in a worker thread
    (parsing scans every byte, and spools files over 1 MiB to disk: ~30-70
    ms for a 19 MB body here, which would stall every other request's
    answer, /healthz too, when done on the event loop). The text fields are
    left as the request's form (`request.form()` then answers them, as
    Starlette caches it)."""
    fields = await asyncio.to_thread(_parse_form, request.headers, await request.body(), max_files, max_fields)
    request._form = FormData([(k, v) for k, v in fields if isinstance(v, str)])
    return fields


# The schema's JSON holds at most a few objects and no arrays; a body with
# more structure is refused before it is parsed (a body of millions of empty
# objects would otherwise be built into millions of Python objects).
MAX_JSON_CONTAINERS = 64


def json_image(body: bytes) -> tuple[bytes, Optional[dict]]:
    """A JSON body validated by OcrJsonRequest; the image base64-decoded."""
    containers = body.count(b"{") + body.count(b"[")
    if containers > MAX_JSON_CONTAINERS:
        raise BadRequest(f"request body is not valid JSON for this API: it opens {containers} objects or "
                         f"arrays, more than {JSON_SHAPE} can hold")
    try:
        doc = OcrJsonRequest.model_validate_json(body)
    except ValidationError as e:
        raise BadRequest(_describe(e)) from None
    try:
        data = base64.b64decode(doc.image.base64, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("image.base64 is not valid base64") from None
    return data, doc.options


def _describe(e: ValidationError) -> str:
    first = e.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return f"request body is not valid JSON ({first['msg']}); send {JSON_SHAPE}"
    where = ".".join(str(x) for x in first["loc"])
    if not where:
        return f"request body must be a JSON object: {JSON_SHAPE}"
    return f"bad field {where}: {first['msg']}; send {JSON_SHAPE}"


def _json_object(raw: str, what: str) -> dict[str, Any]:
    if raw.count("{") + raw.count("[") > MAX_JSON_CONTAINERS:  # options are a few flags: refuse a bomb unparsed
        raise BadRequest(f"{what} is not valid JSON for this API: more objects or arrays than options hold")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadRequest(f"{what} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return doc


# -- POST /v1/ocr/batch: many images (or PDFs) in one request -------------------
BATCH_JSON_SHAPE = '{"images": [{"base64": "..."}, ...], "options": {...}}'
Item = Union[Upload, OcrError]  # an item, or why it cannot be read


async def batch_items(request: Request, body: bytes, limits: ImageLimits,
                      max_items: int) -> tuple[list[Item], OcrOptions]:
    """The items (each its bytes, or the error that item gets) and the
    parsed options of a batch body: multipart with many `file` fields, or
    JSON {"images": [...], "options": {...}}. More than max_items is a 413;
    a body with no item a 400; one bad item does not fail the others."""
    ctype = media_type(request.headers)
    if ctype == MULTIPART:
        items, options = await multipart_items(request, max_items)
    elif ctype == JSON:
        items, options = await asyncio.to_thread(json_items, body, max_items)
    else:
        raise UnsupportedMediaType(f"a batch is {MULTIPART} (many `file` fields) or {JSON} ({BATCH_JSON_SHAPE})")
    if not items:
        raise BadRequest(f"the batch has no items; send {MULTIPART} with `file` fields or {BATCH_JSON_SHAPE}")
    if len(items) > max_items:
        raise TooLarge(f"the batch has {len(items)} items, over the limit of {max_items}")
    out: list[Item] = []
    for item in items:
        if isinstance(item, bytes):
            try:
                item = upload_of(item, limits, "item")
            except OcrError as e:  # over the byte limit: this item only
                item = e
        out.append(item)
    return out, parse_options(options)


async def multipart_items(request: Request, max_items: int) -> tuple[list[Item], Optional[dict]]:
    try:
        fields = await form_fields(request, max_files=max_items + 1, max_fields=max_items + 4)
    except Exception as e:
        if "Too many files" in str(e):
            raise TooLarge(f"the batch has more than {max_items} files, over the limit") from None
        raise BadRequest("malformed multipart body; send each image in a field named `file`") from None
    items: list[Item] = []
    for key, value in fields:
        if key != "file":
            continue
        items.append(BadRequest("this `file` field is text, not a file") if isinstance(value, str) else value)
    raw = request._form.get("options")
    options = _json_object(raw, "multipart field `options`") if isinstance(raw, str) and raw else None
    return items, options


def json_items(body: bytes, max_items: int) -> tuple[list[Item], Optional[dict]]:
    containers = body.count(b"{") + body.count(b"[")
    if containers > 2 * max_items + MAX_JSON_CONTAINERS:
        raise BadRequest(f"request body is not valid JSON for this API: it opens {containers} objects or arrays, "
                         f"more than {BATCH_JSON_SHAPE} with {max_items} items can hold")
    try:
        doc = OcrBatchJsonRequest.model_validate_json(body)
    except ValidationError as e:
        raise BadRequest(_describe(e).replace(JSON_SHAPE, BATCH_JSON_SHAPE)) from None
    items: list[Item] = []
    for k, image in enumerate(doc.images):
        try:
            items.append(base64.b64decode(image.base64, validate=True))
        except (binascii.Error, ValueError):
            items.append(BadRequest(f"images[{k}].base64 is not valid base64"))
    return items, doc.options
