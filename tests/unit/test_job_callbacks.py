"""Job callbacks (issue 48, items 1-3) on both books: the SQLite journal and
a real redis-server (harness/redis_server.py). Events go to a real HTTP
receiver on 127.0.0.1 (harness/webhooks.py), allowed by config; signatures
are checked with the `standardwebhooks` library, as a receiver would.
Retry pauses are 0.2-0.5 s (jobs.callbacks.retry_s); the tests wait for
what the receiver or the book shows, never for a sleep to outrun code."""

from __future__ import annotations

import asyncio
import itertools
import socket

import pytest
from jobfakes import FakePipeline, settle, until
from standardwebhooks import Webhook

from harness.webhooks import HANG, SECRET, Receiver
from serve_app.core.app_args import JobArgs
from serve_app.core.errors import BadRequest, Overloaded
from serve_app.core.request_options import OcrOptions
from serve_app.jobs.book import JobBook
from serve_app.jobs.callback_targets import TargetPolicy, TargetRefused, check_target, parse_target
from serve_app.jobs.callbacks import REFUSED

_names = itertools.count()
LOCAL = {"allow": ["127.0.0.0/8"], "retry_s": [0.2, 0.2, 0.2, 0.2], "public_url": "http://ocr.example:8000"}


@pytest.fixture(params=["sqlite", "redis"])
def books(request, tmp_path, monkeypatch):
    return book_maker(request, tmp_path, monkeypatch)


def book_maker(request, tmp_path, monkeypatch):
    """make(**callbacks args) -> a started book with FakePipeline; books made
    by one test share one journal file (sqlite) or one Redis book."""
    monkeypatch.setenv("OCR_WEBHOOK_SECRET", SECRET)
    backend = request.param
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    prefix = f"ocr:{{cb{next(_names)}}}:"
    made = []

    async def make(secret: bool = True, **callbacks) -> JobBook:
        if not secret:
            monkeypatch.delenv("OCR_WEBHOOK_SECRET")
        args = dict(capacity=50, callbacks={**LOCAL, **callbacks})
        if backend == "redis":
            from serve_app.jobs.redis_book import RedisJobBook

            book = RedisJobBook(FakePipeline().run, JobArgs(backend="redis", **args), url=url, prefix=prefix)
        else:
            book = JobBook(FakePipeline().run, JobArgs(journal=str(tmp_path / "jobs.sqlite"), **args))
        await book.start()
        made.append(book)
        return book

    async def close(book):
        made.remove(book)
        if hasattr(book, "aclose"):
            await book.aclose()
        else:
            book.close()
            await book.callbacks.aclose()

    async def close_all():
        for book in list(made):
            await close(book)

    make.close, make.close_all = close, close_all
    return make


def run(coro):
    return asyncio.run(coro)


async def job_with_callback(book, url, image=b"hello") -> str:
    return (await book.submit(image, OcrOptions(), client="addr:1.2.3.4", callback_url=url))["job_id"]


async def callback_of(book, job_id) -> dict:
    return (await book.get(job_id)).get("callback", {})


async def until_async(book, job_id, test, timeout_s=30.0) -> dict:
    seen = {}

    async def check():
        nonlocal seen
        seen = await callback_of(book, job_id)
        return test(seen)

    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(seen)
        await asyncio.sleep(0.02)
    return seen


# -- targets ------------------------------------------------------------------

@pytest.mark.parametrize("url, reason", [
    ("ftp://example.com/x", "scheme"), ("http:///path", "no host"), ("https://user:pw@example.com/", "credentials"),
    ("http://example.com:99999/", "not a valid URL"), ("http://exa mple.com/", "white space"),
    ("http://example.com/" + "a" * 3000, "characters"), ("example.com/hook", "scheme"),
])
def test_a_malformed_callback_url_is_refused_naming_why(url, reason):
    with pytest.raises(TargetRefused) as e:
        parse_target(url)
    assert e.value.status == 400 and reason in e.value.message


@pytest.mark.parametrize("host, kind", [
    ("127.0.0.1", "loopback"), ("10.1.2.3", "private"), ("192.168.0.1", "private"),
    ("169.254.169.254", "link-local"), ("224.0.0.1", "multicast"), ("0.0.0.0", "unspecified"),
    ("100.64.0.1", "non-global"), ("240.0.0.1", "reserved"), ("[fec0::1]", "site-local"),
    ("[2001:db8::1]", "private"), ("192.0.0.170", "private"), ("[::1]", "loopback"), ("[fe80::1]", "link-local"),
    ("[ff02::1]", "multicast"), ("[::]", "unspecified"), ("[fc00::1]", "private"),
    ("[::ffff:127.0.0.1]", "loopback"), ("[::ffff:10.0.0.1]", "private"), ("[64:ff9b::7f00:1]", "loopback"),
    ("[2002:7f00:1::1]", "loopback"),
])
def test_each_kind_of_non_public_address_is_refused(host, kind):
    with pytest.raises(TargetRefused) as e:
        run(check_target(f"http://{host}:8080/hook", TargetPolicy()))
    assert f"a {kind} address" in e.value.message and "jobs.callbacks.allow" in e.value.message


def test_a_host_name_resolving_to_loopback_is_refused_unless_allowed():
    async def allowed(entries, url):
        policy = TargetPolicy(entries)
        await policy.resolve_names()
        return await check_target(url, policy)

    with pytest.raises(TargetRefused) as e:
        run(check_target("http://localhost:8080/hook", TargetPolicy()))
    assert "'localhost' resolves to an address that is not public" in e.value.message
    assert "127.0.0.1" not in e.value.message and "loopback" not in e.value.message  # nothing of what is inside
    assert run(allowed(["localhost"], "http://localhost:8080/hook")).host == "localhost"
    assert run(allowed(["127.0.0.0/8", "::1/128"], "http://localhost:8080/hook")).port == 8080
    assert run(check_target("https://8.8.8.8/hook", TargetPolicy())).port == 443  # public: allowed
    with pytest.raises(TargetRefused):  # an allowed network does not allow the others
        run(check_target("http://10.0.0.1/hook", TargetPolicy(["127.0.0.0/8"])))
    with pytest.raises(TargetRefused) as e:
        run(check_target("http://no-such-host.invalid/hook", TargetPolicy()))
    assert "does not resolve" in e.value.message and "Errno" not in e.value.message


def test_a_refused_target_or_no_secret_is_a_400_and_nothing_is_accepted(books):
    async def go():
        book = await books(allow=[])
        with pytest.raises(BadRequest) as refused:
            await job_with_callback(book, "http://127.0.0.1:9/hook")
        counts = await book.acounts()
        await books.close_all()
        nosecret = await books(secret=False)
        with pytest.raises(BadRequest) as unsigned:
            await job_with_callback(nosecret, "http://127.0.0.1:9/hook")
        plain = await nosecret.submit(b"plain", OcrOptions(), client="c")  # a job without a callback is fine
        counts2 = await nosecret.acounts()
        await books.close_all()
        return refused.value, counts, unsigned.value, plain, counts2

    refused, counts, unsigned, plain, counts2 = run(go())
    assert refused.status == 400 and "loopback" in refused.message and counts == {}
    assert unsigned.status == 400 and "OCR_WEBHOOK_SECRET" in unsigned.message
    assert plain["status"] == "queued" and sum(counts2.values()) == 1


# -- delivery -----------------------------------------------------------------

def test_a_signed_event_verifies_and_a_500_is_retried_with_the_same_id(books):
    async def go():
        with Receiver(answers=(500, 503)) as hook:
            book = await books()
            job = await job_with_callback(book, hook.url)
            await settle(book, [job])
            cb = await until_async(book, job, lambda c: c.get("state") == "delivered")
            await books.close_all()
            return job, hook.events, cb

    job, events, cb = run(go())
    assert len(events) == 3
    bodies = [Webhook(SECRET).verify(body, headers) for headers, body, _ in events]  # raises unless signed
    assert {h["webhook-id"] for h, _, _ in events} == {f"msg_{job}"}
    assert bodies[0] == bodies[2] and bodies[0]["type"] == "job.succeeded"
    assert bodies[0]["data"] == {"job_id": job, "status": "succeeded", "url": f"http://ocr.example:8000/v1/ocr/jobs/{job}"}
    assert events[2][2] - events[0][2] >= 0.4  # two pauses of 0.2 s
    with pytest.raises(Exception):  # another secret: not verified
        Webhook("whsec_" + "QUJD" * 8).verify(events[0][1], events[0][0])
    assert cb["state"] == "delivered" and cb["attempts"] == 3 and cb["last_status"] == 200
    assert cb["webhook_id"] == f"msg_{job}" and cb["url"].endswith("/hook") and "delivered_at" in cb


def test_a_failed_job_is_reported_and_a_refused_connection_is_retried_until_the_receiver_is_up(books):
    async def go():
        hook = Receiver()  # its port is free: connections are refused until it starts
        book = await books(retry_s=[0.2] * 50)
        job = await job_with_callback(book, hook.url, image=b"bad")
        waiting = await until_async(book, job, lambda c: c.get("attempts", 0) >= 2)
        with hook:
            cb = await until_async(book, job, lambda c: c.get("state") == "delivered")
            await books.close_all()
        return waiting, cb, hook.events

    waiting, cb, events = run(go())
    assert waiting["state"] == "pending" and "last_status" not in waiting and waiting["last_error"]
    assert "next_attempt_at" in waiting
    assert cb["state"] == "delivered" and cb["attempts"] >= 3 and len(events) == 1
    assert Webhook(SECRET).verify(events[0][1], events[0][0])["type"] == "job.failed"


def test_a_pending_delivery_survives_a_restart_of_the_store(books):
    """The receiver is down while the job ends; the store stops; a new
    store on the same book (journal file, Redis) delivers the event."""
    async def go():
        hook = Receiver()
        book = await books(retry_s=[0.5] * 60, timeout_s=1.0)
        job = await job_with_callback(book, hook.url)
        await until_async(book, job, lambda c: c.get("attempts", 0) >= 1)
        await books.close(book)
        with hook:
            again = await books(retry_s=[0.5] * 60, timeout_s=1.0)
            cb = await until_async(again, job, lambda c: c.get("state") == "delivered", timeout_s=60)
            await books.close_all()
        return job, cb, hook.events

    job, cb, events = run(go())
    assert cb["state"] == "delivered" and len(events) == 1 and events[0][0]["webhook-id"] == f"msg_{job}"


def test_a_delivery_is_given_up_after_its_schedule_and_a_redirect_is_not_followed(books):
    async def go():
        with Receiver() as elsewhere, Receiver(answers=(307,) * 10, location=elsewhere.url) as hook:
            book = await books(retry_s=[0.2, 0.2])
            job = await job_with_callback(book, hook.url)
            cb = await until_async(book, job, lambda c: c.get("state") == "given_up")
            await books.close_all()
            return cb, len(hook.events), len(elsewhere.events)

    cb, tries, elsewhere = run(go())
    assert cb["attempts"] == 3 and cb["last_status"] == 307 and tries == 3 and elsewhere == 0


def test_a_slow_receiver_holds_neither_jobs_nor_other_deliveries(books):
    """The most a receiver can cost: one delivery place for timeout_s. One
    receiver never answers; another job's event is delivered meanwhile, and
    the hung attempt ends at the timeout, to be retried."""
    async def go():
        with Receiver(answers=(HANG,)) as slow, Receiver() as fast:
            book = await books(concurrency=2, timeout_s=3.0)
            first = await job_with_callback(book, slow.url, image=b"one")
            await until(lambda: len(slow.events) == 1)
            second = await job_with_callback(book, fast.url, image=b"two")
            third = (await book.submit(b"three", OcrOptions(), client="c"))["job_id"]
            await until(lambda: len(fast.events) == 1)
            views = await settle(book, [second, third])
            hung = await until_async(book, first, lambda c: c.get("attempts", 0) >= 1)
            slow.release()
            done = await until_async(book, first, lambda c: c.get("state") == "delivered")
            await books.close_all()
            return views, hung, done

    views, hung, done = run(go())
    assert all(v["status"] == "succeeded" for v in views.values())
    assert hung["last_error"] == "timed out: no answer within 3 s" and done["attempts"] >= 2


def test_a_slow_receiver_with_many_events_holds_at_most_its_places(books):
    """Three events for a receiver that does not answer and one for another
    host, four places: the slow host gets one at a time (per_target 1), the
    other's event is delivered meanwhile; all are delivered once it answers."""
    async def go():
        with Receiver(answers=(HANG,) * 3) as slow, Receiver(host="127.0.0.2") as fast:
            book = await books(concurrency=4, per_target=1, timeout_s=30.0)
            slow_jobs = [await job_with_callback(book, slow.url, image=f"s{k}".encode()) for k in range(3)]
            await until(lambda: len(slow.events) == 1)
            fast_job = await job_with_callback(book, fast.url, image=b"f")
            await until_async(book, fast_job, lambda c: c.get("state") == "delivered")
            in_flight_to_slow = len(slow.events)
            slow.release()
            for job in slow_jobs:
                await until_async(book, job, lambda c: c.get("state") == "delivered")
            await books.close_all()
            return in_flight_to_slow, len(slow.events)

    in_flight, total = run(go())
    assert in_flight == 1 and total == 3


def test_open_deliveries_are_bounded_in_all_and_per_client(books):
    """One client's black-holed targets fill its own share of the open
    deliveries, never the book: another client's callbacks are accepted."""
    async def go():
        book = await books(max_pending=3, max_pending_per_client=2, retry_s=[30.0])
        hook = Receiver()  # down
        for k in range(2):
            await job_with_callback(book, hook.url, image=f"j{k}".encode())
        with pytest.raises(Overloaded) as mine:
            await job_with_callback(book, hook.url, image=b"j2")
        other = await book.submit(b"o1", OcrOptions(), client="addr:5.6.7.8", callback_url=hook.url)
        with pytest.raises(Overloaded) as over:
            await book.submit(b"o2", OcrOptions(), client="addr:9.9.9.9", callback_url=hook.url)
        plain = await book.submit(b"plain", OcrOptions(), client="c")
        await books.close_all()
        return mine.value, other, over.value, plain

    mine, other, over, plain = run(go())
    assert mine.status == 503 and "max_pending_per_client" in mine.message and other["status"] == "queued"
    assert over.status == 503 and "(jobs.callbacks.max_pending)" in over.message and plain["status"] == "queued"


def test_the_address_connected_to_is_the_address_checked(monkeypatch, tmp_path):
    """DNS rebinding: a name that resolves to a public address at submit and
    to 127.0.0.1 when the event is sent is refused at connect time; the
    receiver listening there gets nothing."""
    monkeypatch.setenv("OCR_WEBHOOK_SECRET", SECRET)
    real = socket.getaddrinfo
    asked = []

    def rebinding(host, *args, **kwargs):
        if host == "rebind.example":
            asked.append(host)
            ip = "93.184.216.34" if len(asked) == 1 else "127.0.0.1"
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, args[0] if args else 80))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)

    async def go():
        with Receiver() as hook:
            book = JobBook(FakePipeline().run, JobArgs(callbacks={"retry_s": [0.2, 0.2]}))
            await book.start()
            job = await job_with_callback(book, f"http://rebind.example:{hook.port}/hook")
            cb = await until_async(book, job, lambda c: c.get("state") == "given_up")
            book.close()
            await book.callbacks.aclose()
            return cb, hook.events

    cb, events = run(go())
    assert len(asked) >= 2 and events == []
    assert cb["last_error"] == REFUSED and cb["attempts"] == 3  # (never the internal address it reached)
