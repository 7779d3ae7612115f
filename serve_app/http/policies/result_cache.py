"""Identical work done once, at the ingress: a bounded result cache and an
in-flight table, both keyed by the content of a request (the image bytes,
the parsed OcrOptions and the model identity: weights and engine settings).
Per ingress replica: two ingress replicas each compute a result once. No Ray
import.

How a request was answered (`Dedupe.read`'s second value, the `X-Cache`
header): "hit" (from the cache), "shared" (it waited on the same
computation another request started), "miss" (it started the computation),
"bypass" (computed on its own: an image given as a path, which may change
under its name, or a request sent with `Cache-Control: no-cache` or
`no-store`; its result still goes into the cache)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import numpy as np

from serve_app.core.errors import DeadlineExceeded
from serve_app.flow.upload import content_key, upload_of  # the one content hash (serve_app.flow.upload)

# Hash bigger inputs off the event loop (hashlib releases the GIL on them).
_HASH_INLINE_BYTES = 256 * 1024


# -- keys ----------------------------------------------------------------------


def wants_fresh(cache_control: Optional[str]) -> bool:
    """A request's Cache-Control asks for its own computation."""
    directives = {d.strip().split("=")[0].lower() for d in (cache_control or "").split(",")}
    return bool(directives & {"no-cache", "no-store"})


def model_identity(engine: Any) -> str:
    """What the results depend on besides the request: the weights (their
    sha256 from models/manifest.json for the default set, else the files'
    own digests) and every engine setting (thresholds, sizes, limits)."""
    from serve_app.core.model_sets import DEFAULT_MODEL
    from serve_app.inference.weights import dictionary_path, file_sha256, load_manifest, model_digest, model_files

    h = hashlib.sha256(engine.model_dump_json().encode())
    manifest = load_manifest()
    for stage, directory in (("det", engine.det_model), ("cls", engine.cls_model), ("rec", engine.rec_model),
                             ("dict", engine.rec_dict)):
        if directory is None and (engine.model == DEFAULT_MODEL or stage == "cls"):
            h.update(json.dumps(manifest["stages"][stage]["files"], sort_keys=True).encode())
        elif directory is None and stage == "dict":
            h.update(file_sha256(dictionary_path(None, engine.model)).encode())
        elif stage == "dict":
            h.update(file_sha256(Path(directory).expanduser()).encode())
        else:
            h.update(model_digest(model_files(stage, directory, engine.model)).encode())
    return h.hexdigest()


async def content_key_async(image: Any, options: Any, model_id: str) -> Optional[str]:
    size = upload_of(image).nbytes if isinstance(image, (bytes, bytearray, memoryview, np.ndarray)) else 0
    if size > _HASH_INLINE_BYTES:
        return await asyncio.to_thread(content_key, image, options, model_id)
    return content_key(image, options, model_id)


def result_size(value: Any) -> int:
    """Approximate bytes a result holds: its strings and binary extras (a
    visualization picture, base64 or raw) in full, 8 per number."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, dict):
        return 16 + sum(result_size(k) + result_size(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 16 + sum(result_size(v) for v in value)
    return 8


# -- the cache -------------------------------------------------------------------


@dataclass
class _Entry:
    value: Any
    size: int
    expires: float


class ResultCache:
    """Least-recently-used results, at most max_bytes in all, each kept
    ttl_s. A result bigger than max_bytes is not kept."""

    def __init__(self, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self.bytes = 0
        self.evictions = 0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Optional[Any]:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self.clock() >= entry.expires:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: str, value: Any, size: Optional[int] = None) -> bool:
        size = result_size(value) if size is None else size
        if key in self._entries:
            self._drop(key)
        if size > self.max_bytes:
            return False
        now = self.clock()
        for k in [k for k, e in self._entries.items() if now >= e.expires]:
            self._drop(k)
        while self.bytes + size > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        self._entries[key] = _Entry(value, size, now + self.ttl_s)
        self.bytes += size
        return True

    def _drop(self, key: str) -> None:
        self.bytes -= self._entries.pop(key).size


# -- the in-flight table -----------------------------------------------------------


class _Flight:
    def __init__(self, response: Any, gate: Any = None, ticket: Any = None):
        self.response = response  # has .cancel() (a Serve DeploymentResponse), or not
        self.task: Optional[asyncio.Task] = None
        self.waiters = 0
        self.gate = gate  # the admission gate that paid for it (ends its ticket), or None
        self.ticket = ticket  # the flight's place in the ledger, shared by every waiter
        self.ended = False

    def join(self, gate: Any) -> None:
        self.waiters += 1
        if gate is not None and self.ticket is not None:
            gate.join(self.ticket)

    def leave(self, gate: Any) -> None:
        self.waiters -= 1
        if gate is not None and self.ticket is not None:
            gate.leave(self.ticket)

    def end(self, result: Any, late: bool = False) -> None:
        """The computation ended (answered, failed or abandoned): its ticket leaves the ledger, once."""
        if not self.ended and self.gate is not None:
            self.gate.end(self.ticket, result, late)
        self.ended = True


class Dedupe:
    """`await read(image, options, timeout_s, start, late)` -> (result, how).

    `start(deadline)` starts the computation (a handle call: an awaitable
    with .cancel()). With sharing on, identical requests wait on one
    computation: if it fails, each gets the same error; a request whose own
    timeout passes leaves with DeadlineExceeded(late) and the others go on
    waiting; the computation is cancelled when no request waits for it any
    more, and is started with the longest deadline a request may have
    (`flight_timeout_s`) as a backstop. With sharing off, it is started
    with the request's own deadline, as if there were no table. Successful
    results go into the cache (if any).

    Admission (`gate`, serve_app.http.policies.admission.Gate): the request that
    starts a computation is admitted first and its ticket belongs to the
    computation, not to the request: every request waiting on it joins the
    ticket, the ledger charges it to the first still waiting (the payer
    while it waits, then the next), and it leaves the ledger when the
    computation ends, or is cancelled once its last waiter leaves. So no
    computation runs outside the ledger, whoever paid for it."""

    def __init__(self, model_id: str, cache: Optional[ResultCache], share: bool, metrics: Any = None,
                 awaiter: Optional[Callable[[Any], Awaitable]] = None, flight_timeout_s: Optional[float] = None,
                 detach: Optional[Callable[..., Any]] = None):
        self.model_id = model_id
        # How a shared computation is started: owned by no one request (Serve cancels a request's handle calls
        # with it, the client gone; the requests still waiting on it would get the cancellation).
        self.detach = detach or (lambda start, *args: start(*args))
        self.flight_timeout_s = flight_timeout_s
        self.cache = cache
        self.share = share
        self.metrics = metrics
        self.awaiter = awaiter or (lambda call: call)
        self.flights: dict[str, _Flight] = {}
        self.counts = {"hit": 0, "shared": 0, "miss": 0, "bypass": 0}

    async def read(self, image: Any, options: Any, timeout_s: Optional[float],
                   start: Callable[[Optional[float]], Any], late: str = "deadline passed",
                   fresh: bool = False, admit: Optional[Callable[[], Awaitable[Any]]] = None,
                   gate: Any = None) -> tuple[Any, str]:
        """(result, how); `fresh`: computed alone, not looked up (its result
        is stored). `admit()` (or `gate.admit()`) is awaited before this
        request starts a computation (not for a hit, which costs nothing,
        nor when it joins one, whose ticket it shares); it may raise
        (admission refused). With a `gate` the ticket of a computation
        alone is ended here, and a shared one's when the computation ends."""
        if gate is not None:
            admit = gate.admit
        key = None
        if self.cache is not None or self.share:
            key = await content_key_async(image, options, self.model_id)
        if key is None or fresh or not self.share:
            if key is not None and not fresh and self.cache is not None:
                hit = self.cache.get(key)
                if hit is not None:
                    return hit, self._count("hit")
            ticket = await admit() if admit is not None else None
            result = await self._alone(start, timeout_s, late, gate, ticket)
            if key is not None:
                self._store(key, result)
            return result, self._count("bypass" if key is None or fresh else "miss")
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                return hit, self._count("hit")
        flight = self.flights.get(key)
        ticket = None
        if flight is None and admit is not None:
            ticket = await admit()
            # Pricing took a while (off the loop): an identical request may
            # have started its computation meanwhile, or even finished it.
            flight = self.flights.get(key)
            hit = self.cache.get(key) if flight is None and self.cache is not None else None
            if (flight is not None or hit is not None) and gate is not None:
                gate.end(ticket, None)  # it joins that one, or takes its answer: its own ticket goes back unused
            if hit is not None:
                return hit, self._count("hit")
        how = "shared"
        if flight is None:
            backstop = None if self.flight_timeout_s is None else time.time() + self.flight_timeout_s
            flight = _Flight(self.detach(start, backstop), gate, ticket)
            if gate is not None:
                gate.hand_over()
            flight.task = asyncio.ensure_future(self._settle(key, flight))
            self.flights[key] = flight
            how = "miss"
        self._count(how)
        flight.join(gate)
        left = True
        timed_out = False
        try:
            result = await asyncio.wait_for(asyncio.shield(flight.task), timeout_s)
            left = False
            return result, how
        except asyncio.TimeoutError:
            timed_out = True
            raise DeadlineExceeded(late) from None
        finally:
            flight.leave(gate)
            if left and flight.waiters == 0 and not flight.task.done():
                self._abandon(key, flight, timed_out)

    async def _alone(self, start: Callable[[Optional[float]], Any], timeout_s: Optional[float], late: str,
                     gate: Any = None, ticket: Any = None) -> Any:
        response = start(None if timeout_s is None else time.time() + timeout_s)
        result, is_late = None, False
        try:
            result = await asyncio.wait_for(self.awaiter(asyncio.shield(response)), timeout_s)
            return result
        except asyncio.TimeoutError:
            _cancel(response)
            is_late = True
            raise DeadlineExceeded(late) from None
        except BaseException:
            _cancel(response)
            raise
        finally:
            if gate is not None:
                gate.end(ticket, result, is_late)

    async def _settle(self, key: str, flight: _Flight) -> Any:
        result = None
        try:
            result = await self.awaiter(flight.response)
        finally:
            if self.flights.get(key) is flight:
                del self.flights[key]
            flight.end(result)
        self._store(key, result)
        return result

    def _abandon(self, key: str, flight: _Flight, late: bool = False) -> None:
        """No one waits: cancel the computation (and what it queued); its ticket leaves the ledger."""
        if self.flights.get(key) is flight:
            del self.flights[key]
        _cancel(flight.response)
        flight.task.cancel()
        flight.end(None, late)

    def _store(self, key: str, result: Any) -> None:
        if self.cache is None or has_page_errors(result):
            return
        self.cache.put(key, result)
        if self.metrics is not None:
            self.metrics.bytes.set(self.cache.bytes)
            self.metrics.entries.set(len(self.cache))

    def _count(self, how: str) -> str:
        self.counts[how] += 1
        if self.metrics is not None:
            self.metrics.lookups.inc(tags={"result": how})
        return how

    def stats(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "in_flight": len(self.flights),
                "entries": len(self.cache) if self.cache is not None else 0,
                "bytes": self.cache.bytes if self.cache is not None else 0}


class Deferred:
    """A computation's start (Dedupe's `start`) whose argument is made
    first, then the call made with it: `make` (awaited: a large body put
    into the object store off the loop) then `call(arg)` (a handle call).
    Awaitable, and with .cancel() as a handle's response has: cancelled
    before the call, the call is never made; after, the call is cancelled.
    So the argument is made only for a computation that starts (not for a
    cache hit, a shared flight or a refusal)."""

    def __init__(self, make: Awaitable[Any], call: Callable[[Any], Any]):
        self.call = call
        self.response: Any = None
        self.task = asyncio.ensure_future(self._run(make))

    async def _run(self, make: Awaitable[Any]) -> Any:
        arg = await make
        self.response = self.call(arg)
        return await self.response

    def cancel(self) -> None:
        if self.response is not None:
            _cancel(self.response)
        self.task.cancel()

    def __await__(self):
        return self.task.__await__()


def has_page_errors(result: Any) -> bool:
    """A document's answer with a page that was not read (over its budget,
    its worker busy): not kept, so the next request for it reads that page
    again rather than getting the error back for the cache's TTL."""
    pages = result.get("pages") if isinstance(result, dict) else None
    return isinstance(pages, list) and any(isinstance(p, dict) and "error" in p for p in pages)


def _cancel(response: Any) -> None:
    cancel = getattr(response, "cancel", None)
    if cancel is not None:
        cancel()
