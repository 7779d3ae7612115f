"""Reading the image and options from an HTTP request (serve_app.http.body):
the three request shapes, one size limit for all of them (Content-Length
before reading, a count while streaming), and the 400/413/415 a bad request
gets. Starlette requests built by hand; no server, no Ray."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from serve_app.core.engine_config import ImageLimits
from serve_app.core.errors import BadRequest, TooLarge, UnsupportedMediaType
from serve_app.http.body import body_limit, content_length, image_and_options
from serve_app.core.request_options import OcrOptions
from starlette.requests import Request

LIMITS = ImageLimits(max_bytes=1000)
LIMIT = body_limit(LIMITS)  # the body may be larger than the image (base64, multipart framing)


class Body:
    """A request body arriving in chunks; records how much was received."""

    def __init__(self, chunks: list[bytes]):
        self.chunks = list(chunks) or [b""]
        self.received = 0

    async def receive(self):
        chunk = self.chunks.pop(0)
        self.received += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}


def request(body: bytes | list[bytes], ctype: str | None, length: bool = True, **headers) -> tuple[Request, Body]:
    chunks = body if isinstance(body, list) else [body]
    hdrs = dict(headers)
    if ctype is not None:
        hdrs["content-type"] = ctype
    if length:
        hdrs.setdefault("content-length", str(sum(map(len, chunks))))
    scope = {"type": "http", "method": "POST", "path": "/v1/ocr", "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in hdrs.items()]}
    src = Body(chunks)
    return Request(scope, src.receive), src


def read_upload(body, ctype, **kw):
    """(the Upload, the options) the door makes of a body."""
    req, _ = request(body, ctype, **kw)
    return asyncio.run(image_and_options(req, LIMITS))


def read(body, ctype, **kw):
    """(the upload's bytes, the options)."""
    upload, opts = read_upload(body, ctype, **kw)
    return upload.data, opts


def multipart(fields: list[tuple[str, str | None, bytes]], boundary: str = "b") -> tuple[bytes, str]:
    out = b""
    for name, filename, value in fields:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def js(doc) -> bytes:
    return json.dumps(doc).encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- the three shapes ---------------------------------------------------------------
@pytest.mark.parametrize("ctype", ["image/png", "image/jpeg; q=1", "application/octet-stream"])
def test_a_raw_body_is_the_image_with_default_options(ctype):
    assert read(b"\x89PNG...", ctype) == (b"\x89PNG...", OcrOptions())


def test_json_base64_with_options():
    data, opts = read(js({"image": {"base64": b64(b"img")}, "options": {"det": False, "cls": True}}), "application/json")
    assert data == b"img" and opts == OcrOptions(det=False, cls=True)
    assert read(js({"image": {"base64": b64(b"img")}, "options": None}), "application/json") == (b"img", OcrOptions())


def test_multipart_file_with_an_options_field():
    body, ctype = multipart([("file", "a.png", b"img-bytes"), ("options", None, b'{"return_chars": true}')])
    assert read(body, ctype) == (b"img-bytes", OcrOptions(return_chars=True))
    body, ctype = multipart([("file", "a.png", b"img-bytes")])
    assert read(body, ctype) == (b"img-bytes", OcrOptions())


def test_a_chunked_multipart_body_is_parsed_from_what_was_read():
    body, ctype = multipart([("file", "a.png", b"x" * 900)])
    data, _ = read([body[i:i + 100] for i in range(0, len(body), 100)], ctype, length=False)
    assert data == b"x" * 900


# -- one size limit ---------------------------------------------------------------------
def test_a_declared_length_over_the_limit_is_refused_before_reading():
    req, src = request([b"x" * 10] * 10, "image/png", **{"content-length": str(LIMIT + 1)})
    with pytest.raises(TooLarge) as e:
        asyncio.run(image_and_options(req, LIMITS))
    assert src.received == 0
    assert str(LIMIT + 1) in e.value.message and e.value.status == 413


@pytest.mark.parametrize("shape", ["raw", "json", "multipart"])
def test_a_chunked_body_over_the_limit_is_refused_while_streaming(shape):
    if shape == "raw":
        body, ctype = b"x" * (LIMIT + 1), "image/png"
    elif shape == "json":
        body, ctype = js({"image": {"base64": "A" * LIMIT}}), "application/json"
    else:
        body, ctype = multipart([("file", "a.png", b"x" * LIMIT)])
    chunks = [body[i:i + 4096] for i in range(0, len(body), 4096)]
    req, src = request(chunks, ctype, length=False)
    with pytest.raises(TooLarge) as e:
        asyncio.run(image_and_options(req, LIMITS))
    assert e.value.message == f"request body is over the limit of {LIMIT} bytes"
    assert src.received <= LIMIT + 4096  # stopped at the chunk that crossed the limit


@pytest.mark.parametrize("shape", ["raw", "json", "multipart"])
def test_an_image_over_the_limit_is_refused_in_every_shape(shape):
    img = b"q" * (LIMITS.max_bytes + 1)
    if shape == "raw":
        body, ctype = img, "application/octet-stream"
    elif shape == "json":
        body, ctype = js({"image": {"base64": b64(img)}}), "application/json"
    else:
        body, ctype = multipart([("file", "a.png", img)])
    with pytest.raises(TooLarge, match=f"image is {len(img)} bytes, over the limit of {LIMITS.max_bytes}"):
        read(body, ctype)


@pytest.mark.parametrize("raw,value", [("0", 0), ("123", 123), (" 7 ", 7)])
def test_content_length_is_parsed_one_way(raw, value):
    assert content_length({"content-length": raw}) == value
    assert content_length({}) is None


@pytest.mark.parametrize("raw", ["-1", "1e3", "12abc", "", "١٢"])
def test_a_bad_content_length_is_400(raw):
    with pytest.raises(BadRequest, match="bad Content-Length header"):
        content_length({"content-length": raw})


# -- bad requests ---------------------------------------------------------------------------
@pytest.mark.parametrize("payload,needle", [
    ('{"image": {"base64": "!!notbase64!!"}}', "image.base64 is not valid base64"),
    ('{"image": "abc"}', "bad field image"),
    ('{"image": {"base64": ""}, "options": {"nope": 1}}', "bad option nope"),
    ('{"image": {"base64": ""}, "options": {"det": "maybe"}}', "bad option det"),
    ('{"image": {"base64": ""}, "options": [1]}', "bad field options"),
    ('{"image": {"base64": ""}, "extra": 1}', "bad field extra"),
    ('{"image": {"url": "http://127.0.0.1:9/x.png"}}', "bad field image"),
    ('{"image": {"base64": 5}}', "bad field image.base64"),
    ("[1, 2", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ("[" * 100000 + "]" * 100000, "not valid JSON"),
])
def test_a_malformed_json_body_is_400_naming_what_is_wrong(payload, needle):
    with pytest.raises(BadRequest) as e:
        asyncio.run(image_and_options(request(payload.encode(), "application/json")[0], ImageLimits()))
    assert needle in e.value.message, e.value.message


@pytest.mark.parametrize("body,needle", [
    (multipart([("other", None, b"v")])[0], "no file field named `file`"),
    (multipart([("file", None, b"text, not a file")])[0], "no file field named `file`"),
    (multipart([("file", "a.png", b"img"), ("options", None, b"{nope")])[0], "`options` is not valid JSON"),
    (multipart([("file", "a.png", b"img"), ("options", None, b"[1]")])[0], "`options` must be a JSON object"),
    (b'--x\r\nContent-Disposition: form-data; name="file"\r\n\r\nabc', "malformed multipart body"),
])
def test_a_bad_multipart_body_is_400(body, needle):
    with pytest.raises(BadRequest) as e:
        read(body, "multipart/form-data; boundary=b")
    assert needle in e.value.message


@pytest.mark.parametrize("ctype,needle", [("text/plain", "unsupported Content-Type 'text/plain'"),
                                          ("", "missing Content-Type"), (None, "missing Content-Type")])
def test_other_media_types_are_415_before_the_body_is_read(ctype, needle):
    req, src = request(b"hello", ctype)
    with pytest.raises(UnsupportedMediaType) as e:
        asyncio.run(image_and_options(req, LIMITS))
    assert needle in e.value.message and e.value.status == 415
    assert src.received == 0


# -- hostile clients (issue 13) --------------------------------------------------------------
def test_a_body_that_stops_arriving_is_408_and_one_that_never_reached_the_replica_is_503():
    """A client that sent part of its body and stalls is slow: 408. Not one
    byte within the deadline is what a replica sees when Serve's proxy
    retried the request after the replica that took its body died (the
    kill test met it): 503 with Retry-After, so the client retries."""
    from serve_app.core.errors import RequestTimeout, Unavailable
    from serve_app.http.body import read_body

    def stalling(first: list):
        async def receive():
            if first:
                return {"type": "http.request", "body": first.pop(), "more_body": True}
            await asyncio.Event().wait()  # nothing more ever comes
        return receive

    scope = {"type": "http", "method": "POST", "path": "/v1/ocr", "query_string": b"",
             "headers": [(b"content-type", b"image/png")]}
    with pytest.raises(RequestTimeout) as slow:
        asyncio.run(read_body(Request(scope, stalling([b"x" * 100])), LIMIT, timeout_s=0.05))
    assert slow.value.status == 408 and slow.value.code == "request_timeout" and "100 bytes" in slow.value.message
    with pytest.raises(Unavailable) as lost:
        asyncio.run(read_body(Request(scope, stalling([])), LIMIT, timeout_s=0.05))
    assert lost.value.status == 503 and lost.value.retry_after_s == 1 and "retry" in lost.value.message


def test_bodies_held_at_once_are_bounded_by_the_budget():
    from serve_app.core.errors import Overloaded
    from serve_app.http.body import BodyBudget, read_body

    budget = BodyBudget(1500)
    held_a, held_b = budget.hold(), budget.hold()
    asyncio.run(read_body(request([b"a" * 500, b"a" * 500], "image/png", length=False)[0], LIMIT, 1, held_a))
    assert budget.held == held_a.bytes == 1000
    with pytest.raises(Overloaded):
        asyncio.run(read_body(request([b"b" * 400, b"b" * 400], "image/png", length=False)[0], LIMIT, 1, held_b))
    assert held_b.bytes == 400  # the chunk taken before the refusal
    held_a.release()  # what the ingress's lease does when each request is done
    held_b.release()
    assert budget.held == 0


def test_json_with_more_structure_than_the_schema_is_refused_before_parsing():
    body = b'{"image": {"base64": ""}, "x": [' + b"{}," * 1_000_000 + b"{}]}"
    with pytest.raises(BadRequest, match="opens 1000004 objects or arrays"):
        asyncio.run(image_and_options(request(body, "application/json")[0], ImageLimits()))


@pytest.mark.parametrize("host,token,anonymous,refused", [
    ("127.0.0.1", False, False, False), ("localhost", False, False, False), ("::1", False, False, False),
    ("0.0.0.0", False, False, True), ("0.0.0.0", True, False, False), ("0.0.0.0", False, True, False),
    ("10.1.2.3", False, False, True),
    # A host that could not be read is not taken for loopback: it may be any address.
    (None, False, False, True), (None, True, False, False), (None, False, True, False),
])
def test_a_service_beyond_loopback_needs_a_token_or_allow_anonymous(host, token, anonymous, refused):
    from serve_app.core.errors import ConfigError
    from serve_app.http.headers import check_exposure

    if refused:
        with pytest.raises(ConfigError, match="allow_anonymous"):
            check_exposure(host, token, anonymous)
    else:
        check_exposure(host, token, anonymous)


def test_a_multipart_options_field_full_of_objects_is_refused_unparsed():
    body, ctype = multipart([("file", "a.png", b"img"), ("options", None, b"[" + b"{}," * 300 + b"{}]")])
    with pytest.raises(BadRequest, match="more objects or arrays than options hold"):
        read(body, ctype)


def test_a_multipart_body_is_parsed_off_the_event_loop_and_its_text_fields_stay_the_requests_form(monkeypatch):
    """Parsing scans every byte of a body (19 MB: 30-70 ms here) and spools
    a large file to disk: done in a worker thread, never on the loop that
    answers every other request. The text fields stay readable as the
    request's form (a job submit's `callback_url`)."""
    import threading

    from starlette import formparsers

    parser_class = formparsers.multipart.MultipartParser
    threads: set[int] = set()
    original = parser_class.write

    def write(self, data):
        threads.add(threading.get_ident())
        return original(self, data)

    monkeypatch.setattr(parser_class, "write", write)
    big = bytes(range(256)) * (3 * 4096)  # 3 MiB: spooled to a file
    body, ctype = multipart([("file", "a.png", big), ("callback_url", None, b"https://example.com/cb")])
    req, _ = request(body, ctype)

    async def go():
        upload, _ = await image_and_options(req, ImageLimits(max_bytes=4 << 20))
        return upload.data, threading.get_ident(), (await req.form()).get("callback_url")

    data, loop_thread, callback = asyncio.run(go())
    assert data == big and callback == "https://example.com/cb"
    assert threads and loop_thread not in threads
