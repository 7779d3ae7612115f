"""A Front (serve_app/http/front.py) over stand-in pipeline and job-store
handles, and the app built over it, for the route tests (tests/unit/
test_http_routes.py; tests/integration/test_ingress_routes.py gives it
Ray's errors). No Ray: `Fake` records what reached the handles."""

from __future__ import annotations

import asyncio
import json
import types
from typing import Any, Callable, Optional

from serve_app.core.app_args import CacheArgs, IngressArgs, LaneArgs
from serve_app.core.engine_config import DocumentLimits, EngineConfig, ImageLimits
from serve_app.core.errors import BadImage
from serve_app.flow.render_pool import RenderPool, render_here
from serve_app.http.front import Front, HandleErrors
from serve_app.http.paddlex import PaddleXDefaults
from serve_app.http.policies.admission import Admission


class Metric:
    """A counter or histogram that keeps the tags of each call."""

    def __init__(self):
        self.seen: list[dict] = []

    def inc(self, tags=None):
        self.seen.append(tags)

    def observe(self, value, tags=None):
        self.seen.append(tags)


class Method:
    """`handle.method.remote(*args)`: an asyncio task (awaitable, cancellable)."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return asyncio.ensure_future(self.fn(*args))


class Fake:
    calls: list = []
    contexts: list = []
    jobs: dict = {}
    clients: list = []  # whose share of the result store each submitted job counts against
    failures: dict[bytes, Callable[[], BaseException]] = {}  # image bytes -> the error the pipeline raises
    models: tuple = ()  # the catalogue the stand-in pipeline answers model_states for

    @classmethod
    def reset(cls, failures: Optional[dict[bytes, Callable[[], BaseException]]] = None) -> None:
        cls.calls, cls.contexts, cls.jobs, cls.clients = [], [], {}, []
        cls.failures = {b"bad": lambda: BadImage("not an image"), **(failures or {})}


async def pipeline_ocr(upload, options, ctx=None):
    """The pipeline's `ocr`: each image's bytes read as its one line of text;
    b"slow" takes 30 s, b"cancelled" is cancelled downstream, and Fake.failures
    raise."""
    data = upload.data  # the door's typed Upload (serve_app.flow.upload)
    Fake.calls.append((data, options))
    Fake.contexts.append(ctx)
    if data in Fake.failures:
        raise Fake.failures[data]()
    if data == b"slow":
        await asyncio.sleep(30)
    if data == b"cancelled":  # the downstream call is cancelled (its replica went away)
        asyncio.current_task().cancel()
        await asyncio.sleep(1)
    return {"image": {"width": 1, "height": 1}, "results": [{"text": data.decode()}], "timings_ms": {"total": 1.0}}


async def jobs_submit(data, options, key, client, callback_url=None, base_url=""):
    Fake.calls.append((data, options, key))
    Fake.clients.append(client)
    Fake.jobs["j1"] = {"job_id": "j1", "status": "queued"}
    return Fake.jobs["j1"]


async def jobs_get(job_id):
    return Fake.jobs.get(job_id)


_HEAD = ("job_id", "status", "created_at", "started_at", "finished_at", "pages_done", "pages_total", "error")


async def jobs_get_raw(job_id):
    """JobStore.get_raw of a stored view: (status fields, the rest as JSON bytes or None)."""
    view = Fake.jobs.get(job_id)
    if view is None:
        return None
    rest = {k: v for k, v in view.items() if k not in _HEAD}
    return {k: v for k, v in view.items() if k in _HEAD}, (json.dumps(rest).encode() if rest else None)


async def jobs_head(job_id):
    """JobStore.head: (status fields, the stored result's size or None)."""
    found = await jobs_get_raw(job_id)
    return None if found is None else (found[0], None if found[1] is None else len(found[1]))


class Cluster:
    """The platform as the front asks it (Serve's: serve_app.http.ingress.ServeCluster)."""

    def __init__(self, app_name: str = "ocr", status: Any = None):
        self.name = app_name
        self.answer = status

    def app_name(self) -> str:
        return self.name

    def status(self) -> Any:
        if self.answer is None:
            raise RuntimeError("no status")
        return self.answer


async def pipeline_model_states():
    """The pipeline's `model_states`: the default set loaded, every other not yet."""
    return {name: {"state": "loaded" if k == 0 else "not loaded", "load_s": None}
            for k, name in enumerate(Fake.models)}


def stand_in_front(errors: HandleErrors = HandleErrors()) -> Front:
    """A front as the route tests use it: 2 in-flight slots, Retry-After 2,
    4 batch items, 1 bulk slot, no result cache; Fake emptied."""
    Fake.reset()
    args = IngressArgs(max_in_flight=2, retry_after_s=2, max_batch_items=4)
    front = Front(types.SimpleNamespace(ocr=Method(pipeline_ocr), model_states=Method(pipeline_model_states)),
                 types.SimpleNamespace(submit=Method(jobs_submit), get=Method(jobs_get), get_raw=Method(jobs_get_raw),
                                       head=Method(jobs_head)),
                 ImageLimits(), args, DocumentLimits(),
                 PaddleXDefaults.of(EngineConfig()), cache=CacheArgs(max_bytes=0, share_in_flight=False), model_id="model",
                 lanes=LaneArgs(bulk_max_in_flight=1), errors=errors, cluster=Cluster(),
                 metrics=types.SimpleNamespace(requests=Metric(), errors=Metric(), latency=Metric(),
                                               stage_latency=Metric()))
    # Admission's count share over 32 requests (its default), not the 2 slots: a batch's items are admitted
    # one by one, each as a request of the client's.
    front.admission = Admission(args.admission, default_retry_s=args.retry_after_s)
    # Text, hOCR and ALTO written in this process's pool threads (the service's children: test_render_pool).
    front.renders.close()
    front.renders = RenderPool(args.render_workers, args.render_waiting, args.large_result_bytes,
                               args.max_large_reads, retry_after_s=max(args.retry_after_s, 1), renderer=render_here,
                               read_wait_s=0)
    return front


def assert_error_body(client, front, body: bytes, status: int, code: str, retry_after) -> None:
    """POST /v1/ocr with `body` (the stand-in pipeline turns it into an
    error): the JSON error body with the request id, Retry-After, no trace,
    counted once, the slot given back."""
    r = client.post("/v1/ocr", content=body, headers={"Content-Type": "image/png", "X-Request-ID": "rid"})
    assert r.status_code == status
    assert r.json() == {"request_id": "rid", "error": {"code": code, "message": r.json()["error"]["message"]}}
    assert r.headers.get("retry-after") == retry_after
    assert "Traceback" not in r.text and "KeyError" not in r.text
    assert front.metrics.errors.seen == [{"code": code}]
    assert front.metrics.requests.seen == [{"route": "/v1/ocr", "code": str(status)}]
    assert front.in_flight == 0
