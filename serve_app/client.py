"""Submitting OCR work to the running `ocr` application from other Ray jobs
or deployments, without blocking.

    import ray
    from serve_app.client import OcrClient
    ray.init(address="auto")
    client = OcrClient()
    response = client.submit(image_bytes)          # returns at once
    result = response.result()                     # or `await response`
    for item in client.map(images, max_in_flight=16):   # results as they complete
        print(item.index, item.result or item.error)

`submit`/`read`/`aread` are interactive work (served first); `map`/`amap`
send their images in the bulk lane (serve_app.core.lanes) unless the options
name a `priority`.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable, Iterator, Optional


@dataclass(frozen=True)
class MapItem:
    """One image's outcome in `map`/`amap`: its position in the input, and
    either the result dict or the exception it raised."""

    index: int
    result: Optional[dict] = None
    error: Optional[BaseException] = None


def bulk(options: Optional[dict]) -> dict:
    """Options for many images at once: the bulk lane, unless they name one."""
    return {"priority": "bulk", **(options or {})}


class OcrClient:
    def __init__(self, app_name: str = "ocr", max_in_flight: int = 16):
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.app_name = app_name
        self.max_in_flight = max_in_flight
        self._handle = None

    @property
    def handle(self):
        if self._handle is None:
            from ray import serve

            self._handle = serve.get_app_handle(self.app_name)
        return self._handle

    def submit(self, image: Any, options: Optional[dict] = None):
        """Send one image (encoded bytes or a numpy array) or a PDF's bytes
        (answered with its pages); returns a DeploymentResponse at once.
        `.result()` or `await` it."""
        return self.handle.ocr.remote(image, options)

    def read(self, image: Any, options: Optional[dict] = None, timeout_s: Optional[float] = None) -> dict:
        return self.submit(image, options).result(timeout_s=timeout_s)

    async def aread(self, image: Any, options: Optional[dict] = None) -> dict:
        return await self.submit(image, options)

    def map(self, images: Iterable[Any], options: Optional[dict] = None,
            max_in_flight: Optional[int] = None) -> Iterator[MapItem]:
        """Results as they complete, at most `max_in_flight` images in flight
        (the input is consumed lazily). Never raises for one image's failure:
        its MapItem carries the error."""
        limit = max_in_flight or self.max_in_flight
        options = bulk(options)
        pending: dict[Future, int] = {}
        it = enumerate(images)

        def fill() -> None:
            for index, image in it:
                pending[self._future(self.submit(image, options))] = index
                if len(pending) >= limit:
                    return

        fill()
        while pending:
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for f in done:
                index = pending.pop(f)
                e = f.exception()
                yield MapItem(index, None if e else f.result(), e)
            fill()

    @staticmethod
    def _future(response) -> Future:
        """A concurrent Future resolved when the response is, by a small
        daemon thread (DeploymentResponse has no completion callback)."""
        fut: Future = Future()

        def wait_result():
            try:
                fut.set_result(response.result())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

        threading.Thread(target=wait_result, daemon=True).start()
        return fut

    async def amap(self, images: Iterable[Any], options: Optional[dict] = None,
                   max_in_flight: Optional[int] = None) -> AsyncIterator[MapItem]:
        """Async `map`, for use inside deployments or async drivers."""
        limit = max_in_flight or self.max_in_flight
        options = bulk(options)
        pending: dict[asyncio.Task, int] = {}
        it = enumerate(images)

        async def one(image):
            return await self.submit(image, options)

        def fill() -> None:
            for index, image in it:
                pending[asyncio.ensure_future(one(image))] = index
                if len(pending) >= limit:
                    return

        fill()
        while pending:
            done, _ = await asyncio.wait(list(pending), return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                index = pending.pop(t)
                e = t.exception()
                yield MapItem(index, None if e else t.result(), e)
            fill()
