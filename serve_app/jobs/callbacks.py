"""Job callbacks (issue 48, items 1-2): when a job with a `callback_url`
ends, an event is POSTed there, signed by the Standard Webhooks scheme
(the `standardwebhooks` library signs; headers webhook-id,
webhook-timestamp, webhook-signature), at least once: retried after each
pause of jobs.callbacks.retry_s on any answer but a 2xx, a timeout or a
connection error, with the same webhook-id, then given up. Each client's
events are signed with its own secret (Signer), and a client holds at most
its share of the open deliveries (issue 59).

A delivery is a record kept in the job book beside its job (the SQLite
journal's `callbacks` table, a Redis hash), so that a restarted store, or
another replica, still delivers it. Its states: `waiting` (the job has not
ended), `pending` (to be sent at `next_attempt_at`), `delivered`,
`given_up`. The book provides the ledger (`due`: claim the deliveries due
now; `record`: keep an attempt's outcome, on Redis only while the claim
holds); `Callbacks` runs them: at most jobs.callbacks.concurrency at once,
at most per_target to one resolved address, each within timeout_s, never
on a job worker. The HTTP client connects only through a resolver that checks
every address it returns (serve_app.jobs.callback_targets), follows no
redirect, keeps no cookie, uses no proxy, and reads no answer body.
No Ray import."""

from __future__ import annotations

import asyncio
import binascii
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
REFUSED = "refused: the target's address is not allowed (jobs.callbacks.allow)"


def new_record(job_id: str, url: str, result_url: str, client: str = "", key: str = "") -> dict:
    """A job's delivery as accepted with it (not yet due): `client` signs it
    (its own secret) and counts it in its share; `host`: the target's key for
    the per-target bound (its resolved address: callback_targets.target_key)."""
    return {"url": url, "result_url": result_url, "webhook_id": f"msg_{job_id}", "state": WAITING, "attempts": 0,
            "host": key or parse_target(url).host, "client": client}


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


SECRET_BYTES = (24, 64)  # a signing secret's key length, decoded


def parse_secrets(raw: str, where: str) -> list[bytes]:
    """A secret setting's value: one or more `whsec_<base64>` (space
    between: during a rotation, the new and the old), each strict base64 of
    24 to 64 bytes; ConfigError naming `where` otherwise."""
    fix = "set it to whsec_ followed by base64 of 24 to 64 random bytes, e.g. whsec_$(head -c 32 /dev/urandom | base64)"
    keys = []
    for word in raw.split():
        if not word.startswith("whsec_"):
            raise ConfigError(f"{where} holds a value that is not a Standard Webhooks secret (no whsec_ prefix); {fix}")
        try:
            text = word[len("whsec_"):].encode()
            key = binascii.a2b_base64(text, strict_mode=True)
            if binascii.b2a_base64(key, newline=False) != text:  # canonical only: padded, no excess
                raise ValueError(text)
        except (ValueError, binascii.Error):
            raise ConfigError(f"{where} holds a secret whose part after whsec_ is not valid base64; {fix}") from None
        if not SECRET_BYTES[0] <= len(key) <= SECRET_BYTES[1]:
            raise ConfigError(f"{where} holds a secret of {len(key)} bytes, not {SECRET_BYTES[0]} to "
                              f"{SECRET_BYTES[1]}; {fix}")
        keys.append(key)
    if len(keys) > 4:
        raise ConfigError(f"{where} holds {len(keys)} secrets; a rotation needs two (the new and the old)")
    return keys


class Signer:
    """The signing secrets, read and checked when the store starts: the
    shared one (jobs.callbacks.secret_env), for clients without a name, and
    each named client's own (jobs.callbacks.client_secret_envs: token name
    -> environment variable), so that a receiver holding one client's
    secret verifies no event of another's. A setting may hold several
    secrets (a rotation): each signs, the signatures space-separated in
    webhook-signature, as Standard Webhooks allows."""

    def __init__(self, args: CallbackArgs, environ: Optional[dict] = None):
        from standardwebhooks import Webhook

        env = environ if environ is not None else os.environ
        self.env = args.secret_env
        self.shared = [Webhook(k) for k in parse_secrets(env.get(args.secret_env, ""), f"the environment variable "
                                                           f"{args.secret_env} (jobs.callbacks.secret_env)")]
        self.named: dict[str, list] = {}
        for name, var in args.client_secret_envs.items():
            where = f"the environment variable {var} (jobs.callbacks.client_secret_envs[{name!r}])"
            keys = parse_secrets(env.get(var, ""), where)
            if not keys:
                raise ConfigError(f"{where} is empty or unset where the JobStore runs: set it, or remove {name!r} "
                                  f"from jobs.callbacks.client_secret_envs")
            self.named[name] = [Webhook(k) for k in keys]

    def hooks(self, client: str) -> list:
        """The secrets that sign `client`'s events (none: it may name no callback_url)."""
        if client.startswith("token:"):
            return self.named.get(client[len("token:"):], [])
        return self.shared

    def missing(self, client: str) -> Optional[str]:
        """Why `client` may not name a callback_url (None: it may)."""
        if self.hooks(client):
            return None
        if client.startswith("token:"):
            return (f"this client ({client[len('token:'):]!r}) has no signing secret of its own "
                    f"(jobs.callbacks.client_secret_envs): the service sends its events to nobody; poll the job "
                    f"instead")
        return (f"this service sends no callbacks: no signing secret is configured (the environment variable "
                f"{self.env}, jobs.callbacks.secret_env, is empty where the JobStore runs); poll the job instead")

    def headers(self, client: str, webhook_id: str, body: str, now: float) -> dict[str, str]:
        stamp = datetime.fromtimestamp(int(now), timezone.utc)
        signatures = " ".join(h.sign(webhook_id, stamp, body) for h in self.hooks(client))
        return {"webhook-id": webhook_id, "webhook-timestamp": str(int(now)), "webhook-signature": signatures,
                "content-type": "application/json", "user-agent": "ocr-serve-webhooks"}


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
        self.busy: dict[str, int] = {}  # target key -> attempts in flight here (jobs.callbacks.per_target)
        self._session: Any = None
        self._closing: Optional[asyncio.Task] = None

    def per_client(self) -> int:
        return self.args.max_pending_per_client or max(1, self.args.max_pending // 10)

    def admit(self, url: str, client: str, pending: int, mine: int) -> None:
        """At submit, before anything is awaited or accepted: a secret for
        this client, a well-formed URL, room in the book's and this client's
        open deliveries (`pending`, `mine`). No name lookup here: it comes
        after the book's room check (`resolve`)."""
        why = self.signer.missing(client)
        if why is not None:
            raise BadRequest(why)
        parse_target(url)
        if pending >= self.args.max_pending:
            raise Overloaded(f"the job book holds {pending} callback deliveries not yet done "
                             f"(jobs.callbacks.max_pending); retry later", retry_after_s=30)
        if mine >= self.per_client():
            raise Overloaded(f"this client has {mine} callback deliveries not yet done here, its share "
                             f"(jobs.callbacks.max_pending_per_client); retry once they are delivered or given up",
                             retry_after_s=30)

    async def resolve(self, url: str) -> str:
        """The target resolved and checked (TargetRefused: 400); its key for the per-target bound."""
        return (await check_target(url, self.policy)).key

    # -- the delivery loop ------------------------------------------------------
    async def start(self, ledger: Ledger) -> None:
        """The allowed host names resolved (ConfigError if one does not), then the loop."""
        await self.policy.resolve_names()
        for entry in self.policy.every_port():
            log.warning("jobs.callbacks.allow has %r without a port: every port there is reachable by a job's "
                        "callback_url (a dashboard, a database); name the receiver's port (10.0.0.5:8443)", entry)
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
            status, error = await self.post(rec["url"], rec["webhook_id"], rec.get("body", ""), rec.get("client", ""))
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

    async def post(self, url: str, webhook_id: str, body: str, client: str = "") -> tuple[Optional[int], Optional[str]]:
        """One attempt: (HTTP status, None) or (None, what went wrong: refused,
        timed out or unreachable, never which socket error: that would tell
        a prober which internal ports are open)."""
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
            headers = self.signer.headers(client, webhook_id, body, self.clock())
            async with self._session.post(url, data=body.encode(), headers=headers, allow_redirects=False,
                                          timeout=aiohttp.ClientTimeout(total=self.args.timeout_s)) as resp:
                return resp.status, None  # the body is not read: the connection is closed
        except asyncio.CancelledError:
            raise
        except asyncio.TimeoutError:
            return None, f"timed out: no answer within {self.args.timeout_s:g} s"
        except TargetRefused:
            return None, REFUSED
        except Exception as e:  # noqa: BLE001  refused connection, DNS, TLS, a malformed answer
            if isinstance(e.__cause__, TargetRefused):
                return None, REFUSED
            log.info("callback to %s: %r", url, e)  # the operator's log has the socket error; the job does not
            return None, "unreachable"

    async def aclose(self) -> None:
        self.close()
        if self._closing is not None:
            await asyncio.wait([self._closing])

    def close(self) -> None:
        """Cancel the loop and the attempts, and close the HTTP session (a
        task on the running loop, awaited by aclose; without a loop its
        connector closes what it holds)."""
        for t in [self._task, *self._sending]:
            if t is not None:
                t.cancel()
        self.policy.close()
        session, self._session = self._session, None
        if session is not None and not session.closed:
            try:
                self._closing = asyncio.get_running_loop().create_task(session.close())
            except RuntimeError:
                session.connector.close()


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

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict]:  # noqa: ARG002
        infos = await self.policy.addresses(host, port)
        return [{"hostname": host, "host": address, "port": port, "family": fam, "proto": 0,
                 "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV} for fam, address in infos]

    async def close(self) -> None:
        return None
