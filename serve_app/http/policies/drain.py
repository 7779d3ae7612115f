"""The drain meter: how fast the service finishes admitted work, the rate
admission (serve_app/http/policies/admission.py) divides the queued
seconds by. No Ray import."""

from __future__ import annotations

from collections import deque
from typing import Optional


class DrainMeter:
    """Seconds of work finished per second of busy time (the ledger not
    empty), over the last `window_s` seconds. Until `min_done` requests and
    `min_busy_s` of busy time are in the window, the last measured rate
    stands (None before the first). Each admission asks for the rate: the
    window's sums are kept as entries come and go (constant time a request,
    however many the window holds)."""

    def __init__(self, window_s: float, min_done: int = 3, min_busy_s: float = 0.5):
        self.window_s = window_s
        self.min_done = min_done
        self.min_busy_s = min_busy_s
        self.done: deque[tuple[float, float]] = deque()  # (when, seconds of work)
        self.spans: deque[tuple[float, float]] = deque()  # closed busy spans (start, end), in time order
        self.busy_since: Optional[float] = None
        self.last: Optional[float] = None
        self._work = 0.0  # sum of done's seconds
        self._spans_s = 0.0  # sum of spans' lengths

    def busy(self, now: float, is_busy: bool) -> None:
        if is_busy and self.busy_since is None:
            self.busy_since = now
        elif not is_busy and self.busy_since is not None:
            self.spans.append((self.busy_since, now))
            self._spans_s += now - self.busy_since
            self.busy_since = None

    def finished(self, now: float, cost_s: float) -> None:
        self.done.append((now, cost_s))
        self._work += cost_s

    def _trim(self, now: float) -> None:
        start = now - self.window_s
        while self.done and self.done[0][0] < start:
            self._work -= self.done.popleft()[1]
        while self.spans and self.spans[0][1] < start:
            s, e = self.spans.popleft()
            self._spans_s -= e - s
        if not self.done:
            self._work = 0.0  # no rounding left over from the sums
        if not self.spans:
            self._spans_s = 0.0

    def busy_seconds(self, now: float) -> float:
        """Busy time within the window: the closed spans (the oldest one
        cut at the window's start; spans do not overlap) and the open one."""
        start = now - self.window_s
        self._trim(now)
        busy = self._spans_s
        if self.spans and self.spans[0][0] < start:
            busy -= start - self.spans[0][0]
        if self.busy_since is not None:
            busy += now - max(self.busy_since, start)
        return max(busy, 0.0)

    def rate(self, now: float, running: float = 0.0) -> Optional[float]:
        """`running`: work credited to requests still running within the
        window (Admission.running_work), counted as done."""
        busy = self.busy_seconds(now)  # the window trimmed to now
        if (len(self.done) >= self.min_done or running > 0) and busy >= self.min_busy_s:
            self.last = (self._work + running) / busy
        return self.last
