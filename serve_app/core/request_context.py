"""One request's context: its id, its deadline and its lane, in one small
frozen value that the door makes once and every stage call is given
explicitly (the detector, the direction classifier and the recogniser
alike), so that a replica drops work whose request is gone, serves the
interactive lane first, and gives bulk places to clients in turn (the
client: serve_app/http/clients.py at the door, the job's for a job). No Ray import."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Optional

from serve_app.core.errors import DeadlineExceeded
from serve_app.core.lanes import INTERACTIVE, lane_of


@dataclass(frozen=True)
class RequestContext:
    request_id: str = ""
    deadline: Optional[float] = None  # wall-clock time.time(); None: no deadline
    lane: str = INTERACTIVE
    client: str = ""  # whose turn its work takes at the stages' gates ("": no client named)

    @staticmethod
    def of(request_id: str, timeout_s: Optional[float], lane: Optional[str]) -> "RequestContext":
        """A new request's context: its deadline `timeout_s` from now."""
        return RequestContext(request_id, None if timeout_s is None else time.time() + timeout_s, lane_of(lane))

    def time_left(self) -> Optional[float]:
        """Seconds to the deadline (negative once passed); None: no deadline."""
        return None if self.deadline is None else self.deadline - time.time()

    def until(self, deadline: Optional[float]) -> "RequestContext":
        """The same request with another deadline (a shared computation has none of its own)."""
        return self if deadline == self.deadline else replace(self, deadline=deadline)

    def check(self, where: str) -> None:
        """DeadlineExceeded if the deadline has passed before `where`."""
        if self.deadline is not None and time.time() > self.deadline:
            raise DeadlineExceeded(f"the request's deadline passed before {where}; nothing more was done for it")
