"""Job callbacks (issue 48, items 1-2): when a job with a `callback_url`
ends, an event is POSTed there, signed by the Standard Webhooks scheme
(the `standardwebhooks` library signs; headers webhook-id,
webhook-timestamp, webhook-signature), at least once: retried after each
pause of jobs.callbacks.retry_s on any answer but a 2xx, a timeout or a
connection error, with the same webhook-id, then given up.

A delivery is a record kept in the job book beside its job (the SQLite
journal's `callbacks` table, a Redis hash), so that a restarted store, or
another replica, still delivers it. Its states: `waiting` (the job has not
ended), `pending` (to be sent at `next_attempt_at`), `delivered`,
`given_up`. The book provides the ledger (`due`: claim the deliveries due
now; `record`: keep an attempt's outcome); `Deliveries` runs them:
at most jobs.callbacks.concurrency at once, each within timeout_s, never on
a job worker. The HTTP client connects only through a resolver that checks
every address it returns (serve_app.jobs.callback_targets), follows no
redirect, keeps no cookie, uses no proxy, and reads no answer body.
No Ray import."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from datetime import datetime, timezone
from typing import Any, Callable, Optional, Protocol

from aiohttp.abc import AbstractResolver

from serve_app.core.errors import BadRequest, ConfigError, Overloaded
from serve_app.core.job_args import CallbackArgs
from serve_app.jobs.callback_targets import TargetPolicy, TargetRefused, check_target, parse_target

log = logging.getLogger("ray.serve")

WAITING, PENDING, DELIVERED, GIVEN_UP = "waiting", "pending", "delivered", "given_up"
OPEN = (WAITING, PENDING)


def new_record(job_id: str, url: str, result_url: str) -> dict:
    """A job's delivery as accepted with it (not yet due); `host`: the target's, for the per-target bound."""
    return {"url": url, "result_url": result_url, "webhook_id": f"msg_{job_id}", "state": WAITING, "attempts": 0,
            "host": parse_target(url).host}


def host_of(rec: dict) -> str:
    return rec.get("host") or parse_target(rec["url"]).host


def event_body(job_id: str, status: str, finished: float, result_url: str) -> str:
    """The event's JSON (the same bytes on every attempt): its type, when the
    job ended, and where its result is (not inlined)."""
    stamp = datetime.fromtimestamp(finished, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return json.dumps({"type": f"job.{status}", "timestamp": stamp,
                       "data": {"job_id": job_id, "status": status, "url": result_url}}, separators=(",", ":"))


def job_ended(rec: dict, job_id: str, status: str, finished: float) -> dict:
    """A waiting delivery made due now, its body fixed."""
    if rec.get("state") != WAITING:
        return rec
    return {**rec, "state": PENDING, "next_attempt_at": round(finished, 3),
            "body": event_body(job_id, status, finished, rec.get("result_url", ""))}


def after_attempt(rec: dict, status: Optional[int], error: Optional[str], now: float,
                  retry_s: tuple[float, ...]) -> dict:
    """The record after one attempt: delivered on a 2xx; else due again
    after the next pause of the schedule, or given up after the last."""
    out = {**rec, "attempts": rec.get("attempts", 0) + 1, "last_status": status, "last_error": error}
    if status is not None and 200 <= status < 300:
        out.update(state=DELIVERED, delivered_at=round(now, 3), next_attempt_at=None, last_error=None)
    elif out["attempts"] > len(retry_s):
        out.update(state=GIVEN_UP, next_attempt_at=None)
    else:
        out.update(state=PENDING, next_attempt_at=round(now + retry_s[out["attempts"] - 1], 3))
    return out


class Ledger(Protocol):
    async def due(self, now: float, n: int, busy: dict[str, int], per_target: int) -> list[tuple[str, dict]]:
        """Up to n deliveries due at `now`, claimed, no host past `per_target`
        with those in flight (`busy`: host -> attempts in flight here)."""

    async def record(self, job_id: str, rec: dict) -> None: ...


class Signer:
    """The secret from jobs.callbacks.secret_env (read when the store
    starts); without it a callback_url is refused at submit."""

    def __init__(self, args: CallbackArgs, environ: Optional[dict] = None):
        from standardwebhooks import Webhook

        self.env = args.secret_env
        secret = (environ if environ is not None else os.environ).get(args.secret_env, "")
        try:
            self.hook = Webhook(secret) if secret else None
        except Exception as e:  # noqa: BLE001  malformed base64, empty after the prefix
            raise ConfigError(f"the environment variable {args.secret_env} (jobs.callbacks.secret_env) is not a "
                              f"Standard Webhooks secret ({e!r}): use whsec_ followed by base64, e.g. "
                              f"whsec_$(head -c 32 /dev/urandom | base64)") from None

    def headers(self, webhook_id: str, body: str, now: float) -> dict[str, str]:
        stamp = datetime.fromtimestamp(int(now), timezone.utc)
        return {"webhook-id": webhook_id, "webhook-timestamp": str(int(now)),
                "webhook-signature": self.hook.sign(webhook_id, stamp, body), "content-type": "application/json",
                "user-agent": "ocr-serve-webhooks"}


class Callbacks:
    """What a book needs for callbacks: the submit-time checks and the delivery loop."""

    def __init__(self, args: CallbackArgs, environ: Optional[dict] = None, clock: Callable[[], float] = time.time):
        self.args = args
        self.policy = TargetPolicy(args.allow)
        self.signer = Signer(args, environ)
        self.clock = clock
        self.wake = asyncio.Event()
        self._task: Optional[asyncio.Task] = None
        self._sending: set[asyncio.Task] = set()
        self.busy: dict[str, int] = {}  # host -> attempts in flight here (jobs.callbacks.per_target)
        self._session: Any = None

    async def check(self, url: str, pending: int) -> None:
        """At submit, before the job is accepted: a secret, room, a target that is not refused."""
        if self.signer.hook is None:
            raise BadRequest(f"this service sends no callbacks: no signing secret is configured (the environment "
                             f"variable {self.signer.env}, jobs.callbacks.secret_env, is empty where the JobStore "
                             f"runs); poll the job instead")
        parse_target(url)
        if pending >= self.args.max_pending:
            raise Overloaded(f"the job book holds {pending} callback deliveries not yet done "
                             f"(jobs.callbacks.max_pending); retry later", retry_after_s=30)
        await check_target(url, self.policy)

    # -- the delivery loop ------------------------------------------------------
    def start(self, ledger: Ledger) -> None:
        self._task = asyncio.create_task(self._loop(ledger), name="job-callbacks")

    def poll_s(self) -> float:
        return min(1.0, max(0.05, min(self.args.retry_s, default=1.0) / 2))

    async def _loop(self, ledger: Ledger) -> None:
        while True:
            try:
                free = self.args.concurrency - len(self._sending)
                if free > 0:
                    for job_id, rec in await ledger.due(self.clock(), free, dict(self.busy), self.args.per_target):
                        host = host_of(rec)
                        self.busy[host] = self.busy.get(host, 0) + 1
                        t = asyncio.create_task(self._attempt(ledger, job_id, rec, host))
                        self._sending.add(t)
                        t.add_done_callback(self._sent)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001  the book away for a moment: try again
                log.error("job callbacks: %r", e)
            # (asyncio.wait, not wait_for: Python 3.11's wait_for can swallow a
            # cancellation that lands as its timeout fires, and the loop would go on)
            waiter = asyncio.ensure_future(self.wake.wait())
            try:
                await asyncio.wait([waiter], timeout=self.poll_s())
            finally:
                waiter.cancel()
            self.wake.clear()

    def _sent(self, task: asyncio.Task) -> None:
        self._sending.discard(task)
        self.wake.set()  # a place is free

    async def _attempt(self, ledger: Ledger, job_id: str, rec: dict, host: str) -> None:
        try:
            status, error = await self.post(rec["url"], rec["webhook_id"], rec.get("body", ""))
        finally:
            self.busy[host] -= 1
            if not self.busy[host]:
                del self.busy[host]
        done = after_attempt(rec, status, error, self.clock(), self.args.retry_s)
        if done["state"] != DELIVERED:
            log.info("job %s: callback attempt %d to %s: %s", job_id, done["attempts"], rec["url"],
                     status or error)
        try:
            await ledger.record(job_id, done)
        except Exception as e:  # noqa: BLE001  not recorded: it is sent again (at least once)
            log.error("job %s: callback outcome not recorded: %r", job_id, e)

    async def post(self, url: str, webhook_id: str, body: str) -> tuple[Optional[int], Optional[str]]:
        """One attempt: (HTTP status, None) or (None, what went wrong)."""
        import aiohttp

        try:
            target = parse_target(url)
            if _literal(target.host):  # aiohttp connects to a literal address without asking the resolver
                await self.policy.addresses(target.host, target.port)
            if self._session is None:
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(resolver=CheckedResolver(self.policy), force_close=True,
                                                   use_dns_cache=False, limit=self.args.concurrency),
                    cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=False)
            headers = self.signer.headers(webhook_id, body, self.clock())
            async with self._session.post(url, data=body.encode(), headers=headers, allow_redirects=False,
                                          timeout=aiohttp.ClientTimeout(total=self.args.timeout_s)) as resp:
                return resp.status, None  # the body is not read: the connection is closed
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            return None, f"no answer within {self.args.timeout_s:g} s"
        except TargetRefused as e:
            return None, e.message
        except Exception as e:  # noqa: BLE001  refused connection, DNS, TLS, a malformed answer
            cause = e.__cause__ if isinstance(e.__cause__, TargetRefused) else None
            return None, cause.message if cause else f"{type(e).__name__}: {e}"[:300]

    async def aclose(self) -> None:
        for t in [self._task, *self._sending]:
            if t is not None:
                t.cancel()
        if self._session is not None:
            await self._session.close()

    def close(self) -> None:
        for t in [self._task, *self._sending]:
            if t is not None:
                t.cancel()


def _literal(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


class CheckedResolver(AbstractResolver):
    """aiohttp's resolver for deliveries: the addresses it returns (and the
    connector then connects to) are those TargetPolicy has checked."""

    def __init__(self, policy: TargetPolicy):
        self.policy = policy

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict]:
        infos = await self.policy.addresses(host, port)
        return [{"hostname": host, "host": address, "port": port, "family": fam, "proto": 0,
                 "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV} for fam, address in infos]

    async def close(self) -> None:
        return None
