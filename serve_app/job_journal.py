"""The job store's journal: every accepted job in a SQLite file, so that a
restarted JobStore replica picks its jobs up again (unfinished ones run
again; finished ones keep their results until they expire).

A job is written (and committed) before its submit is answered, and again
when it finishes; its image is dropped from the file then. Write-ahead
logging with synchronous=NORMAL: a committed job survives the process dying
(the case that matters here: a replica killed or crashing), not necessarily
the machine losing power.

No Ray import: unit-tested on its own."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path
from typing import Any, Iterable, Optional

from .job_state import Job, JobStatus
from .options import parse_options

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id   TEXT PRIMARY KEY,
    status   TEXT NOT NULL,
    created  REAL NOT NULL,
    key      TEXT,
    options  TEXT,
    image    BLOB,
    kind     TEXT,
    result   TEXT,
    error    TEXT,
    finished REAL
)
"""


class JobJournal:
    """Not thread-safe: use it from one thread (the store runs it on its own
    single-thread executor, off the event loop)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(SCHEMA)

    def add(self, job: Job) -> None:
        """An accepted job, with its image (options as their JSON dict)."""
        self.db.execute(
            "INSERT OR REPLACE INTO jobs (job_id, status, created, key, options, image, kind)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job.job_id, job.status.value, job.created, job.key, json.dumps(job.options.to_dict()),
             *_encode(job.image)))

    def finish(self, job: Job) -> None:
        """A done job: its status, result or error; the image leaves the file."""
        self.db.execute(
            "UPDATE jobs SET status = ?, result = ?, error = ?, finished = ?, image = NULL WHERE job_id = ?",
            (job.status.value, _json(job.result), _json(job.error), job.finished, job.job_id))

    def delete(self, job_ids: Iterable[str]) -> None:
        self.db.executemany("DELETE FROM jobs WHERE job_id = ?", [(j,) for j in job_ids])

    def load(self) -> list[Job]:
        """Every job in the file, oldest first; unfinished ones with their
        image, finished ones with their result or error."""
        rows = self.db.execute(
            "SELECT job_id, status, created, key, options, image, kind, result, error, finished FROM jobs ORDER BY created")
        return [
            Job(job_id=job_id, created=created, status=JobStatus(status), key=key,
                options=parse_options(json.loads(options) if options is not None else None),
                image=_decode(image, kind) if image is not None else None,
                result=json.loads(result) if result is not None else None,
                error=json.loads(error) if error is not None else None,
                finished=finished)
            for job_id, status, created, key, options, image, kind, result, error, finished in rows
        ]

    def close(self) -> None:
        self.db.close()


def _json(doc: Optional[dict]) -> Optional[str]:
    return json.dumps(doc) if doc is not None else None


def _encode(image: Any) -> tuple[bytes, str]:
    """Encoded image bytes as they came, or an array in .npy format (no
    pickle: the file is data, never code)."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image), "bytes"
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.asarray(image), allow_pickle=False)
    return buf.getvalue(), "npy"


def _decode(blob: bytes, kind: str) -> Any:
    if kind == "npy":
        import numpy as np

        return np.load(io.BytesIO(blob), allow_pickle=False)
    return bytes(blob)
