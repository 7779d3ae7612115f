"""`GET /v1/ocr/jobs/{job_id}/pages` (issue 48, item 4): a document job's
pages as NDJSON, one line per page in page order, as each is read. The
route (serve_app/http/routes/jobs.py) asks the JobStore for one page at a
time (JobStore.page: the pages a running job has read are kept in its
book, SQLite or Redis, until it ends) and polls every POLL_S while the next
one is not read yet; once the job has ended, the rest come from its stored
result, also one page a call (FinishedPages). Every stream, of a running job
or an ended one, holds one of the stream slots; each line is sent when the
reader has taken the last (the HTTP server's flow control), so a slow reader
holds one page in the ingress. Here, without HTTP: the slots, and a
finished result's pages one at a time. With `?format=markdown` each line is
{"page", "markdown"}: the page as format=markdown writes it (page_markdown).
No Ray import."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Optional

from serve_app.core.errors import Overloaded
from serve_app.jobs.state import encode_result

POLL_S = 0.5  # a stream's poll of the store while its next page is not read yet
STREAMS_PER_CLIENT = 4  # open streams one client may hold per ingress replica
STREAMS = 64  # open streams per ingress replica, every client's


class StreamSlots:
    """Open page streams, by client: a client past its share, or the
    replica past its total, is refused (503) before a stream starts. A
    place is given back once (`give` again, or by a finalizer, is a no-op)."""

    def __init__(self, per_client: int = STREAMS_PER_CLIENT, total: int = STREAMS):
        self.per_client, self.total = per_client, total
        self.open: dict[str, int] = {}
        self.held: dict[int, str] = {}  # place -> client
        self._ids = itertools.count()

    def take(self, client: str) -> int:
        if len(self.held) >= self.total:
            raise Overloaded(f"{len(self.held)} job page streams are open here; retry shortly", retry_after_s=2)
        if self.open.get(client, 0) >= self.per_client:
            raise Overloaded(f"this client has {self.per_client} job page streams open here, its share; close one "
                             f"(or read the job's result)", retry_after_s=2)
        place = next(self._ids)
        self.held[place] = client
        self.open[client] = self.open.get(client, 0) + 1
        return place

    def give(self, place: int) -> None:
        client = self.held.pop(place, None)
        if client is None:
            return
        self.open[client] -= 1
        if not self.open[client]:
            del self.open[client]


def page_index(blob: Optional[bytes]) -> Optional[dict[int, Any]]:
    """Where each page of a finished document's stored result lies in it
    (number -> (start, end)), None when the result is not a document's.
    Parsed once; a page is then a slice of the stored bytes, as the result
    holds it (encode_result's bytes are the same nested or alone)."""
    if not blob:
        return None
    doc: Any = json.loads(blob)
    if not isinstance(doc, dict) or "document" not in doc:
        return None
    out: dict[int, Any] = {}
    at = 0
    for page in doc.get("pages", []):
        enc = encode_result(page)
        found = blob.find(enc, at)
        out[int(page.get("page", 0))] = (found, found + len(enc)) if found >= 0 else enc
        at = found + len(enc) if found >= 0 else at
    return out


class FinishedPages:
    """A finished document's pages one at a time, for GET .../pages: the
    stored result and its page_index, kept for the few results being
    streamed (least recently used out past max_bytes), so that a stream
    holds one page at a time in the ingress and the store parses a result
    once, not once a page. `load()` fetches the stored result."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, asyncio.Future] = OrderedDict()
        self.sizes: dict[str, int] = {}

    async def page(self, job_id: str, n: int, load: Callable[[], Awaitable[Optional[bytes]]]
                   ) -> tuple[bool, Optional[int], Optional[bytes]]:
        """(is a document, the number of its first page from `n` on, that
        page's bytes); (True, None, None) past the last page."""
        entry = self.entries.get(job_id)
        if entry is None:
            entry = asyncio.get_running_loop().create_future()
            self.entries[job_id] = entry
            try:
                blob = await load()
                index = await asyncio.to_thread(page_index, blob)
            except BaseException as e:
                del self.entries[job_id]
                entry.set_exception(e)
                entry.exception()  # (retrieved: a waiter may not exist)
                raise
            entry.set_result((blob, index, sorted(index or ())))
            self.sizes[job_id] = len(blob or b"")
            self._evict(keep=job_id)
        else:
            self.entries.move_to_end(job_id)
        blob, index, numbers = await asyncio.shield(entry)
        if index is None:
            return False, None, None
        at = bisect.bisect_left(numbers, n)
        if at == len(numbers):
            return True, None, None
        number = numbers[at]
        span = index[number]
        return True, number, (blob[span[0]:span[1]] if isinstance(span, tuple) else span)

    def forget(self, job_id: str) -> None:
        self.entries.pop(job_id, None)
        self.sizes.pop(job_id, None)

    def _evict(self, keep: str) -> None:
        while sum(self.sizes.values()) > self.max_bytes and len(self.entries) > 1:
            oldest = next(iter(self.entries))
            if oldest == keep:
                self.entries.move_to_end(oldest)
                continue
            self.forget(oldest)


async def finished_page(pages: FinishedPages, job_id: str, n: int, head: dict,
                        load: Callable[[], Awaitable[Optional[bytes]]]) -> tuple[dict, Optional[bytes]]:
    """A succeeded job's (head, its first page from `n` on): the head says
    whether it is a document and which page it is (`page`)."""
    document, number, blob = await pages.page(job_id, n, load)
    return {**head, "document": document, "page": number}, blob


async def job_page(pages: FinishedPages, job: Any, n: int) -> tuple[dict, Optional[bytes]]:
    """The SQLite book's page of a job: while it runs, page `n` if read
    (None before); once it has succeeded, its first page from `n` on, from
    its result (the head's `page` says which)."""
    head = job.page_head()
    if head["status"] != "succeeded":
        return head, job.page_results.get(n)

    async def stored() -> Optional[bytes]:
        return job.result_json

    return await finished_page(pages, job.job_id, n, head, stored)


def redis_page_head(status: bytes, done: Any, total: Any, document: Any, error: Any) -> dict:
    """The Redis book's _PAGE answer as a page head (page_head's fields)."""
    return {"status": status.decode(), "pages_done": int(done) if done else None,
            "pages_total": int(total) if total else None,
            "document": True if total else (bool(int(document)) if document else None),
            "error": json.loads(error) if error else None}


def error_line(head: dict) -> bytes:
    """The last line of a failed job's stream: its error, so a reader can tell it from the end of a document."""
    return encode_result({"status": head.get("status"), "error": head.get("error")}) + b"\n"


def page_markdown(line: bytes) -> bytes:
    """A page's NDJSON line as {"page", "markdown"} (serve_app.flow.markdown:
    from its regions when the job read structure, else its blocks)."""
    from serve_app.flow.markdown import render_markdown

    page = json.loads(line)
    return json.dumps({"page": page.get("page"), "markdown": render_markdown(page)}, ensure_ascii=False).encode() + b"\n"
