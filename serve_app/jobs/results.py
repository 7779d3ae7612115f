"""Finished jobs' results, kept until their time to live, with a share per
client (serve_app.jobs.clients: the token, else the address).

The store holds at most `max_finished` results and `max_finished_bytes` of
them (counted as stored: the result's JSON bytes). One client may hold at
most `client_share` of each. Before its TTL a result goes only when
1. its own client is over its share (that client's oldest go first), or
2. the store is still over its bounds with every client within its share
   (many clients): then the oldest of the client that holds the most.
So one client's oversized result or 10,000 tiny jobs evict that client's
own results, never another's that is within its share.

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

    def to_evict(self, now: float, ttl_s: float, client: Optional[str | object] = None) -> list[str]:
        """Ids to drop now (and drops them here): those past the TTL, then
        `client`'s oldest while it is over its share, then the biggest
        holder's oldest while the store is over its bounds."""
        gone = []
        for job_id, (_, finished, _) in self.order.items():  # oldest finished first
            if now - finished <= ttl_s:
                break
            gone.append(job_id)
        for job_id in gone:
            self.remove(job_id)
        over = list(self.by_client) if client == ALL else [client] if client is not None else []
        for c in over:
            while self.client_over(c):
                oldest = next(iter(self.by_client[c]))
                self.remove(oldest)
                gone.append(oldest)
        while len(self.order) > self.max_count or self.total_bytes > self.max_bytes:
            by_bytes = self.total_bytes > self.max_bytes
            biggest = max(self.by_client, key=lambda c: self.client_bytes[c] if by_bytes else len(self.by_client[c]))
            oldest = next(iter(self.by_client[biggest]))
            self.remove(oldest)
            gone.append(oldest)
        return gone
