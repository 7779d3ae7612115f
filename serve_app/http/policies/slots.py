"""The ingress's in-flight slots (ingress.max_in_flight) held by client
(serve_app/http/clients.py): a client alone may hold all but one of them,
so a client arriving behind one that keeps every slot busy (a loop of
dense pages, each tens of seconds on a small box) is taken at once instead
of waiting for those requests to end; while other clients are about, a
client holds at most its fair share of them (admission's client_share, or
1 / active clients). The check is made before the slot is taken: a
refused request holds nothing, so a client retrying in a tight loop cannot
keep the free slot busy with its own refusals. Requests naming no client
(the handle API, trusted callers) are not counted. No Ray import."""

from __future__ import annotations

from typing import Any, Optional

from serve_app.core.errors import Overloaded


class ClientSlots:
    """`take(client, admission)` before a slot is taken (Overloaded past the
    client's share; `admission`: the ingress's Admission, whose
    max_requests is ingress.max_in_flight, with the clients seen and their
    shares), `give(client)` when it is given back."""

    def __init__(self, retry_after_s: int):
        self.retry_after_s = retry_after_s
        self.held: dict[str, int] = {}  # client -> slots it holds now

    @staticmethod
    def limit(client: str, admission: Any) -> int:
        """Slots `client` may hold now."""
        admission.note_client(client)  # seen: the others' shares shrink from now on
        _, share = admission.client_limits(client)
        return max(1, min(int(share), admission.max_requests - 1))

    def take(self, client: Optional[str], admission: Any) -> Optional[str]:
        if client is None:
            return None
        held, limit = self.held.get(client, 0), self.limit(client, admission)
        if held >= limit:
            admission.count_refusal("client_share")
            who, total = client.split(":", 1)[-1], admission.max_requests
            why = ("one is kept for another client" if limit == total - 1 else
                   "its fair share while other clients are served")
            raise Overloaded(f"this client ({who}) has {held} of the {total} requests in progress here, "
                             f"all it may hold ({why}); retry shortly", retry_after_s=self.retry_after_s)
        self.held[client] = held + 1
        return client

    def give(self, client: Optional[str]) -> None:
        if client is None:
            return
        left = self.held.get(client, 0) - 1
        if left > 0:
            self.held[client] = left
        else:
            self.held.pop(client, None)
