"""What the ingress's Serve shell (serve_app.http.ingress) adds to the HTTP
API, without a cluster: Ray's errors behind a handle call answered as the
domain errors they carry (RAY_ERRORS, through the app built over a front
whose handles are stand-ins, harness.front); and the OcrPipeline
deployment's own class passing each request's deadline and lane on. Imports
Ray, starts no cluster. The routes themselves: tests/unit/test_http_routes.py."""

from __future__ import annotations

import asyncio
import types

import pytest
from fastapi.testclient import TestClient
from ray.exceptions import ActorUnavailableError, RayTaskError
from ray.serve.exceptions import BackPressureError

from harness.front import Fake, assert_error_body, stand_in_front
from serve_app.core.app_args import LaneArgs
from serve_app.core.engine_config import EngineConfig
from serve_app.core.errors import BadImage, Overloaded
from serve_app.core.request_options import OcrOptions
from serve_app.http.app import build_app
from serve_app.http.ingress import RAY_ERRORS


def _ray_task_error(cause: Exception) -> Exception:
    try:
        raise cause
    except Exception as e:
        return RayTaskError("ocr", "traceback", e).as_instanceof_cause()


@pytest.fixture()
def app():
    """(TestClient of the app, the Front it is built over, with Ray's errors)."""
    front = stand_in_front(RAY_ERRORS)
    Fake.failures.update({
        b"wrapped-bad": lambda: _ray_task_error(BadImage("not an image, from a replica")),
        b"wrapped-bug": lambda: _ray_task_error(KeyError("k")),
        b"backpressure": lambda: BackPressureError(num_queued_requests=3, max_queued_requests=2),
        b"dead": lambda: ActorUnavailableError("gone", b"\0" * 16),
    })
    yield TestClient(build_app(front)), front


def post(client, body: bytes, ctype="image/png", **headers):
    return client.post("/v1/ocr", content=body, headers={"Content-Type": ctype, **headers})


@pytest.mark.parametrize("body,status,code,retry_after", [
    (b"wrapped-bad", 400, "bad_image", None),
    (b"wrapped-bug", 500, "internal", None),
    (b"backpressure", 503, "overloaded", "1"),
    (b"dead", 503, "unavailable", "1"),
])
def test_ray_errors_become_the_json_error_body(app, body, status, code, retry_after):
    client, front = app
    assert_error_body(client, front, body, status, code, retry_after)


def test_the_handle_api_raises_the_domain_error_behind_a_ray_error(app):
    _, front = app
    with pytest.raises(BadImage):
        asyncio.run(front.ocr(b"wrapped-bad"))
    with pytest.raises(Overloaded):
        asyncio.run(front.ocr(b"backpressure"))
    assert [c[1] for c in Fake.calls] == [OcrOptions(priority="interactive", model="ppocrv6_small")] * 2


def test_the_serve_pipeline_passes_the_deadline_and_lane_to_every_stage_the_classifier_included():
    """The OcrPipeline deployment's own class (not a stand-in) over stand-in
    model handles: every stage call carries the request's deadline, lane and client."""
    import time

    import cv2
    import numpy as np

    from serve_app.serving.deployments import OcrPipeline
    from serve_app.core.request_context import RequestContext
    from serve_app.core.results import Direction, Recognition
    from serve_app.core.app_args import RecognizerArgs

    seen: dict[str, list] = {}
    answers = {"detect": lambda args: np.array([[[10, 10], [110, 10], [110, 40], [10, 40]]], np.float32),
               "classify": lambda args: [Direction("0", 1.0)] * len(args[0]),
               "recognize": lambda args: [Recognition("word", 0.9, ((0.0, 1.0),))] * len(args[0])}

    class Handle:
        def __init__(self, method):
            self.method = method

        def options(self, **kw):
            return self

        def __getattr__(self, name):
            assert name == self.method

            def remote(*args):
                seen[name] = args

                async def answer():
                    return answers[name](args)

                return answer()

            return types.SimpleNamespace(remote=remote)

    pipe = OcrPipeline.func_or_class(Handle("detect"), Handle("classify"), Handle("recognize"), EngineConfig(),
                                     RecognizerArgs(), LaneArgs(enabled=False))
    png = cv2.imencode(".png", np.full((100, 240, 3), 255, np.uint8))[1].tobytes()
    ctx = RequestContext("rid", time.time() + 60, "bulk", "client-a")
    body = asyncio.run(pipe.ocr(png, OcrOptions(priority="bulk"), ctx))
    assert [r["text"] for r in body["results"]] == ["word"]
    # (image, deadline, params, lane, client): the client's turn at the stages' gates
    assert seen["detect"][1] == ctx.deadline and seen["detect"][3:] == ("bulk", "client-a")
    assert seen["classify"][1:] == (ctx.deadline, "bulk", "client-a")  # (crops, deadline, lane, client)
    assert seen["recognize"][1:] == (ctx.deadline, "bulk", "client-a")
