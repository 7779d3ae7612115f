"""Admission by cost, not count (issue 16, item 3), per ingress replica. No
Ray import.

A request's cost is an estimate of the seconds it takes the service to read
it when alone ("seconds of work"), from its pixels (the image header; a
document: each page's own, from PDFium's page sizes at the render DPI or
the TIFF's directories; a bad document is refused before it is priced)
and the work its options add (fine-pass tiles, turned pages read twice, a
picture, structure: a page's layout and its table regions), before anything
is decoded, by the cost model of the model set that reads it (options.model):

    seconds = base + per_mp * megapixels + per_line * lines,
    lines   = (lines per megapixel, learned) * megapixels at the door.

The three coefficients are learned online from requests that ran alone
(admitted to an empty ledger, none admitted while they ran: their latency
is their cost, not their queueing), by least squares with exponential
forgetting, starting from a prior. The lines each completed request read
(its crops, near enough) feed both the per-line coefficient and the lines
per megapixel.

The ledger holds the cost of requests admitted here and not finished. The
drain rate is the cost of requests that finished with an answer (re-priced
from what was detected: the lines read over or under those its pixels were
priced for, CostModel.read_cost), and of requests still running as they
run, at their expected pace (Admission.running_work), per second
of the time the ledger was not empty, over a sliding window: the service's
throughput in the same units, whatever their scale. A new request is
expected to finish after

    slowdown x max(own cost, (ledger + own cost) / rate, own cost x (n + 1) / rate)

seconds, n the requests in the ledger, `ledger` the work still ahead of
it (each admitted request's cost less what it has had time to do, its cost
spread over the time it was expected to take: one that runs past its
estimate stops counting ahead of others, Admission.ahead_s): the ledger drained first (Little's
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

A request that joins an identical computation in flight (the result
cache's Dedupe) is not admitted again: it shares that computation's
ticket, which stays in the ledger until the computation ends or its last
waiter leaves (then it is cancelled), charged to the first request still
waiting on it. No computation runs outside the ledger.

Otherwise a request is admitted to an empty ledger (a poor estimate never
starves a large request), and until a drain rate is measured only the cost
bound applies. The model learns only from plausible answers: a request
whose size was unknown, or whose seconds are far (10x) from the model's
own estimate, teaches nothing, and the rest are clipped to 2x of it, so
that a few hostile requests cannot make every pixel cost seconds; an
answer that read no text (a blank page) or was read twice teaches
nothing; and every coefficient stays within model_drift times of its
prior (serve_app.http.policies.cost.CostModel). Headers
are read from their first `header_bytes`, off the event loop. The count limit (ingress.max_in_flight) stays in front of
this. Cached answers never reach admission (they cost nothing)."""

from __future__ import annotations

import asyncio
import contextvars
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from serve_app.core.errors import DeadlineExceeded, Overloaded, TooLarge
from serve_app.core.model_sets import DEFAULT_MODEL, SETS
from serve_app.flow.upload import upload_of
from serve_app.ocr.decode import check_aspect
from serve_app.http.policies.drain import DrainMeter
from serve_app.http.policies.cost import (
    Size, image_size, CostModel, Decision, retry_after, expected_seconds, decide, Calibration,
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
        self.models: dict[Optional[str], CostModel] = {}  # one cost model per model set (options.model)
        self.model = self.model_for(None)
        self.meter = DrainMeter(args.drain_window_s)
        self.calibration = Calibration()
        self.held: dict[int, float] = {}  # seq -> cost of admitted, unfinished requests
        self.tickets: dict[int, Ticket] = {}  # seq -> their tickets
        self.owner: dict[int, Optional[str]] = {}  # seq -> the client it is charged to
        self.waiters: dict[int, list[Optional[str]]] = {}  # seq -> clients of the requests waiting on it
        self.queued_s = 0.0
        self.seq = 0
        self.refused: dict[str, int] = {}
        self.max_requests = max_requests  # the ingress's count limit (for the clients' shares)
        self.seen: dict[str, float] = {}  # client -> when last seen (admitted or refused)

    MAX_MODELS = 16  # cost models kept (model sets are few; a name is checked before it gets here)

    def model_for(self, name: Optional[str]) -> CostModel:
        """The cost model of a model set (None: the default set), learnt from
        that set's own answers; its prior is the default set's scaled by the
        set's cost relative to it (serve_app.core.model_sets, Cost.relative),
        so a set's first requests are priced as that set, not as the default."""
        model = self.models.get(name)
        if model is None:
            a = self.args
            # relative to the code's default set (the priors' set); a set of the user's own as the default
            r = (SETS[name].cost.relative or 1.0) / SETS[DEFAULT_MODEL].cost.relative if name in SETS else 1.0
            model = CostModel(a.prior_base_s * r, a.prior_s_per_mp * r, a.prior_s_per_line * r,
                              s_per_tile=a.prior_s_per_tile * r, drift=a.model_drift,
                              s_per_picture_mp=a.s_per_picture_mp, min_turned=a.min_turned_share,
                              s_per_structure_page=a.s_per_structure_page * r, s_per_table=a.s_per_table,
                              tables_per_page=a.tables_per_page)
            if len(self.models) < self.MAX_MODELS or name is None:
                self.models[name] = model
        return model

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

    def admit(self, size: Size, time_left_s: Optional[float], client: Optional[str] = None) -> Ticket:
        """A Ticket for the request, or Overloaded (503) with Retry-After."""
        now = self.clock()
        cost = self.model_for(size.model).estimate(size)
        rate = self.rate(now)
        slowdown = self.calibration.factor
        self.note_client(client)
        if self.args.enabled:
            d = decide(self.ahead_s(now), cost, rate, time_left_s, self.args.max_queued_cost_s,
                       self.args.deadline_share, self.default_retry_s, self.args.max_retry_after_s,
                       len(self.held), slowdown, self.args.max_request_share * self.args.max_queued_cost_s,
                       held_s=self.queued_s)
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
                raise Overloaded(f"this request is ~{cost:.0f} s of work ({size.pages} page(s), "
                                 f"{size.total_megapixels:.1f} MP in all), over the {limit:g} s one request may take here "
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
        ticket = Ticket(self.seq, size, cost, d.expected_s / slowdown, now, not self.held, time_left_s)
        self.held[ticket.seq] = cost
        self.tickets[ticket.seq] = ticket
        self.owner[ticket.seq] = client
        self._set_queued(now)
        return ticket

    def ahead_s(self, now: float) -> float:
        """The work still ahead of a new request: each admitted request's
        cost less what it has had time to do (its cost spread over the time
        it was expected to take). One that runs past its estimate (a page
        whose detected lines cost more than its pixels said) stops counting
        as work queued in front of every other request: its place in the
        ledger's bound (queued_s) stays until it ends, and the drain rate
        is credited with what it read (CostModel.read_cost)."""
        ahead = 0.0
        for seq, cost in self.held.items():
            t = self.tickets.get(seq)
            done = 0.0 if t is None else (now - t.admitted_at) / max(t.expected_s, 0.01)
            ahead += cost * max(0.0, 1.0 - done)
        return ahead

    def running_work(self, now: float) -> float:
        """Work done within the drain window by requests still running,
        re-priced as they run: each is credited at the pace it was expected
        to go (its cost over its expected seconds: what ahead_s takes off
        it) for every second it has run in the window, past its expected
        finish too; once it ends, its answer's price (CostModel.read_cost)
        is credited instead. A page whose detected lines cost far more than
        its pixels said is work being done: when the rate credited a request
        only once it ended, it fell toward zero while such a page ran longer
        than the window, and a one-word request beside it was refused as
        expected to take 100-200 s (python -m load_tests hostile front,
        `layout`, 2026-12-05)."""
        start = now - self.meter.window_s
        work = 0.0
        for seq, cost in self.held.items():
            t = self.tickets.get(seq)
            if t is not None:
                work += cost / max(t.expected_s, 0.01) * max(0.0, now - max(t.admitted_at, start))
        return work

    def rate(self, now: float) -> Optional[float]:
        """The drain rate (DrainMeter) with running_work credited."""
        return self.meter.rate(now, self.running_work(now))

    def join(self, ticket: Ticket, client: Optional[str]) -> None:
        """A request (of `client`) waits on the computation `ticket` pays
        for. The ledger charges a ticket to its first waiter still waiting:
        the request that was admitted, then, once it leaves, the next."""
        if ticket.seq in self.held:
            self.waiters.setdefault(ticket.seq, []).append(client)
            self.owner[ticket.seq] = self.waiters[ticket.seq][0]

    def leave(self, ticket: Ticket, client: Optional[str]) -> None:
        waiting = self.waiters.get(ticket.seq)
        if waiting is None or client not in waiting:
            return
        waiting.remove(client)
        if waiting and ticket.seq in self.held:
            self.owner[ticket.seq] = waiting[0]
            self.note_client(waiting[0])

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
        self.tickets.pop(ticket.seq, None)
        self.owner.pop(ticket.seq, None)
        self.waiters.pop(ticket.seq, None)
        now = self.clock()
        seconds = now - ticket.admitted_at
        if result is not None:
            model = self.model_for(ticket.size.model)
            self.meter.finished(now, model.read_cost(ticket.size, ticket.cost_s, count_lines(result), count_tables(result)))
            turned, read = count_turned(result)
            if ticket.size.orientation:
                model.observe_turned(turned, read)
            if ticket.alone and self.seq == ticket.seq and not turned:  # ran alone, read once: its latency is its cost
                model.observe(ticket.size, count_lines(result), seconds)
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
            rate = self.rate(now)
            if rate is not None:
                self.metrics.drain_rate.set(rate)

    def snapshot(self) -> dict[str, Any]:
        """For /v1/stats: the ledger, the rate, the model."""
        rate = self.rate(self.clock())
        return {"enabled": self.args.enabled, "queued_cost_s": round(self.queued_s, 3),
                "requests": len(self.held), "drain_rate": None if rate is None else round(rate, 3),
                "slowdown": round(self.calibration.factor, 3), "refused": dict(self.refused),
                "model": self.model.snapshot(),
                "models": {name: m.snapshot() for name, m in self.models.items() if name is not None}}


def count_turned(result: dict) -> tuple[int, int]:
    """(pages read twice because turned, pages read) of a result body."""
    pages = result.get("pages") if "pages" in result else [result]
    turned = sum(1 for p in pages if isinstance(p, dict) and "orientation" in (p.get("timings_ms") or {}))
    return turned, len(pages)


def count_tables(result: dict) -> int:
    """Table regions in a result body (options.structure), every page's."""
    pages = result.get("pages") if "pages" in result else [result]
    return sum(1 for p in pages if isinstance(p, dict) for r in p.get("regions") or () if r.get("type") == "table")


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
                 limits: Any = None, options: Any = None):
        self.admission = admission
        self.data = data
        self.options = options  # the request's OcrOptions: the work they add, and the model set that reads it
        self.documents = documents
        self.limits = limits  # ImageLimits: an image over max_pixels is a 413, never priced
        # Time left is taken when admit() runs: a request may wait (a batch's items, a shared flight).
        self.deadline = None if time_left_s is None else clock() + time_left_s
        self.clock = clock
        self.ticket: Optional[Ticket] = None
        self.result: Optional[dict] = None
        self.client = CLIENT.get()

    async def admit(self) -> Ticket:
        header_bytes = getattr(self.admission.args, "header_bytes", 256 * 1024)
        upload = upload_of(self.data)  # the door's Upload (serve_app.flow.upload): its kind is known
        if self.documents is not None and upload.is_document:  # a PDF opened in a PDF worker, on the pool's threads
            from serve_app.flow.pdf_worker import shared_pool

            pool = shared_pool(self.documents.workers, self.documents.worker_memory_mb)
            size = await asyncio.get_running_loop().run_in_executor(
                pool.executor, image_size, upload, self.documents, header_bytes, self.options)
        elif isinstance(upload.data, np.ndarray):
            size = image_size(upload, None, header_bytes, self.options)
        else:  # a header, from its first header_bytes: off the event loop all the same
            size = await asyncio.to_thread(image_size, upload, None, header_bytes, self.options)
        if self.limits is not None and not upload.is_document and size.known:
            # What the decoder would answer, at once and whatever the load: over the
            # pixel limit a 413 (a decompression bomb is not work too big to take),
            # over max_aspect a 400 (no waiting makes a 1 x 40,000,000 px strip readable).
            if size.pixels > self.limits.max_pixels:
                raise TooLarge(f"image is {size.pixels} pixels, over the limit of {self.limits.max_pixels}")
            if size.width and size.height:
                check_aspect(size.width, size.height, self.limits)
        left = None if self.deadline is None else max(0.0, self.deadline - self.clock())
        self.ticket = self.admission.admit(size, left, self.client)
        return self.ticket

    def done(self, result: Any) -> None:
        self.result = result if isinstance(result, dict) else None

    # -- a ticket that outlives this request (serve_app.http.policies.result_cache.Dedupe) --
    def hand_over(self) -> None:
        """The ticket now belongs to a computation others may join: it is
        ended by `end` when that computation ends, not when this request leaves."""
        self.ticket = None

    def join(self, ticket: Ticket) -> None:
        """This request waits on the computation `ticket` pays for."""
        self.admission.join(ticket, self.client)

    def leave(self, ticket: Ticket) -> None:
        self.admission.leave(ticket, self.client)

    def end(self, ticket: Optional[Ticket], result: Any, late: bool = False) -> None:
        """The computation `ticket` paid for ended: with its result, or None."""
        self.admission.finish(ticket, result if isinstance(result, dict) else None, late)
        if ticket is self.ticket:
            self.ticket = None

    def __enter__(self) -> "Gate":
        return self

    def __exit__(self, *exc) -> None:
        late = exc[0] is not None and issubclass(exc[0], DeadlineExceeded)
        self.admission.finish(self.ticket, self.result if exc[0] is None else None, late)
        self.ticket = None
