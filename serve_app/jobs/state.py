"""A job's state: the status enum and the `Job` record that moves through it
(queued -> running -> succeeded | failed). No Ray import."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from serve_app.core.request_options import OcrOptions
from serve_app.flow.upload import content_key


# A callback delivery's fields the status JSON shows (serve_app.jobs.callbacks' record).
CALLBACK_SHOWN = ("url", "webhook_id", "state", "attempts", "last_status", "last_error", "next_attempt_at",
                  "delivered_at")


class JobStatus(str, Enum):
    """The values are the HTTP JSON's `status` strings."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def done(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED)


@dataclass
class Job:
    job_id: str
    created: float
    status: JobStatus = JobStatus.QUEUED
    image: Any = None  # kept until the job is done
    options: OcrOptions = field(default_factory=OcrOptions)
    key: Optional[str] = None  # Idempotency-Key
    fingerprint: Optional[str] = None  # hash of the image and options: what the key stands for
    nbytes: int = 0  # image bytes counted against the store's bound until the job is done
    # A finished job's result as it is kept (its JSON, UTF-8): what the
    # result store's bounds count is what it holds, not a guess at a dict's size.
    result_json: Optional[bytes] = None
    client: str = ""  # who submitted it (serve_app/http/clients.py): its shares of the queue and the result store
    error: Optional[dict] = None  # {"code", "message"}
    started: Optional[float] = None  # when a worker took it (Unix seconds); not journaled
    finished: Optional[float] = None
    # A document's progress while it runs (pages read, pages in all).
    pages_done: Optional[int] = None
    pages_total: Optional[int] = None
    # Its callback delivery's record, if it named a callback_url (serve_app.jobs.callbacks).
    callback: Optional[dict] = None
    # While a document runs: its pages read so far (number -> JSON bytes), for
    # GET .../pages; dropped when it ends (its result holds them). Not journaled.
    page_results: dict[int, bytes] = field(default_factory=dict)
    page_bytes: int = 0
    # Whether its input is a document (a PDF, a multi-page TIFF), decided at
    # submit by its magic bytes; None: not known (a job recovered from an
    # older journal). GET .../pages of a job that is not one is a 400 at once.
    document: Optional[bool] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.document is None and self.image is not None:
            self.document = is_document_input(self.image)

    def progress(self, done: int, total: int, pages: Any = (), limit: int = 0) -> None:
        """Pages done of all, and the pages read since (their dicts), kept
        while their bytes fit `limit` (the result bound: past it the job
        fails result_too_large anyway)."""
        self.pages_done, self.pages_total = done, total
        if self.status is not JobStatus.RUNNING:
            return
        for page in pages:
            blob = encode_result(page)
            n = int(page["page"])
            before = len(self.page_results.get(n, b""))  # a retried attempt reads the same pages again
            if self.page_bytes - before + len(blob) > limit:
                return
            self.page_results[n] = blob
            self.page_bytes += len(blob) - before

    def page_head(self) -> dict:
        return {"status": self.status.value, "pages_done": self.pages_done, "pages_total": self.pages_total,
                "document": True if self.pages_total is not None else self.document, "error": self.error}

    def start(self, now: Optional[float] = None) -> None:
        self.status = JobStatus.RUNNING
        self.started = time.time() if now is None else now

    @property
    def result(self) -> Optional[dict]:
        return json.loads(self.result_json) if self.result_json is not None else None

    @property
    def result_size(self) -> int:
        """Bytes a finished job holds in the result store."""
        return len(self.result_json or b"") + len(json.dumps(self.error).encode() if self.error else b"")

    def succeed(self, result: dict | bytes) -> None:
        self.result_json = result if isinstance(result, bytes) else encode_result(result)
        self._finish(JobStatus.SUCCEEDED)

    def fail(self, code: str, message: str) -> None:
        self.error = {"code": code, "message": message}
        self._finish(JobStatus.FAILED)

    def requeue(self) -> None:
        """After a restart: a job that was running when the store died runs
        again (a document from its first page)."""
        if not self.status.done:
            self.status = JobStatus.QUEUED
            self.started = None
        self.pages_done = 0 if self.pages_total is not None else None
        self.page_results, self.page_bytes = {}, 0

    def _finish(self, status: JobStatus) -> None:
        self.status = status
        self.image = None  # the result is kept, the image is not
        self.page_results, self.page_bytes = {}, 0
        self.finished = time.time()

    def view(self) -> dict:
        """The HTTP body of `GET /v1/ocr/jobs/{job_id}` as a dict (the
        result parsed: the Python handle's; HTTP serves view_raw's bytes)."""
        head, blob = self.view_raw()
        return {**head, **json.loads(blob)} if blob is not None else head

    def view_raw(self) -> tuple[dict, Optional[bytes]]:
        """(status fields, the stored result's JSON bytes or None), the
        result not parsed: a 29 MB result parsed on the store's event loop
        took ~4 s a GET. job_body joins them into the body's bytes."""
        out: dict[str, Any] = {"job_id": self.job_id, "status": self.status.value, **self.times()}
        pages = document_pages(self.result_json)  # a finished document (also once recovered)
        if pages is not None:
            out.update(pages_done=pages, pages_total=pages)
        elif self.pages_total is not None:
            out.update(pages_done=self.pages_done, pages_total=self.pages_total)
            if self.status is JobStatus.RUNNING:
                out["progress"] = {"pages": self.pages_total, "done": self.pages_done}
        if self.error is not None:
            out["error"] = self.error
        if self.callback is not None:
            out["callback"] = {k: self.callback[k] for k in CALLBACK_SHOWN if self.callback.get(k) is not None}
        return out, self.result_json

    def times(self) -> dict[str, float]:
        """When it was accepted, taken by a worker and finished (Unix
        seconds, ms precision), each once known: `started_at - created_at` is
        its wait in the queue. A job recovered from the journal after a
        restart has no `started_at` of its earlier run."""
        stamps = {"created_at": self.created, "started_at": self.started, "finished_at": self.finished}
        return {k: round(v, 3) for k, v in stamps.items() if v is not None}


def is_document_input(image: Any) -> Optional[bool]:
    """Whether a job's input is read as a document (serve_app.flow.upload's
    rule, by its magic bytes); None when that cannot be told here."""
    from serve_app.flow.upload import document_format

    if isinstance(image, (bytes, bytearray, memoryview)):
        return document_format(image if isinstance(image, bytes) else bytes(image)) is not None
    return None


def encode_result(result: dict) -> bytes:
    return json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode()


def document_pages(blob: Optional[bytes]) -> Optional[int]:
    """A stored document result's page count, from its head (encode_result
    of {"request_id", "document": {"type", "pages"}, ...}: within its first
    few hundred bytes), without parsing the whole result; None for an image's."""
    if not blob:
        return None
    head = blob[:512]
    at = head.find(b'"document":{')
    if at < 0:
        return None
    end = head.find(b"}", at)
    if end < 0:
        return None
    try:
        pages = json.loads(head[at + len(b'"document":'):end + 1]).get("pages")
    except ValueError:
        return None
    return pages if isinstance(pages, int) else None


def job_body(head: dict, blob: Optional[bytes]) -> bytes:
    """The JSON bytes of view_raw's (head, result): the head's fields, then
    the result's, as view() would serialise them, the result spliced in as
    stored (its keys are not the head's)."""
    first = json.dumps(head, ensure_ascii=False, separators=(",", ":")).encode()
    if not blob or blob.strip() in (b"{}", b""):
        return first
    return first[:-1] + b"," + blob.strip()[1:]


def image_nbytes(image: Any) -> int:
    return int(getattr(image, "nbytes", None) or len(image)) if image is not None else 0


def fingerprint(image: Any, options: OcrOptions) -> str:
    """What an Idempotency-Key stands for: the image's content and the
    options (the one content hash, serve_app.flow.upload.content_key; the lane
    is not the payload)."""
    key = content_key(image, options)
    if key is None:
        raise ValueError(f"a job's image is bytes or an array, not {type(image).__name__}")
    return key


def result_too_large(size: int, limit: int) -> str:
    return (f"the job's result is {size} bytes, over the limit of {limit} (jobs.max_result_bytes, at most "
            f"jobs.client_share of max_finished_bytes); "
            f"send the document in parts, or fewer pages")
