"""A job's state: the status enum and the `Job` record that moves through it
(queued -> running -> succeeded | failed). No Ray import."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from .options import OcrOptions


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
    result: Optional[dict] = None
    error: Optional[dict] = None  # {"code", "message"}
    finished: Optional[float] = None
    # A document's progress while it runs (pages read, pages in all).
    pages_done: Optional[int] = None
    pages_total: Optional[int] = None

    def progress(self, done: int, total: int) -> None:
        self.pages_done, self.pages_total = done, total

    def start(self) -> None:
        self.status = JobStatus.RUNNING

    def succeed(self, result: dict) -> None:
        self.result = result
        self._finish(JobStatus.SUCCEEDED)

    def fail(self, code: str, message: str) -> None:
        self.error = {"code": code, "message": message}
        self._finish(JobStatus.FAILED)

    def requeue(self) -> None:
        """After a restart: a job that was running when the store died runs
        again (a document from its first page)."""
        if not self.status.done:
            self.status = JobStatus.QUEUED
        self.pages_done = 0 if self.pages_total is not None else None

    def _finish(self, status: JobStatus) -> None:
        self.status = status
        self.image = None  # the result is kept, the image is not
        self.finished = time.time()

    def view(self) -> dict:
        """The HTTP body of `GET /v1/ocr/jobs/{job_id}`."""
        out: dict[str, Any] = {"job_id": self.job_id, "status": self.status.value}
        pages = (self.result or {}).get("document", {}).get("pages")  # a finished document (also once recovered)
        if pages is not None:
            out.update(pages_done=pages, pages_total=pages)
        elif self.pages_total is not None:
            out.update(pages_done=self.pages_done, pages_total=self.pages_total)
        if self.result is not None:
            out.update(self.result)
        if self.error is not None:
            out["error"] = self.error
        return out
