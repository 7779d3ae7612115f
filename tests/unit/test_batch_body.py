"""Reading a POST /v1/ocr/batch body (serve_app.http.body.batch_items):
items in input order, a bad item an error of its own, the item bound; and a raw
application/pdf body checked against its type. No Ray."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.core.errors import BadRequest, TooLarge, UnsupportedMediaType
from serve_app.http.body import batch_items, read_body
from serve_app.flow.upload import Upload
from serve_app.core.request_options import OcrOptions
from test_http_body import LIMIT, LIMITS, b64, js, multipart, request


def items_of(body: bytes, ctype: str, max_items: int = 4):
    req, _ = request(body, ctype)

    async def go():
        raw = await read_body(req, LIMIT)
        items, opts = await batch_items(req, raw, LIMITS, max_items)
        return [i.data if isinstance(i, Upload) else i for i in items], opts  # an item's bytes, or its error

    return asyncio.run(go())


def test_json_items_in_input_order_with_a_bad_one_in_place():
    body = js({"images": [{"base64": b64(b"one")}, {"base64": "@@"}, {"base64": b64(b"three")}],
               "options": {"det": False}})
    items, opts = items_of(body, "application/json")
    assert items[0] == b"one" and items[2] == b"three"
    assert isinstance(items[1], BadRequest) and "images[1].base64" in items[1].message
    assert opts == OcrOptions(det=False)


def test_multipart_items_in_input_order_with_options():
    body, ctype = multipart([("file", "a.png", b"A"), ("file", "b.png", b"B"), ("options", None, b'{"cls": false}'),
                             ("file", "c.png", b"C")])
    items, opts = items_of(body, ctype)
    assert items == [b"A", b"B", b"C"] and opts == OcrOptions(cls=False)


def test_an_item_over_the_byte_limit_is_its_own_413():
    items, _ = items_of(js({"images": [{"base64": b64(b"x" * 1001)}, {"base64": b64(b"ok")}]}), "application/json")
    assert isinstance(items[0], TooLarge) and items[1] == b"ok"


@pytest.mark.parametrize("shape", ["json", "multipart"])
def test_more_items_than_allowed_is_413(shape):
    if shape == "json":
        body, ctype = js({"images": [{"base64": b64(b"a")}] * 5}), "application/json"
    else:
        body, ctype = multipart([("file", f"{k}.png", b"a") for k in range(9)])
    with pytest.raises(TooLarge) as e:
        items_of(body, ctype, max_items=4)
    assert e.value.status == 413


@pytest.mark.parametrize("body, ctype, error", [
    (js({"images": []}), "application/json", BadRequest),
    (js({"image": {"base64": "eA=="}}), "application/json", BadRequest),
    (b"raw", "image/png", UnsupportedMediaType),
])
def test_an_empty_or_wrong_batch_is_refused_whole(body, ctype, error):
    with pytest.raises(error):
        items_of(body, ctype)


def test_a_raw_pdf_body_is_checked_against_its_content_type():
    from test_http_body import read, read_upload

    data, _ = read(b"%PDF-1.7 ...", "application/pdf")
    assert data == b"%PDF-1.7 ..."
    upload, _ = read_upload(b"%PDF-1.7 ...", "application/octet-stream")  # known by its bytes, whatever the type
    assert (upload.kind, upload.format) == ("document", "pdf")
    assert read_upload(b"\x89PNG....", "application/octet-stream")[0].kind == "image"
    with pytest.raises(BadRequest, match="not a PDF"):
        read(b"\x89PNG....", "application/pdf")
