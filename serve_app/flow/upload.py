"""What an upload is, decided once where the request enters: its kind (an
image, or a document with pages), its format, its size in bytes (the byte
limit is checked here and nowhere else on the way in) and its content
digest (the one hash of a request's bytes: the result cache's key and the
job book's idempotency fingerprint). Every later step reads the typed
`Upload` instead of asking the bytes again. No Ray import.

A document is a container of pages: a PDF, or a TIFF of two pages or more
(a one-page TIFF is an image). Another container is one more entry in
DOCUMENT_FORMATS and a page source in serve_app.flow.documents.open_document."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import numpy as np

from serve_app.core.engine_config import ImageLimits
from serve_app.flow.documents import is_document, is_pdf
from serve_app.core.errors import BadImage

IMAGE = "image"
DOCUMENT = "document"
Kind = Literal["image", "document"]

# format -> whether the bytes (or the file at a path) are of it: the
# multi-page containers read as documents.
DOCUMENT_FORMATS: dict[str, Callable[[Any], bool]] = {
    "pdf": is_pdf,
    "tiff": is_document,  # after "pdf": what is a document and not a PDF is a multi-page TIFF
}


@dataclass(frozen=True)
class Upload:
    """One input to read: encoded bytes, a decoded array, or a path (the
    handle API and the library take those two as well)."""

    data: Any
    kind: Kind = IMAGE
    format: Optional[str] = None  # a document's format ("pdf", "tiff"); None for an image

    @property
    def is_document(self) -> bool:
        return self.kind == DOCUMENT

    @property
    def nbytes(self) -> int:
        if isinstance(self.data, np.ndarray):
            return int(self.data.nbytes)
        if isinstance(self.data, (bytes, bytearray, memoryview)):
            return len(self.data)
        return 0


def document_format(data: Any) -> Optional[str]:
    """The document format `data` is in (by its magic bytes); None: an image."""
    if isinstance(data, np.ndarray):
        return None
    for name, matches in DOCUMENT_FORMATS.items():
        if matches(data):
            return name
    return None


def upload_of(data: Any, limits: Optional[ImageLimits] = None, what: str = "image") -> Upload:
    """`data` as an Upload: its kind decided by its magic bytes, and bytes
    over limits.max_bytes refused (TooLarge naming `what` and both sizes).
    An Upload is returned as it is."""
    if isinstance(data, Upload):
        return data
    if not isinstance(data, (bytes, bytearray, memoryview, np.ndarray, str, Path)):
        raise BadImage(f"an image is bytes, a path or a numpy array, not {type(data).__name__}")
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    fmt = document_format(data)
    if limits is not None and isinstance(data, bytes):
        limits.check_bytes(len(data), "PDF" if fmt == "pdf" else what)
    return Upload(data, DOCUMENT if fmt else IMAGE, fmt)


# -- the one content hash -------------------------------------------------------------


def content_digest(data: Any) -> Optional[str]:
    """sha256 of an input's content: bytes as they are, an array with its
    shape and dtype; None for a path (its file may change under its name)."""
    if isinstance(data, Upload):
        data = data.data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return hashlib.sha256(data).hexdigest()
    if isinstance(data, np.ndarray):
        h = hashlib.sha256(f"{data.shape}|{data.dtype.str}|".encode())
        h.update(np.ascontiguousarray(data).data)
        return h.hexdigest()
    return None


def content_key(data: Any, options: Any, model_id: str = "") -> Optional[str]:
    """The key of (input, options, model): what a result depends on. The
    lane (`priority`) is left out: it orders work, never changes a result.
    None when the input is not hashable by content (a path)."""
    digest = content_digest(data)
    if digest is None:
        return None
    opts = options.key_dict() if hasattr(options, "key_dict") else options
    if isinstance(opts, dict) and "priority" in opts:
        opts = {k: v for k, v in opts.items() if k != "priority"}
    return hashlib.sha256(f"{digest}|{json.dumps(opts, sort_keys=True, default=str)}|{model_id}".encode()).hexdigest()
