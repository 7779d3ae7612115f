"""The pipeline run in the ingress's own process (`ingress.pipeline_in_ingress`).

The ingress then reads a synchronous request (HTTP, batch items, PaddleX's
route, the handle API) through the same OcrPipeline code, but as an object
in its own process over the model deployments' handles: one Ray hop less,
and the image's bytes (and the result's body) are not copied to and from
another process. Everything else the ingress asked the OcrPipeline
deployment (ready, stats) still goes there, and the JobStore keeps reading
jobs through it. No Ray import here: the caller builds the local object."""

from __future__ import annotations

import asyncio
from typing import Any, Callable


class LocalMethod:
    """`method.remote(*args)` like a deployment handle's, run on this event
    loop: an asyncio.Task (awaitable, `.cancel()`)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Task:
        return asyncio.ensure_future(self.fn(*args, **kwargs))


class PipelineHere:
    """Stands where the OcrPipeline handle stood: `ocr.remote(...)` runs
    `local.ocr` here; any other attribute is the handle's."""

    def __init__(self, local: Any, handle: Any):
        self.local = local
        self.handle = handle
        self.ocr = LocalMethod(local.ocr)

    def __getattr__(self, name: str) -> Any:  # only for names not set above
        return getattr(self.__dict__["handle"], name)
