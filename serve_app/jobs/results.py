"""Finished jobs' results, kept until their time to live, with a share per
client (serve_app/http/clients.py: a named token, else the address).

The store holds at most `max_finished` results and `max_finished_bytes` of
them (counted as stored: the result's JSON bytes). One client may hold at
most `client_share` of each. Before its TTL a result goes only when its own
client is over its share, or when that client's new result puts the store
over its bounds: that client's oldest go first, never another client's.
A client whose share is full, or that would need room the store has not
got (every result held by others), is refused its next job with a 503 and
Retry-After (`room_for`, at submit) instead. So one client's oversized
result or 10,000 tiny jobs evict that client's own results, and many
clients at once are told to wait, never given each other's results' room.

This is the sqlite backend's (in-memory) book-keeping; the Redis backend
keeps the same rules in its Lua scripts (serve_app.jobs.redis_book). No Ray import."""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional


ALL = object()  # to_evict(client=ALL): every client's share (after recovery)


class ResultShares:
    def __init__(self, max_finished: int, max_finished_bytes: int, client_share: float):
        self.max_count = max_finished
        self.max_bytes = max_finished_bytes
        self.share_count = max(1, int(max_finished * client_share))
        self.share_bytes = max(1, int(max_finished_bytes * client_share))
        self.order: "OrderedDict[str, tuple[str, float, int]]" = OrderedDict()  # job -> (client, finished, size)
        self.by_client: dict[str, "OrderedDict[str, int]"] = {}  # client -> its jobs, oldest first -> size
        self.client_bytes: dict[str, int] = {}
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self.order

    def add(self, job_id: str, client: str, finished: float, size: int) -> None:
        if job_id in self.order:
            return
        self.order[job_id] = (client, finished, size)
        self.by_client.setdefault(client, OrderedDict())[job_id] = size
        self.client_bytes[client] = self.client_bytes.get(client, 0) + size
        self.total_bytes += size

    def remove(self, job_id: str) -> None:
        entry = self.order.pop(job_id, None)
        if entry is None:
            return
        client, _, size = entry
        mine = self.by_client[client]
        del mine[job_id]
        self.client_bytes[client] -= size
        self.total_bytes -= size
        if not mine:
            del self.by_client[client], self.client_bytes[client]

    def client_over(self, client: str) -> bool:
        return (len(self.by_client.get(client, ())) > self.share_count
                or self.client_bytes.get(client, 0) > self.share_bytes)

    def oldest_finished(self) -> Optional[float]:
        return next(iter(self.order.values()))[1] if self.order else None

    def room_for(self, client: str, unfinished: int) -> bool:
        """Whether a new job of `client` has room for its result, with
        `unfinished` jobs (everyone's) still to finish: the store within its
        bounds, or the client holding results of its own to give up."""
        if self.by_client.get(client):
            return True
        return len(self.order) + unfinished < self.max_count and self.total_bytes < self.max_bytes

    def to_evict(self, now: float, ttl_s: float, client: Optional[str | object] = None) -> list[str]:
        """Ids to drop now (and drops them here): those past the TTL, then
        `client`'s oldest while it is over its share or the store over its
        bounds (ALL: every client's over its share)."""
        gone = []
        for job_id, (_, finished, _) in self.order.items():  # oldest finished first
            if now - finished <= ttl_s:
                break
            gone.append(job_id)
        for job_id in gone:
            self.remove(job_id)
        over = list(self.by_client) if client == ALL else [client] if client is not None else []
        for c in over:
            # (the store over its bounds: never its newest, which its job was promised room for)
            while c in self.by_client and (self.client_over(c) or (
                    client != ALL and len(self.by_client[c]) > 1
                    and (len(self.order) > self.max_count or self.total_bytes > self.max_bytes))):
                oldest = next(iter(self.by_client[c]))
                self.remove(oldest)
                gone.append(oldest)
        return gone
