"""What an upload is (serve_app.flow.upload): its kind decided once by its
bytes, the byte limit checked there, and the one content hash shared by the
result cache and the job book. No Ray."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.core.engine_config import ImageLimits
from serve_app.core.errors import BadImage, TooLarge
from serve_app.jobs.book import fingerprint
from serve_app.core.request_options import OcrOptions
from serve_app.http.policies.result_cache import content_key
from serve_app.flow.upload import DOCUMENT, IMAGE, Upload, upload_of


def test_the_kind_is_decided_by_the_bytes_whatever_they_were_sent_as():
    assert upload_of(b"%PDF-1.7 rest") == Upload(b"%PDF-1.7 rest", DOCUMENT, "pdf")
    assert upload_of(b"\x00" * 100 + b"%PDF-1.4") == Upload(b"\x00" * 100 + b"%PDF-1.4", DOCUMENT, "pdf")  # PDFium's header window
    assert upload_of(b"\x89PNG....") == Upload(b"\x89PNG....", IMAGE, None)
    assert upload_of(bytearray(b"img")).data == b"img"  # bytes from any buffer
    arr = np.zeros((4, 5, 3), np.uint8)
    assert upload_of(arr).kind == IMAGE and upload_of(arr).nbytes == 60
    up = upload_of(b"img")
    assert upload_of(up) is up  # decided once: an Upload passes through as it is
    with pytest.raises(BadImage, match="not list"):
        upload_of([1, 2])


def test_a_document_on_disk_is_known_by_its_file(tmp_path):
    pdf, png = tmp_path / "a.pdf", tmp_path / "b.bin"
    pdf.write_bytes(b"%PDF-1.7 ...")
    png.write_bytes(b"\x89PNG....")
    assert upload_of(str(pdf)).is_document and not upload_of(png).is_document
    assert not upload_of(tmp_path / "missing").is_document  # unreadable: an image, refused when it is read


def test_the_byte_limit_is_checked_once_at_the_door_and_names_what_is_over():
    limits = ImageLimits(max_bytes=10)
    assert upload_of(b"x" * 10, limits).nbytes == 10
    with pytest.raises(TooLarge, match="image is 11 bytes, over the limit of 10"):
        upload_of(b"x" * 11, limits)
    with pytest.raises(TooLarge, match="PDF is 12 bytes, over the limit of 10"):
        upload_of(b"%PDF-1.7 xyz", limits)
    with pytest.raises(TooLarge, match="file is 11 bytes"):
        upload_of(b"x" * 11, limits, "file")


def test_one_content_hash_for_the_cache_and_the_job_book():
    opts = OcrOptions(return_chars=True)
    assert fingerprint(b"img", opts) == content_key(b"img", opts) == content_key(upload_of(b"img"), opts, "")
    assert content_key(b"img", opts, "model") != content_key(b"img", opts, "")  # the cache adds the model
    assert fingerprint(b"img", OcrOptions(priority="bulk")) == fingerprint(b"img", OcrOptions())  # not the lane
    a = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert fingerprint(a, opts) == fingerprint(a.copy(), opts) != fingerprint(a.reshape(4, 3), opts)
    assert content_key("some/path.png", opts) is None  # a name, not content: not cached
