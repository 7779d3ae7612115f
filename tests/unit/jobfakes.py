"""A stand-in for the pipeline handle's `ocr.remote(image, options)`, and a
helper that waits for jobs to finish (unit tests of the job book)."""

from __future__ import annotations

import asyncio
import time

from serve_app.core.errors import BadImage


class FakePipeline:
    """`run(image, options)` like `pipeline.ocr.remote`; answers only once
    `gate` is set. Image b"bad" is the input's fault (BadImage); b"flaky"
    fails like a dead replica `flaky` times, then succeeds."""

    def __init__(self, open_gate: bool = True, flaky: int = 0):
        self.calls: list = []  # (image, options) per call
        self.gate = asyncio.Event()
        if open_gate:
            self.gate.set()
        self.flaky = flaky

    async def run(self, image, options, progress=None):
        self.calls.append((image, options))
        if image == b"pages" and progress is not None:  # a 3-page document: progress as it goes
            for done in range(4):
                progress(done, 3)
                await asyncio.sleep(0)
        await self.gate.wait()
        if image == b"bad":
            raise BadImage("not an image")
        if image == b"flaky" and self.flaky > 0:
            self.flaky -= 1
            raise ConnectionError("replica died")
        return {"results": [{"text": bytes(image).decode()}]}


async def until(condition, timeout_s=30.0) -> None:
    """Lets the loop run until condition() holds (the explicit step a test
    waits for), instead of a sleep that must outrun the code under test."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition never held")
        await asyncio.sleep(0.005)


async def settle(book, ids, timeout_s=30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        views = {i: await book.get(i) for i in ids}
        if all(v and v["status"] in ("succeeded", "failed") for v in views.values()):
            return views
        await asyncio.sleep(0.01)
    raise TimeoutError(views)
