"""Issue 59: what a stranger could turn job callbacks and page streams
against: another client's receiver, the service's own Host header, internal
addresses and ports, the bounds and the claims. Both books (SQLite journal,
a real redis-server); events to a real HTTP receiver on 127.0.0.1
(harness/webhooks.py) verified with the `standardwebhooks` library, as a
receiver would. The tests wait for what the receiver or the book shows."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sqlite3

import pytest
from jobfakes import FakePipeline, settle, until
from standardwebhooks import Webhook
from test_job_callbacks import LOCAL, book_maker, job_with_callback, run, until_async

from harness.hostile import png_strip
from harness.webhooks import HANG, SECRET, Receiver
from serve_app.core.app_args import JobArgs
from serve_app.core.errors import BadRequest, ConfigError, Overloaded
from serve_app.core.job_args import CallbackArgs
from serve_app.core.request_options import OcrOptions
from serve_app.jobs.book import JobBook
from serve_app.jobs.callback_targets import TargetPolicy, TargetRefused, check_target
from serve_app.jobs.callbacks import Signer

ALICE = "whsec_" + "QWxpY2UncyBzZWNyZXQsIDI0IGJ5dGVzIQ=="  # 24 bytes
BOB = "whsec_" + "Qm9iJ3Mgc2VjcmV0LCB0d2VudHktZm91ciBieXQ="  # 27 bytes


@pytest.fixture(params=["sqlite", "redis"])
def books(request, tmp_path, monkeypatch):
    return book_maker(request, tmp_path, monkeypatch)


def fake_dns(monkeypatch, names: dict) -> list:
    """getaddrinfo answering `names` (name -> address, or a callable giving
    it), the rest as the system does; returns the names asked, in order."""
    real = socket.getaddrinfo
    asked: list = []

    def lookup(host, *args, **kwargs):
        if host in names:
            asked.append(host)
            ip = names[host]() if callable(names[host]) else names[host]
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            return [(fam, socket.SOCK_STREAM, 6, "", (ip, args[0] if args else 80))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return asked


# -- who signed it --------------------------------------------------------------

@pytest.mark.parametrize("value", ["whsec_AAAA", "plainsecret", "whsec_" + "A" * 20 + "!!", "whsec_" + "QUJD" * 4,
                                   "whsec_" + "QUJD" * 30, "whsec_" + "QUJDRA" * 6 + "="])
def test_a_malformed_secret_stops_the_start_naming_the_setting(value):
    with pytest.raises(ConfigError) as e:
        Signer(CallbackArgs(), {"OCR_WEBHOOK_SECRET": value})
    assert "OCR_WEBHOOK_SECRET (jobs.callbacks.secret_env)" in e.value.message and value not in e.value.message


def test_a_malformed_secret_stops_the_book(monkeypatch):
    monkeypatch.setenv("OCR_WEBHOOK_SECRET", "whsec_AAAA")
    with pytest.raises(ConfigError) as e:
        JobBook(FakePipeline().run, JobArgs())
    assert "jobs.callbacks.secret_env" in e.value.message


def test_each_named_client_signs_with_its_own_secret(books, monkeypatch):
    """Client alice's events verify with alice's secret and not with bob's
    (nor the shared one); a named client without a secret of its own may
    not name a callback_url; a client without a name signs with the shared."""
    monkeypatch.setenv("ALICE_HOOK", ALICE)
    monkeypatch.setenv("BOB_HOOK", BOB)

    async def go():
        with Receiver() as hook:
            book = await books(client_secret_envs={"alice": "ALICE_HOOK", "bob": "BOB_HOOK"})
            alice = (await book.submit(b"a", OcrOptions(), client="token:alice", callback_url=hook.url))["job_id"]
            anon = (await book.submit(b"n", OcrOptions(), client="addr:1.2.3.4", callback_url=hook.url))["job_id"]
            with pytest.raises(BadRequest) as carol:
                await book.submit(b"c", OcrOptions(), client="token:carol", callback_url=hook.url)
            for job in (alice, anon):
                await until_async(book, job, lambda c: c.get("state") == "delivered")
            await books.close_all()
            return alice, anon, carol.value, {h["webhook-id"]: (h, body) for h, body, _ in hook.events}

    alice, anon, carol, events = run(go())
    headers, body = events[f"msg_{alice}"]
    assert Webhook(ALICE).verify(body, headers)["data"]["job_id"] == alice
    for other in (BOB, SECRET):
        with pytest.raises(Exception):
            Webhook(other).verify(body, headers)
    headers, body = events[f"msg_{anon}"]
    assert Webhook(SECRET).verify(body, headers)["data"]["job_id"] == anon
    with pytest.raises(Exception):
        Webhook(ALICE).verify(body, headers)
    assert carol.status == 400 and "'carol'" in carol.message and "client_secret_envs" in carol.message


def test_during_a_rotation_both_secrets_sign(books, monkeypatch):
    async def go():
        monkeypatch.setenv("OCR_WEBHOOK_SECRET", f"{BOB} {SECRET}")  # the new one, then the old one
        with Receiver() as hook:
            book = await books()
            job = await job_with_callback(book, hook.url)
            await until_async(book, job, lambda c: c.get("state") == "delivered")
            await books.close_all()
            return hook.events[0]

    headers, body, _ = run(go())
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert Webhook(BOB).verify(body, headers) == Webhook(SECRET).verify(body, headers)  # each alone verifies
    with pytest.raises(Exception):
        Webhook(ALICE).verify(body, headers)


class Quick:
    """A pipeline that reads any image at once (its result names no text)."""

    async def run(self, image, options, progress=None):
        return {"image": {"width": 1, "height": 1}, "results": []}


def test_a_signed_event_never_links_to_a_host_the_submitter_chose(monkeypatch, tmp_path):
    """Over the real HTTP app: a submit with `Host: evil.example` gets an
    event whose data.url is the configured public URL's."""
    from test_job_pages import http_over

    monkeypatch.setenv("OCR_WEBHOOK_SECRET", SECRET)

    async def go():
        with Receiver() as hook:
            book = JobBook(Quick().run, JobArgs(journal=str(tmp_path / "j.sqlite"), callbacks={
                **LOCAL, "public_url": "https://ocr.example.com/base/"}))
            await book.start()
            async with http_over(book) as client:
                r = await client.post(f"/v1/ocr/jobs?callback_url={hook.url}", content=png_strip(8, 8),
                                      headers={"Content-Type": "image/png", "Host": "evil.example",
                                               "X-Forwarded-Host": "evil.example"})
                job = r.json()["job_id"]
                await until(lambda: len(hook.events) == 1)
            book.close()
            await book.callbacks.aclose()
            return r, job, hook.events[0]

    r, job, (headers, body, _) = run(go())
    assert r.status_code == 202
    event = Webhook(SECRET).verify(body, headers)
    assert event["data"]["url"] == f"https://ocr.example.com/base/v1/ocr/jobs/{job}"


# -- where it may connect ---------------------------------------------------------

def test_allow_entries_name_ports_and_networks_are_strict(caplog):
    async def go():
        policy = TargetPolicy(["127.0.0.1:8443", "[::1]:9443", "10.0.0.0/8"])
        ok = [await check_target(u, policy) for u in ("http://127.0.0.1:8443/h", "http://[::1]:9443/h",
                                                       "http://10.2.3.4:6379/h")]
        refused = []
        for url in ("http://127.0.0.1:8265/h", "http://[::1]:8443/h", "http://127.0.0.2:8443/h"):
            with pytest.raises(TargetRefused) as e:
                await check_target(url, policy)
            refused.append(e.value.message)
        return ok, refused, policy.every_port()

    ok, refused, every_port = run(go())
    assert [t.port for t in ok] == [8443, 9443, 6379]
    assert "127.0.0.1 is a loopback address (port 8265)" in refused[0] and len(refused) == 3
    assert every_port == ["10.0.0.0/8"]
    for bad, said in (("10.1.2.3/8", "host bits set"), ("[fd00::5]8443", "[fd00::5]:8443"),
                      ("10.0.0.5:0", "1-65535"), ("bad_name!", "neither")):
        with pytest.raises(ConfigError) as e:
            TargetPolicy([bad])
        assert said in e.value.message and bad in e.value.message


def test_an_entry_open_on_every_port_is_logged_at_start(monkeypatch, caplog):
    monkeypatch.setenv("OCR_WEBHOOK_SECRET", SECRET)

    async def go():
        book = JobBook(FakePipeline().run, JobArgs(callbacks={"allow": ["10.0.0.0/8", "10.0.0.5:8443"]}))
        with caplog.at_level(logging.WARNING, logger="ray.serve"):
            await book.start()
        book.close()
        await book.callbacks.aclose()

    run(go())
    said = [r.getMessage() for r in caplog.records if "every port" in r.getMessage()]
    assert len(said) == 1 and "'10.0.0.0/8'" in said[0]


def test_an_allowed_name_allows_the_addresses_it_had_at_start_and_no_others(monkeypatch):
    """An allowed host name is resolved when the store starts; what it (or
    any name) resolves to later is checked like any other address."""
    now = {"ip": "10.0.0.5"}
    fake_dns(monkeypatch, {"hooks.internal": lambda: now["ip"], "other.example": "10.0.0.5"})

    async def go():
        policy = TargetPolicy(["hooks.internal:8443"])
        await policy.resolve_names()
        first = await check_target("http://hooks.internal:8443/h", policy)
        same_address = await check_target("http://other.example:8443/h", policy)
        now["ip"] = "169.254.169.254"  # its DNS now points at the metadata service
        with pytest.raises(TargetRefused) as later:
            await check_target("http://hooks.internal:8443/h", policy)
        with pytest.raises(TargetRefused) as other_port:
            await check_target("http://other.example:22/h", policy)
        return first, same_address, later.value, other_port.value

    first, same_address, later, other_port = run(go())
    assert first.key == same_address.key == "10.0.0.5"
    assert "not public" in later.message and "169.254" not in later.message
    assert other_port.status == 400
    with pytest.raises(ConfigError) as e:
        run(TargetPolicy(["no-such-host.invalid"]).resolve_names())
    assert "'no-such-host.invalid'" in e.value.message


def test_a_failed_attempt_says_unreachable_not_the_socket_error(books):
    async def go():
        book = await books(retry_s=[30.0])
        job = await job_with_callback(book, "http://127.0.0.1:9/hook")  # nothing listens
        cb = await until_async(book, job, lambda c: c.get("attempts", 0) >= 1)
        await books.close_all()
        return cb

    cb = run(go())
    assert cb["last_error"] == "unreachable" and cb["state"] == "pending"


def test_name_lookups_run_after_the_room_check_on_their_own_threads(monkeypatch, tmp_path):
    """A submit the book has no room for makes no lookup; a lookup that
    hangs leaves the loop's default executor (the book's hashing) free."""
    monkeypatch.setenv("OCR_WEBHOOK_SECRET", SECRET)
    import threading

    stuck = threading.Event()
    asked = fake_dns(monkeypatch, {"slow.example": lambda: stuck.wait(60) and "93.184.216.34"})

    async def go():
        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        book = JobBook(FakePipeline(open_gate=False).run, JobArgs(capacity=1, callbacks=LOCAL))
        await book.start()
        await book.submit(b"fill", OcrOptions(), client="c")
        with pytest.raises(Overloaded):
            await book.submit(b"x", OcrOptions(), client="d", callback_url="http://slow.example/h")
        no_room_asked = list(asked)
        book2 = JobBook(FakePipeline().run, JobArgs(callbacks=LOCAL))
        await book2.start()
        hanging = asyncio.ensure_future(book2.submit(b"y", OcrOptions(), client="d",
                                                     callback_url="http://slow.example/h"))
        await until(lambda: asked)
        free = await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 30)  # the default executor's one thread
        stuck.set()
        view = await hanging
        for b in (book, book2):
            b.close()
            await b.callbacks.aclose()
        return no_room_asked, free, view

    no_room_asked, free, view = run(go())
    assert no_room_asked == [] and free == "free" and view["status"] == "queued"


# -- bounds ---------------------------------------------------------------------

def test_the_per_target_bound_counts_the_resolved_address_not_the_name(books, monkeypatch):
    """Two names (wildcard DNS) for one receiver share its per_target places."""
    fake_dns(monkeypatch, {"a.hooks.test": "127.0.0.1", "b.hooks.test": "127.0.0.1"})

    async def go():
        with Receiver(answers=(HANG, HANG)) as slow:
            book = await books(concurrency=4, per_target=1, timeout_s=30.0)
            jobs = [await job_with_callback(book, f"http://{name}:{slow.port}/hook", image=name.encode())
                    for name in ("a.hooks.test", "b.hooks.test")]
            await until(lambda: len(slow.events) == 1)
            await settle(book, jobs)
            # both jobs ended and both deliveries are due; one place for the address: one in flight
            in_flight = len(slow.events)
            slow.release()
            for job in jobs:
                await until_async(book, job, lambda c: c.get("state") == "delivered")
            await books.close_all()
            return in_flight

    assert run(go()) == 1


def test_the_sqlite_books_checks_and_counts_are_one_step(monkeypatch, tmp_path):
    """Concurrent submits across the journal's write: never more accepted
    than capacity, nor more open deliveries than max_pending."""
    monkeypatch.setenv("OCR_WEBHOOK_SECRET", SECRET)

    async def go():
        book = JobBook(FakePipeline(open_gate=False).run, JobArgs(
            capacity=3, client_share=1.0, journal=str(tmp_path / "j.sqlite"),
            callbacks={**LOCAL, "max_pending": 2, "max_pending_per_client": 2}))
        await book.start()
        plain = await asyncio.gather(*(book.submit(f"p{k}".encode(), OcrOptions(), client="c")
                                       for k in range(8)), return_exceptions=True)
        book.close()
        await book.callbacks.aclose()
        book2 = JobBook(FakePipeline(open_gate=False).run, JobArgs(
            capacity=50, journal=str(tmp_path / "k.sqlite"),
            callbacks={**LOCAL, "max_pending": 2, "max_pending_per_client": 2}))
        await book2.start()
        hooked = await asyncio.gather(*(book2.submit(f"h{k}".encode(), OcrOptions(), client="c",
                                                     callback_url="http://127.0.0.1:9/h") for k in range(6)),
                                      return_exceptions=True)
        counts = (book.unfinished, len(book2.deliveries))
        book2.close()
        await book2.callbacks.aclose()
        return plain, hooked, counts

    plain, hooked, counts = run(go())
    assert sum(isinstance(v, dict) for v in plain) == 3 and all(isinstance(v, (dict, Overloaded)) for v in plain)
    assert sum(isinstance(v, dict) for v in hooked) == 2 and counts == (3, 2)


def test_the_redis_claim_scan_is_not_blocked_by_due_deliveries_to_busy_hosts(redis_url):
    """300 due deliveries to one busy host ahead of one to another host:
    the other is claimed in one scan."""
    import redis as syncredis

    from serve_app.jobs.book_callbacks import RedisLedger
    from serve_app.jobs.redis_book import RedisJobBook

    prefix = "ocr:{scan}:"
    r = syncredis.Redis.from_url(redis_url)
    pipe = r.pipeline()
    for k in range(300):
        pipe.hset(f"{prefix}cb:busy{k}", "rec", json.dumps({"host": "10.0.0.1", "state": "pending"}))
        pipe.zadd(f"{prefix}cbq", {f"busy{k}": k})
    pipe.hset(f"{prefix}cb:other", "rec", json.dumps({"host": "10.0.0.2", "state": "pending"}))
    pipe.zadd(f"{prefix}cbq", {"other": 1000})
    pipe.execute()

    async def go():
        book = RedisJobBook(FakePipeline().run, JobArgs(backend="redis"), url=redis_url, prefix=prefix)
        got = await RedisLedger(book).due(2000.0, 4, {"10.0.0.1": 2}, 2)
        await book.r.aclose()
        return got

    got = run(go())
    assert [job_id for job_id, _ in got] == ["other"]


# -- bugs -------------------------------------------------------------------------

def test_redis_an_expired_keys_new_job_keeps_its_callback(redis_url, monkeypatch):
    monkeypatch.setenv("OCR_WEBHOOK_SECRET", SECRET)
    from serve_app.jobs.redis_book import RedisJobBook

    async def go():
        with Receiver() as hook:
            book = RedisJobBook(FakePipeline().run, JobArgs(backend="redis", ttl_s=0.3, callbacks=LOCAL),
                                url=redis_url, prefix="ocr:{expkey}:")
            await book.start()
            first = (await book.submit(b"k", OcrOptions(), key="K1", client="c", callback_url=hook.url))["job_id"]
            await settle(book, [first])
            await until_async(book, first, lambda c: c.get("state") == "delivered")

            async def expired():
                return await book.get(first) is None
            deadline = asyncio.get_running_loop().time() + 30
            while not await expired() and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            second = (await book.submit(b"k", OcrOptions(), key="K1", client="c", callback_url=hook.url))["job_id"]
            await settle(book, [second])
            cb = await until_async(book, second, lambda c: c.get("state") == "delivered")
            await book.aclose()
            return first, second, cb

    first, second, cb = run(go())
    assert second != first and cb["webhook_id"] == f"msg_{second}"


def test_redis_a_late_outcome_after_a_reclaim_changes_nothing(redis_url):
    """Replica A claims a delivery; its claim runs out and replica B claims
    it again; A's late outcome (given up) is refused; B's is kept."""
    import redis as syncredis

    from serve_app.jobs.book_callbacks import RedisLedger
    from serve_app.jobs.redis_book import RedisJobBook

    prefix = "ocr:{cas}:"
    r = syncredis.Redis.from_url(redis_url)
    rec = {"host": "10.0.0.1", "state": "pending", "url": "http://x/", "webhook_id": "msg_j", "attempts": 0}
    r.hset(f"{prefix}cb:j", mapping={"rec": json.dumps(rec), "state": "pending"})
    r.sadd(f"{prefix}cbopen", "j")
    r.hset(f"{prefix}job:j", "status", "succeeded")  # (its job is kept: so is its delivery's record)
    r.zadd(f"{prefix}cbq", {"j": 1})

    async def go():
        book = RedisJobBook(FakePipeline().run, JobArgs(backend="redis"), url=redis_url, prefix=prefix)
        ledger = RedisLedger(book)
        (_, a), = await ledger.due(10.0, 1, {}, 2)
        (_, b), = await ledger.due(10.0 + 1000, 1, {}, 2)  # A's claim ran out: claimed again
        late = await ledger.record("j", {**a, "state": "given_up", "attempts": 7})
        kept = await ledger.record("j", {**b, "state": "delivered", "attempts": 1})
        await book.r.aclose()
        return late, kept

    late, kept = run(go())
    stored = json.loads(r.hget(f"{prefix}cb:j", "rec"))
    assert late is False and kept is True and stored["state"] == "delivered" and "_claim" not in stored


def test_sqlite_close_closes_the_http_session(books):
    async def go():
        with Receiver() as hook:
            book = await books()
            job = await job_with_callback(book, hook.url)
            await until_async(book, job, lambda c: c.get("state") == "delivered")
            session = book.callbacks._session
            book.close()  # the sqlite book's close (sync), as the store calls it
            await until(lambda: session.closed)
            await books.close_all()
            return session.closed

    assert run(go())


def test_sqlite_recover_drops_an_orphan_waiting_delivery(monkeypatch, tmp_path):
    monkeypatch.setenv("OCR_WEBHOOK_SECRET", SECRET)
    path = tmp_path / "j.sqlite"

    async def start_and_stop():
        book = JobBook(FakePipeline(open_gate=False).run, JobArgs(journal=str(path), callbacks=LOCAL))
        await book.start()
        job = (await book.submit(b"x", OcrOptions(), client="c", callback_url="http://127.0.0.1:9/h"))["job_id"]
        book.close()
        await book.callbacks.aclose()
        return job

    job = run(start_and_stop())
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM jobs WHERE job_id = ?", (job,))  # its job gone, its waiting delivery left behind

    async def restart():
        book = JobBook(FakePipeline().run, JobArgs(journal=str(path), callbacks=LOCAL))
        await book.start()
        book.close()
        await book.callbacks.aclose()

    run(restart())
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT job_id FROM callbacks").fetchall()
    assert rows == []
