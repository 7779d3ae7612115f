"""Admission by cost, not count (issue 16, item 3), per ingress replica. No
Ray import.

A request's cost is an estimate of the seconds it takes the service to read
it when alone ("seconds of work"), from its pixels (the image header; a PDF:
its pages x its first page's pixels at the render DPI) before anything is
decoded:

    seconds = base + per_mp * megapixels + per_line * lines,
    lines   = (lines per megapixel, learned) * megapixels at the door.

The three coefficients are learned online from requests that ran alone
(admitted to an empty ledger, none admitted while they ran: their latency
is their cost, not their queueing), by least squares with exponential
forgetting, starting from a prior. The lines each completed request read
(its crops, near enough) feed both the per-line coefficient and the lines
per megapixel.

The ledger holds the cost of requests admitted here and not finished. The
drain rate is the cost of requests that finished with an answer, per second
of the time the ledger was not empty, over a sliding window: the service's
throughput in the same units, whatever their scale. A new request is
expected to finish after

    slowdown x max(own cost, (ledger + own cost) / rate, own cost x (n + 1) / rate)

seconds, n the requests in the ledger: the ledger drained first (Little's
law: the ledger over the throughput is the time a request spends in the
service), or its own work at a 1/(n + 1) share of the rate (the recogniser
serves the requests it holds in turn, and admission keeps about n in
flight while it runs: a large request among many small ones is slowed by
those admitted after it). `slowdown` (1 to 3) is the measured bias of these
estimates: a running 95th percentile of actual over expected seconds of
the answered requests (and, for a 504, of the time it was given). It is
refused with 503 and a Retry-After (the seconds until enough of the ledger
drains at the measured rate) when

- that is more than `deadline_share` of the time left to its deadline
  (reason "deadline": it would be a 504 after spending work on it), or
- the ledger would hold more than `max_queued_cost_s` (reason "cost_bound").

- its own cost is over `max_request_share` of max_queued_cost_s, even
  to an empty ledger (reason "too_big": a big document is a job), or
- its client (by address) would hold more than its fair share of the
  ledger or of the in-flight requests while other clients are about
  (reason "client_share"; see Admission.admit).

Otherwise a request is admitted to an empty ledger (a poor estimate never
starves a large request), and until a drain rate is measured only the cost
bound applies. The model learns only from plausible answers: a request
whose size was unknown, or whose seconds are far (10x) from the model's
own estimate, teaches nothing, and the rest are clipped to 2x of it, so
that a few hostile requests cannot make every pixel cost seconds. Headers
are read from their first `header_bytes`, off the event loop. The count limit (ingress.max_in_flight) stays in front of
this. Cached and shared answers never reach admission (they cost nothing)."""

from __future__ import annotations

import asyncio
import contextvars
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from serve_app.core.errors import DeadlineExceeded, Overloaded, TooLarge
from serve_app.flow.upload import upload_of
from serve_app.ocr.decode import check_aspect
from serve_app.serving.cost import (
    Size, image_size, CostModel, DrainMeter, Decision, retry_after, expected_seconds, decide, Calibration,
)

# The client of the request being admitted (the ingress sets it per route:
# "addr:" and its address), None for the handle API (trusted callers).
CLIENT: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("ocr_client", default=None)


def set_client(client: Optional[str]) -> None:
    """The client of the request this task serves (functions, not the
    variable, for the ingress: Serve pickles its app, and a ContextVar
    referenced from its module cannot be pickled)."""
    CLIENT.set(client)


def current_client() -> Optional[str]:
    return CLIENT.get()


# -- the ledger and its requests ------------------------------------------------------------


@dataclass(frozen=True)
class Ticket:
    """An admitted request's place in the ledger."""

    seq: int
    size: Size
    cost_s: float
    expected_s: float  # before the calibration's factor
    admitted_at: float
    alone: bool  # admitted to an empty ledger
    time_left_s: Optional[float] = None
    # The request's model set's cost relative to the default set's
    # (serve_app.core.model_sets, Cost.relative): its estimate was scaled by
    # it, and what it took is learnt divided by it (one cost model for all sets).
    factor: float = 1.0


class Admission:
    """The ledger, the model and the meter of one ingress replica.
    `metrics` (optional) has .refusals (counter, tag reason), .queued_cost,
    .drain_rate and .slowdown (gauges), .estimate_ratio (histogram)."""

    def __init__(self, args: Any, metrics: Any = None, clock: Callable[[], float] = time.monotonic,
                 default_retry_s: int = 1, max_requests: int = 32):
        self.args = args
        self.metrics = metrics
        self.clock = clock
        self.default_retry_s = default_retry_s
        self.model = CostModel(args.prior_base_s, args.prior_s_per_mp, args.prior_s_per_line,
                               s_per_tile=args.prior_s_per_tile)
        self.meter = DrainMeter(args.drain_window_s)
        self.calibration = Calibration()
        self.held: dict[int, float] = {}  # seq -> cost of admitted, unfinished requests
        self.owner: dict[int, Optional[str]] = {}  # seq -> its client
        self.queued_s = 0.0
        self.seq = 0
        self.refused: dict[str, int] = {}
        self.max_requests = max_requests  # the ingress's count limit (for the clients' shares)
        self.seen: dict[str, float] = {}  # client -> when last seen (admitted or refused)

    def note_client(self, client: Optional[str]) -> None:
        """A client was here now (admitted, or refused before admission)."""
        if client is None:
            return
        now = self.clock()
        self.seen[client] = now
        if len(self.seen) > 4096:  # forget the oldest: bounded whatever the number of addresses
            for c, _ in sorted(self.seen.items(), key=lambda kv: kv[1])[:1024]:
                del self.seen[c]

    def client_limits(self, client: str) -> tuple[float, float]:
        """(seconds of work, requests) `client` may hold now: all of the
        ledger when no other client was seen within client_window_s, else
        max(client_share, 1 / active clients) of it (and of max_requests)."""
        now = self.clock()
        window = self.args.client_window_s
        active = {c for c, t in self.seen.items() if now - t <= window}
        active |= {c for c in self.owner.values() if c is not None}
        active.add(client)
        share = 1.0 if len(active) <= 1 else max(self.args.client_share, 1.0 / len(active))
        return share * self.args.max_queued_cost_s, share * self.max_requests

    def admit(self, size: Size, time_left_s: Optional[float], client: Optional[str] = None,
              factor: float = 1.0) -> Ticket:
        """A Ticket for the request, or Overloaded (503) with Retry-After.
        `factor`: its model set's cost relative to the default set's."""
        now = self.clock()
        cost = self.model.estimate(size) * factor
        rate = self.meter.rate(now)
        slowdown = self.calibration.factor
        self.note_client(client)
        if self.args.enabled:
            d = decide(self.queued_s, cost, rate, time_left_s, self.args.max_queued_cost_s,
                       self.args.deadline_share, self.default_retry_s, self.args.max_retry_after_s,
                       len(self.held), slowdown, self.args.max_request_share * self.args.max_queued_cost_s)
            if d.admit and client is not None:
                mine = [seq for seq, c in self.owner.items() if c == client]
                held = sum(self.held[seq] for seq in mine)
                max_s, max_n = self.client_limits(client)
                if mine and (held + cost > max_s or len(mine) + 1 > max_n):
                    d = Decision(False, d.expected_s, "client_share",
                                 retry_after(held + cost - max_s, rate, self.default_retry_s,
                                             self.args.max_retry_after_s))
                    self.count_refusal("client_share")
                    raise Overloaded(f"this client ({client.split(':', 1)[-1]}) has {len(mine)} requests "
                                     f"(~{held:.1f} s of work) here, its fair share while other clients are "
                                     f"served is {max_n:.0f} requests and {max_s:.0f} s; retry after "
                                     f"{d.retry_after_s} s", retry_after_s=d.retry_after_s)
        else:
            d = Decision(True, expected_seconds(self.queued_s, cost, rate, len(self.held), slowdown))
        if not d.admit:
            self.count_refusal(d.reason or "deadline")
            if d.reason == "too_big":
                limit = self.args.max_request_share * self.args.max_queued_cost_s
                raise Overloaded(f"this request is ~{cost:.0f} s of work ({size.pages} page(s) of "
                                 f"{size.megapixels:.1f} MP), over the {limit:g} s one request may take here "
                                 f"(ingress.admission.max_request_share); submit it as a job instead "
                                 f"(POST /v1/ocr/jobs, then GET /v1/ocr/jobs/{{job_id}})",
                                 retry_after_s=d.retry_after_s)
            if d.reason == "deadline":
                why = (f"too much work is queued here to read this request (~{cost:.1f} s of work) before its "
                       f"deadline (in {time_left_s:.1f} s): it would take ~{d.expected_s:.1f} s")
            else:
                why = (f"~{self.queued_s:.0f} s of work is queued here (limit {self.args.max_queued_cost_s:g} s, "
                       f"this request ~{cost:.1f} s)")
            raise Overloaded(f"{why}; retry after {d.retry_after_s} s", retry_after_s=d.retry_after_s)
        self.seq += 1
        ticket = Ticket(self.seq, size, cost, d.expected_s / slowdown, now, not self.held, time_left_s, factor)
        self.held[ticket.seq] = cost
        self.owner[ticket.seq] = client
        self._set_queued(now)
        return ticket

    def count_refusal(self, reason: str, client: Optional[str] = None) -> None:
        """A refusal by reason (deadline, cost_bound, too_big, client_share;
        the ingress adds in_flight, with its client: it was here)."""
        self.note_client(client)
        self.refused[reason] = self.refused.get(reason, 0) + 1
        if self.metrics is not None:
            self.metrics.refusals.inc(tags={"reason": reason})

    def finish(self, ticket: Optional[Ticket], result: Optional[dict], late: bool = False) -> None:
        """The request left: with its result (a body with `results` or
        `pages`) when it was answered, None otherwise (error, deadline,
        cancelled: not drained work); `late`: its deadline passed (504)."""
        if ticket is None or self.held.pop(ticket.seq, None) is None:
            return
        self.owner.pop(ticket.seq, None)
        now = self.clock()
        seconds = now - ticket.admitted_at
        if result is not None:
            self.meter.finished(now, ticket.cost_s)
            if ticket.alone and self.seq == ticket.seq:  # ran alone: its latency is its cost
                self.model.observe(ticket.size, count_lines(result), seconds / ticket.factor)
            if ticket.expected_s > 0:
                self.calibration.observe(seconds / ticket.expected_s)
                if self.metrics is not None:
                    self.metrics.estimate_ratio.observe(seconds / ticket.expected_s)
        elif late and ticket.expected_s > 0:
            given = ticket.time_left_s if ticket.time_left_s is not None else seconds
            self.calibration.observe(max(seconds, given) / ticket.expected_s)
        self._set_queued(now)

    def _set_queued(self, now: float) -> None:
        self.queued_s = sum(self.held.values()) if self.held else 0.0
        self.meter.busy(now, bool(self.held))
        if self.metrics is not None:
            self.metrics.queued_cost.set(self.queued_s)
            self.metrics.slowdown.set(self.calibration.factor)
            rate = self.meter.rate(now)
            if rate is not None:
                self.metrics.drain_rate.set(rate)

    def snapshot(self) -> dict[str, Any]:
        """For /v1/stats: the ledger, the rate, the model."""
        rate = self.meter.rate(self.clock())
        return {"enabled": self.args.enabled, "queued_cost_s": round(self.queued_s, 3),
                "requests": len(self.held), "drain_rate": None if rate is None else round(rate, 3),
                "slowdown": round(self.calibration.factor, 3), "refused": dict(self.refused),
                "model": self.model.snapshot()}


def count_lines(result: dict) -> int:
    """Lines read in a result body (an image's results, or a document's pages')."""
    if "pages" in result:
        return sum(len(p.get("results", ())) for p in result["pages"])
    return len(result.get("results", ()))


class Gate:
    """One request's way through admission: `await admit()` (before its
    computation starts; Overloaded if refused), `done(result)` once
    answered; leaving the `with` block gives its cost back either way."""

    def __init__(self, admission: Admission, data: Any, time_left_s: Optional[float], documents: Any = None,
                 deadline: Optional[float] = None, clock: Callable[[], float] = time.monotonic,
                 limits: Any = None, factor: float = 1.0):
        self.admission = admission
        self.factor = factor  # the request's model set's relative cost (Admission.admit)
        self.data = data
        self.documents = documents
        self.limits = limits  # ImageLimits: an image over max_pixels is a 413, never priced
        # Time left is taken when admit() runs: a request may wait (a batch's items, a shared flight).
        self.deadline = None if time_left_s is None else clock() + time_left_s
        self.clock = clock
        self.ticket: Optional[Ticket] = None
        self.result: Optional[dict] = None
        self.client = CLIENT.get()

    async def admit(self) -> None:
        header_bytes = getattr(self.admission.args, "header_bytes", 256 * 1024)
        upload = upload_of(self.data)  # the door's Upload (serve_app.flow.upload): its kind is known
        if self.documents is not None and upload.is_document:  # a PDF opened in a PDF worker, on the pool's threads
            from serve_app.flow.pdf_worker import shared_pool

            pool = shared_pool(self.documents.workers, self.documents.worker_memory_mb)
            size = await asyncio.get_running_loop().run_in_executor(
                pool.executor, image_size, upload, self.documents, header_bytes)
        elif isinstance(upload.data, np.ndarray):
            size = image_size(upload)
        else:  # a header, from its first header_bytes: off the event loop all the same
            size = await asyncio.to_thread(image_size, upload, None, header_bytes)
        if self.limits is not None and not upload.is_document and size.known:
            # What the decoder would answer, at once and whatever the load: over the
            # pixel limit a 413 (a decompression bomb is not work too big to take),
            # over max_aspect a 400 (no waiting makes a 1 x 40,000,000 px strip readable).
            if size.pixels > self.limits.max_pixels:
                raise TooLarge(f"image is {size.pixels} pixels, over the limit of {self.limits.max_pixels}")
            if size.width and size.height:
                check_aspect(size.width, size.height, self.limits)
        left = None if self.deadline is None else max(0.0, self.deadline - self.clock())
        self.ticket = self.admission.admit(size, left, self.client, self.factor)

    def done(self, result: Any) -> None:
        self.result = result if isinstance(result, dict) else None

    def __enter__(self) -> "Gate":
        return self

    def __exit__(self, *exc) -> None:
        late = exc[0] is not None and issubclass(exc[0], DeadlineExceeded)
        self.admission.finish(self.ticket, self.result if exc[0] is None else None, late)
        self.ticket = None
