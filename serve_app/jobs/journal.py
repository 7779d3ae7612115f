"""The job store's journal: every accepted job in a SQLite file, so that a
restarted JobStore replica picks its jobs up again (unfinished ones run
again; finished ones keep their results until they expire).

A job is written (and committed) before its submit is answered, and again
when it finishes; its image is dropped from the file then. Write-ahead
logging with synchronous=FULL: a commit is fsynced before it returns, so an
accepted job survives the process dying and the machine losing power.

No Ray import: unit-tested on its own."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from serve_app.jobs.state import Job, JobStatus
from serve_app.core.request_options import parse_options

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
    finished REAL,
    fingerprint TEXT,
    client   TEXT
)
"""
# A job's callback delivery (serve_app.jobs.callbacks), a row of its own: a
# pending delivery outlives its job's result (it is retried for hours).
CALLBACKS = """
CREATE TABLE IF NOT EXISTS callbacks (
    job_id TEXT PRIMARY KEY,
    state  TEXT NOT NULL,
    record TEXT NOT NULL
)
"""
COLUMNS = "job_id, status, created, key, options, kind, result, error, finished, fingerprint, client"


def journal_path(template: str, app_name: str) -> str:
    """jobs.journal with `{app}` (the application's name) and `{uid}` (this
    user's id) filled in, so that two applications, or two users' services
    on one machine, never share a file."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in (app_name or "default"))
    return template.replace("{app}", safe).replace("{uid}", str(os.getuid()))


class JobJournal:
    """Not thread-safe: use it from one thread (the store runs it on its own
    single-thread executor, off the event loop)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        # Only this user may read the jobs (images and results): folder 0700,
        # file 0600 (SQLite gives its -wal and -shm files the file's mode).
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.path.parent.stat().st_uid == os.getuid():
            os.chmod(self.path.parent, 0o700)
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        os.chmod(self.path, 0o600)
        self.db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # each commit fsynced: durable before the 202
        self.db.execute(SCHEMA)
        self.db.execute(CALLBACKS)
        have = {row[1] for row in self.db.execute("PRAGMA table_info(jobs)")}
        if "fingerprint" not in have:  # a file written before idempotency was scoped to the payload
            self.db.execute("ALTER TABLE jobs ADD COLUMN fingerprint TEXT")
        if "client" not in have:  # a file written before results were shared out by client
            self.db.execute("ALTER TABLE jobs ADD COLUMN client TEXT")

    @contextlib.contextmanager
    def _tx(self):
        """One transaction (one fsynced commit) for the statements in the block."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def add(self, job: Job) -> None:
        """An accepted job, with its image (options as their JSON dict) and its callback, if any."""
        with self._tx():
            self.db.execute(
                "INSERT OR REPLACE INTO jobs (job_id, status, created, key, options, image, kind, fingerprint, "
                "client) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (job.job_id, job.status.value, job.created, job.key, json.dumps(job.options.to_dict()),
                 *_encode(job.image), job.fingerprint, job.client))
            if job.callback is not None:
                self._put_callback(job.job_id, job.callback)

    def _put_callback(self, job_id: str, rec: dict) -> None:
        self.db.execute("INSERT OR REPLACE INTO callbacks (job_id, state, record) VALUES (?, ?, ?)",
                        (job_id, rec["state"], json.dumps(rec)))

    def callback(self, job_id: str, rec: dict, job_kept: bool = True) -> None:
        """A delivery's new state; one that is done and whose job is gone leaves the file."""
        if not job_kept and rec["state"] not in ("waiting", "pending"):
            self.db.execute("DELETE FROM callbacks WHERE job_id = ?", (job_id,))
        else:
            self._put_callback(job_id, rec)

    def forget_callback(self, job_id: str) -> None:
        self.db.execute("DELETE FROM callbacks WHERE job_id = ?", (job_id,))

    def callbacks(self) -> Iterator[tuple[str, dict]]:
        """Every delivery in the file (recovery)."""
        for job_id, record in self.db.execute("SELECT job_id, record FROM callbacks"):
            yield job_id, json.loads(record)

    def probe(self) -> None:
        """Raises if the file cannot be read (health check)."""
        self.db.execute("SELECT count(*) FROM jobs WHERE rowid < 0").fetchone()

    def image(self, job_id: str) -> Any:
        """An unfinished job's image (recovered jobs load it only when they run)."""
        row = self.db.execute("SELECT image, kind FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None or row[0] is None:
            return None
        return _decode(row[0], row[1])

    def stream(self) -> Iterator[Job]:
        """Every job in the file, oldest first, one row at a time and
        without images (see image()): recovery holds no image in memory."""
        for row in self.db.execute(f"SELECT {COLUMNS} FROM jobs ORDER BY created"):
            yield _job(row)

    def finish(self, job: Job) -> None:
        """A done job: its status, result or error, and its callback made due; the image leaves the file."""
        with self._tx():
            self.db.execute(
                "UPDATE jobs SET status = ?, result = ?, error = ?, finished = ?, image = NULL WHERE job_id = ?",
                (job.status.value, job.result_json.decode() if job.result_json is not None else None,
                 _json(job.error), job.finished, job.job_id))
            if job.callback is not None:
                self._put_callback(job.job_id, job.callback)

    def delete(self, job_ids: Iterable[str]) -> None:
        """Jobs gone (expired, evicted, rolled back), with their deliveries unless one is still to be sent."""
        ids = [(j,) for j in job_ids]
        with self._tx():
            self.db.executemany("DELETE FROM jobs WHERE job_id = ?", ids)
            self.db.executemany("DELETE FROM callbacks WHERE job_id = ? AND state != 'pending'", ids)

    def load(self) -> list[Job]:
        """Every job in the file, oldest first; unfinished ones with their
        image, finished ones with their result or error (for tests and
        tools: recovery uses stream())."""
        jobs = list(self.stream())
        for job in jobs:
            if not job.status.done:
                job.image = self.image(job.job_id)
        return jobs

    def close(self) -> None:
        self.db.close()


def _job(row: tuple) -> Job:
    job_id, status, created, key, options, kind, result, error, finished, fingerprint, client = row
    return Job(job_id=job_id, created=created, status=JobStatus(status), key=key,
               options=parse_options(json.loads(options) if options is not None else None),
               result_json=result.encode() if result is not None else None, client=client or "",
               error=json.loads(error) if error is not None else None,
               finished=finished, fingerprint=fingerprint)


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


# For the Redis backend (serve_app.jobs.redis_book): the same encoding of images.
encode_image = _encode
decode_image = _decode
