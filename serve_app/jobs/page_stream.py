"""`GET /v1/ocr/jobs/{job_id}/pages` (issue 48, item 4): a document job's
pages as NDJSON, one line per page in page order, as each is read. The
route (serve_app/http/routes/jobs.py) asks the JobStore for one page at a
time (JobStore.page: the pages a running job has read are kept in its
book, SQLite or Redis, until it ends) and polls every POLL_S while the next
one is not read yet; once the job has ended, the rest come from its stored
result. With `?format=markdown` each line is `{"page", "markdown"}`: the
page as format=markdown writes it (page_markdown). Here, without HTTP: the streams each client may hold open, and a
finished result's pages as lines. No Ray import."""

from __future__ import annotations

import itertools
import json
from typing import Any, Optional

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


def result_pages(blob: Optional[bytes], start: int) -> Optional[list[bytes]]:
    """A finished result's pages from number `start` on, each an NDJSON line
    as the result holds it; None when the result is not a document's."""
    if not blob:
        return None
    doc: Any = json.loads(blob)
    if not isinstance(doc, dict) or "document" not in doc:
        return None
    return [encode_result(page) + b"\n" for page in doc.get("pages", []) if int(page.get("page", 0)) >= start]


def page_markdown(line: bytes) -> bytes:
    """A page's NDJSON line as {"page", "markdown"} (serve_app.flow.markdown:
    from its regions when the job read structure, else its blocks)."""
    from serve_app.flow.markdown import render_markdown

    page = json.loads(line)
    return json.dumps({"page": page.get("page"), "markdown": render_markdown(page)}, ensure_ascii=False).encode() + b"\n"
