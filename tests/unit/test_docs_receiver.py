"""The receiver example of docs/jobs.md ("A receiver"), run as written:
its code is taken from the doc and served on 127.0.0.1; a real job book
(SQLite journal) sends it a job's event; then a retry of the same event,
an event with a stale timestamp and a forged one are posted to it."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import requests
from jobfakes import FakePipeline
from standardwebhooks import Webhook
from test_job_callbacks import LOCAL

from harness.redis_server import free_port
from harness.webhooks import SECRET
from serve_app.core.app_args import JobArgs
from serve_app.core.request_options import OcrOptions
from serve_app.jobs.book import JobBook

DOC = Path(__file__).resolve().parents[2] / "docs" / "jobs.md"


def receiver_example() -> dict:
    """The doc's receiver: the first python block under '### A receiver', executed."""
    text = DOC.read_text()
    section = text[text.index("### A receiver"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {"__name__": "receiver_example"}
    exec(compile(code, f"{DOC}:A receiver", "exec"), namespace)  # noqa: S102  the doc's own code
    return namespace


def test_the_docs_receiver_verifies_deduplicates_and_refuses_stale_or_forged_events(monkeypatch, tmp_path):
    monkeypatch.setenv("OCR_WEBHOOK_SECRET", SECRET)
    example = receiver_example()
    handled: list[dict] = []
    events = example["Events"](SECRET, handled.append)
    port = free_port("127.0.0.1")
    server = example["serve"](events, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{port}/hook"

    async def deliver():
        book = JobBook(FakePipeline().run, JobArgs(journal=str(tmp_path / "j.sqlite"), callbacks=LOCAL))
        await book.start()
        job = (await book.submit(b"hello", OcrOptions(), client="c", callback_url=url))["job_id"]
        deadline = time.monotonic() + 30
        while (await book.get(job)).get("callback", {}).get("state") != "delivered":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        view = await book.get(job)
        book.close()
        await book.callbacks.aclose()
        return job, view

    try:
        job, view = asyncio.run(deliver())
        assert view["callback"]["last_status"] == 204 and [e["data"]["job_id"] for e in handled] == [job]

        hook = Webhook(SECRET)
        body = '{"type":"job.succeeded","data":{"job_id":"%s"}}' % job

        def post(msg_id: str, when: datetime, payload: str = body, signer: Webhook = hook) -> int:
            headers = {"webhook-id": msg_id, "webhook-timestamp": str(int(when.timestamp())),
                       "webhook-signature": signer.sign(msg_id, when, payload), "content-type": "application/json"}
            return requests.post(url, data=payload.encode(), headers=headers, timeout=10).status_code

        now = datetime.now(timezone.utc)
        again = post(f"msg_{job}", now)  # the same webhook-id again (a retry): acknowledged, not handled
        stale = post("msg_other", now - timedelta(minutes=10))  # signed, but 10 minutes old: a replay
        forged = post("msg_forged", now, signer=Webhook("whsec_" + "QUJD" * 8))
    finally:
        server.shutdown()
        server.server_close()
    assert (again, stale, forged) == (204, 401, 401)
    assert len(handled) == 1
