"""The HTTP API (serve_app.http.app.build_app: routes, dependencies,
exception handlers, metrics middleware) over a real Front whose pipeline
and job-store handles are stand-ins (harness.front), through Starlette's
TestClient. No Ray: the Ray errors behind a handle call are
tests/integration/test_ingress_routes.py's."""

from __future__ import annotations

import asyncio
import base64
import json
import types
from unittest import mock

import pytest
from fastapi.testclient import TestClient

from harness.front import Cluster, Fake, Method, assert_error_body, pipeline_ocr, stand_in_front
from serve_app.core.app_args import AdmissionArgs, IngressArgs
from serve_app.core.engine_config import DocumentLimits, EngineConfig, ImageLimits
from serve_app.core.errors import BadImage, BadRequest, Overloaded
from serve_app.core.request_options import OcrOptions
from serve_app.http.app import build_app
from serve_app.http.body import BodyBudget
from serve_app.http.front import HandleErrors, downstream
from serve_app.http.policies.admission import Admission
from serve_app.http.policies.cost import Size
from serve_app.http.policies.result_cache import Dedupe, ResultCache


class HandleFailure(Exception):
    """A stand-in for a handle call's own error (Ray's RayTaskError): the
    domain error it carries is its `cause`."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


STAND_IN_ERRORS = HandleErrors((HandleFailure,), lambda e: e.cause if isinstance(e, HandleFailure) else e)


@pytest.fixture()
def app():
    """(TestClient of the app, the Front it is built over)."""
    front = stand_in_front(STAND_IN_ERRORS)
    Fake.failures.update({b"wrapped-bad": lambda: HandleFailure(BadImage("not an image, from a replica")),
                          b"wrapped-bug": lambda: HandleFailure(KeyError("k")),
                          b"bare-bug": lambda: KeyError("k")})  # no exception handler takes it: the middleware does
    yield TestClient(build_app(front)), front


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 4), "white").save(buf, "PNG")
    return buf.getvalue()


PNG = _png()
DEFAULT_SET = "ppocrv6_small"  # the default model set: every read is resolved to its set at the door


def post(client, body: bytes, ctype="image/png", **headers):
    return client.post("/v1/ocr", content=body, headers={"Content-Type": ctype, **headers})


def test_options_are_parsed_once_and_passed_on_as_ocr_options(app):
    client, _ = app
    r = client.post("/v1/ocr", json={"image": {"base64": base64.b64encode(b"js").decode()},
                                     "options": {"det": False, "return_chars": True}})
    assert r.status_code == 200 and r.json()["results"] == [{"text": "js"}]
    r = client.post("/v1/ocr", files={"file": ("a.png", b"mp")}, data={"options": json.dumps({"cls": False})})
    assert r.status_code == 200
    assert Fake.calls == [(b"js", OcrOptions(det=False, return_chars=True, priority="interactive", model=DEFAULT_SET)),
                          (b"mp", OcrOptions(cls=False, priority="interactive", model=DEFAULT_SET))]


def test_request_id_from_the_header_or_new(app):
    client, _ = app
    assert post(client, b"ok", **{"X-Request-ID": "my-id"}).json()["request_id"] == "my-id"
    assert post(client, b"bad", **{"X-Request-ID": "my-id-2"}).json()["request_id"] == "my-id-2"
    assert len(post(client, b"ok").json()["request_id"]) == 32


@pytest.mark.parametrize("body,status,code,retry_after", [
    (b"bad", 400, "bad_image", None),
    (b"wrapped-bad", 400, "bad_image", None),
    (b"wrapped-bug", 500, "internal", None),
    (b"bare-bug", 500, "internal", None),
    (b"cancelled", 503, "unavailable", "1"),
])
def test_domain_and_handle_errors_become_the_json_error_body(app, body, status, code, retry_after):
    client, front = app
    assert_error_body(client, front, body, status, code, retry_after)


def test_past_the_deadline_is_504_and_a_bad_deadline_400(app):
    client, _ = app
    r = post(client, b"slow", **{"X-Request-Timeout": "0.05"})
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
    assert post(client, b"x", **{"X-Request-Timeout": "soon"}).status_code == 400


def test_with_the_cache_on_identical_requests_are_computed_once_and_marked(app):
    client, front = app
    assert post(client, b"same").headers["x-cache"] == "bypass"  # the fixture's: no cache, no sharing
    front.dedupe = Dedupe("model", ResultCache(1 << 20, 60), True, None, downstream)
    first = post(client, b"same")
    again = post(client, b"same", **{"X-Request-ID": "mine"})
    fresh = post(client, b"same", **{"Cache-Control": "no-cache"})
    assert [r.headers["x-cache"] for r in (first, again, fresh)] == ["miss", "hit", "bypass"]
    assert again.json() == {**first.json(), "request_id": "mine"}
    assert "ingress;dur=" in again.headers["server-timing"]
    assert asyncio.run(front.ocr(b"same"))["cache"] == "hit"
    assert [post(client, b"bad").status_code for _ in range(2)] == [400, 400]  # failures are not kept
    assert [c[0] for c in Fake.calls] == [b"same", b"same", b"same", b"bad", b"bad"]
    slow = post(client, b"slow", **{"X-Request-Timeout": "0.05"})
    assert slow.status_code == 504 and not front.dedupe.flights  # its computation was cancelled


def test_admission_control_is_503_with_retry_after(app):
    client, front = app
    front.in_flight = 2
    r = post(client, b"ok")
    assert r.status_code == 503 and r.headers["retry-after"] == "2" and r.json()["error"]["code"] == "overloaded"


def test_the_lane_comes_from_x_priority_or_the_option_and_bulk_has_its_own_cap(app):
    client, front = app
    assert post(client, b"a").status_code == 200
    assert post(client, b"b", **{"X-Priority": "bulk"}).status_code == 200
    r = client.post("/v1/ocr", json={"image": {"base64": base64.b64encode(b"c").decode()},
                                     "options": {"priority": "bulk"}}, headers={"X-Priority": "interactive"})
    assert r.status_code == 200  # the header wins over the option
    assert client.post("/v1/ocr/jobs", content=PNG, headers={"Content-Type": "image/png",
                                                             "X-Priority": "interactive"}).status_code == 202
    assert [c[1].priority for c in Fake.calls] == ["interactive", "bulk", "interactive", "interactive"]
    bad = post(client, b"d", **{"X-Priority": "now"})
    assert bad.status_code == 400 and "X-Priority" in bad.json()["error"]["message"]
    front.bulk_in_flight = 1  # lanes.bulk_max_in_flight bulk requests in progress: bulk is refused, interactive is not
    r = post(client, b"e", **{"X-Priority": "bulk"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded" and r.headers["retry-after"] == "2"
    assert front.in_flight == 0 and front.bulk_in_flight == 1  # the refused request gave its slot back
    assert post(client, b"f").status_code == 200
    front.bulk_in_flight = 0
    assert post(client, b"g", **{"X-Priority": "bulk"}).status_code == 200 and front.bulk_in_flight == 0


def test_work_queued_past_the_cost_bound_is_503_on_each_ocr_route_but_a_cache_hit_is_answered(app):
    client, front = app
    front.dedupe = Dedupe("model", ResultCache(1 << 20, 60), True, None, downstream)
    assert post(client, b"cached").status_code == 200
    front.admission = Admission(AdmissionArgs(max_queued_cost_s=1.5, prior_base_s=1.0, prior_s_per_mp=0,
                                            prior_s_per_line=0, max_request_share=1.0), default_retry_s=2)
    held = front.admission.admit(Size(1), None)  # 1 s of work queued: another 1 s passes the 1.5 s bound
    r = post(client, b"new")
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded" and r.headers["retry-after"] == "2"
    assert post(client, b"cached").headers["x-cache"] == "hit"  # costs nothing: never refused
    batch = client.post("/v1/ocr/batch", json={"images": [{"base64": base64.b64encode(b"item").decode()}]})
    assert batch.status_code == 200 and batch.json()["items"][0]["error"]["code"] == "overloaded"
    with pytest.raises(Overloaded):
        asyncio.run(front.ocr(b"handle"))
    assert [c[0] for c in Fake.calls] == [b"cached"]  # nothing refused reached the pipeline
    front.admission.finish(held, None)
    assert post(client, b"new").status_code == 200 and front.admission.queued_s == 0
    assert front.admission.refused == {"cost_bound": 3} and front.in_flight == 0


def test_bearer_token_on_v1_routes_only(app):
    client, front = app
    front.token = b"tok"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "tok"}):
        r = post(client, b"ok", **headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
    assert client.get("/v1/ocr/jobs/x").status_code == 401
    assert client.get("/healthz").status_code == 200
    assert post(client, b"ok", Authorization="Bearer tok").status_code == 200
    assert Fake.calls == [(b"ok", OcrOptions(priority="interactive", model=DEFAULT_SET))]  # refused requests reached nothing


def test_jobs_submit_with_idempotency_key_poll_and_404(app):
    client, front = app
    r = client.post("/v1/ocr/jobs", content=PNG, headers={"Content-Type": "image/png", "Idempotency-Key": "k"})
    assert r.status_code == 202 and r.json() == {"job_id": "j1", "status": "queued"}
    assert r.headers["location"] == "/v1/ocr/jobs/j1"
    assert Fake.calls[-1] == (PNG, OcrOptions(priority="bulk", model=DEFAULT_SET), "k")  # a job is bulk by default
    assert Fake.clients[-1] == "addr:testclient"  # no token: the client is its address
    client.post("/v1/ocr/jobs", content=PNG, headers={"Content-Type": "image/png", "Authorization": "Bearer abc"})
    assert Fake.clients[-1] == "addr:testclient"  # a token-less service: a bearer names no client
    assert client.get("/v1/ocr/jobs/j1").json() == {"job_id": "j1", "status": "queued"}
    missing = client.get("/v1/ocr/jobs/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    bad_key = client.post("/v1/ocr/jobs", content=PNG, headers={"Content-Type": "image/png",
                                                                  "Idempotency-Key": "k" * 201})
    assert bad_key.status_code == 400
    junk = client.post("/v1/ocr/jobs", content=b"img", headers={"Content-Type": "image/png"})
    assert junk.status_code == 400 and junk.json()["error"]["code"] == "bad_image"  # at submit, not as a job
    assert {"route": "/v1/ocr/jobs/{job_id}", "code": "404"} in front.metrics.requests.seen


def test_unknown_routes_answer_in_the_same_json_shape(app):
    client, front = app
    r = client.get("/nope", headers={"X-Request-ID": "rid"})
    assert r.status_code == 404 and r.json() == {"request_id": "rid", "error": {"code": "not_found", "message": "Not Found"}}
    assert client.get("/v1/ocr").status_code == 405
    assert front.metrics.requests.seen[-1] == {"route": "/v1/ocr", "code": "405"}


def test_the_handle_api_takes_a_dict_or_none_and_raises_domain_errors(app):
    _, front = app
    assert asyncio.run(front.ocr(b"ok"))["results"] == [{"text": "ok"}]
    assert asyncio.run(front.ocr(b"ok", {"det": False}))["results"] == [{"text": "ok"}]
    assert Fake.calls == [(b"ok", OcrOptions(priority="interactive", model=DEFAULT_SET)), (b"ok", OcrOptions(det=False, priority="interactive", model=DEFAULT_SET))]
    with pytest.raises(BadImage):
        asyncio.run(front.ocr(b"wrapped-bad"))
    with pytest.raises(BadRequest, match="bad option nope"):
        asyncio.run(front.ocr(b"ok", {"nope": 1}))


def test_openapi_documents_the_three_request_shapes(app):
    client, _ = app
    spec = client.get("/openapi.json").json()
    for path in ("/v1/ocr", "/v1/ocr/jobs"):
        content = spec["paths"][path]["post"]["requestBody"]["content"]
        assert set(content) == {"multipart/form-data", "image/*", "application/octet-stream", "application/json"}
    image = spec["paths"]["/v1/ocr"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]["image"]
    assert image["properties"]["base64"]["type"] == "string"
    assert client.get("/docs").status_code == 200


def test_with_a_token_the_api_docs_need_it_too(app):
    client, front = app
    front.token = b"tok"
    for path in ("/docs", "/openapi.json", "/redoc"):
        r = client.get(path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", path
    assert client.get("/openapi.json", headers={"Authorization": "Bearer tok"}).status_code == 200
    assert client.get("/docs", headers={"Authorization": "Bearer tok"}).status_code == 200
    # Mounted under another route prefix (Serve passes it as the ASGI root_path): still behind the token.
    mounted = TestClient(build_app(front), root_path="/ocr-app")
    for path in ("/ocr-app/docs", "/ocr-app/openapi.json"):
        r = mounted.get(path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", path


def test_without_a_token_a_post_from_another_sites_page_is_refused_and_the_page_has_a_csp(app):
    client, front = app
    assert front.token is None
    png = b"img"  # the stand-in pipeline reads the bytes as text
    foreign = client.post("/v1/ocr", content=png, headers={"Content-Type": "image/png", "Origin": "https://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "forbidden"
    assert "ingress.auth_token_env" in foreign.json()["error"]["message"]
    assert not Fake.calls  # nothing was read
    same = client.post("/v1/ocr", content=png, headers={"Content-Type": "image/png", "Origin": "http://testserver"})
    plain = client.post("/v1/ocr", content=png, headers={"Content-Type": "image/png"})  # curl: no Origin
    assert same.status_code == 200 and plain.status_code == 200
    front.token = b"tok"  # with a token, the token decides
    r = client.post("/v1/ocr", content=png, headers={"Content-Type": "image/png", "Origin": "https://evil.example",
                                                      "Authorization": "Bearer tok"})
    assert r.status_code == 200
    page = client.get("/ui")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"


def test_readyz_is_open_and_probes_the_stages_at_most_once_per_cache_period(app):
    _, front = app
    probes = []

    async def ready():
        probes.append(1)
        return {"det": True, "rec": True}

    front.pipeline.ready = Method(ready)
    front.token = b"tok"
    front.args = IngressArgs(ready_cache_s=60)
    with TestClient(build_app(front)) as client:  # one event loop for all (as a replica's): the probes' task lives on
        answers = [client.get("/readyz") for _ in range(50)]
    assert {r.status_code for r in answers} == {200} and answers[0].json()["ready"] is True
    assert len(probes) == 1


def test_readyz_probes_again_soon_while_a_stage_is_not_ready():
    """A start: the first probe finds the recogniser still warming (or times
    out before its replica is up); the next probe comes within
    NOT_READY_PROBE_S, not after ingress.ready_cache_s, so /readyz turns 200
    as soon as the stages are ready (a start waited up to a whole cache
    period more)."""
    from harness.front import stand_in_front

    async def go():
        front = stand_in_front()
        front.args = IngressArgs(ready_cache_s=60, ready_timeout_s=30)
        probes = []

        async def ready():
            probes.append(1)
            return {"det": True, "rec": len(probes) > 1}

        front.pipeline.ready = Method(ready)
        first = await front.ready()
        for _ in range(500):  # up to 5 s (the old wait: the 60 s cache period)
            if len(probes) > 1:
                break
            await asyncio.sleep(0.01)
        after = await front.ready()
        front._ready_task.cancel()
        front.renders.close()
        return first, after, len(probes)

    first, after, n = asyncio.run(go())
    assert first == {"det": True, "rec": False}
    assert after == {"det": True, "rec": True} and n == 2  # once ready, the cache period holds again


def test_readyz_answers_from_the_last_probe_at_once_while_a_probe_is_slow():
    """The probes run in a background task (Front.ready): after the first,
    a call never waits on one, however long the pipeline takes to answer."""
    from harness.front import stand_in_front

    async def go():
        front = stand_in_front()
        front.args = IngressArgs(ready_cache_s=0.01, ready_timeout_s=30)
        probes, gate = [], asyncio.Event()

        async def ready():
            probes.append(1)
            if len(probes) > 1:
                await gate.wait()  # every probe after the first hangs until released
            return {"det": len(probes) == 1, "rec": True}

        front.pipeline.ready = Method(ready)
        first = await front.ready()
        for _ in range(1000):  # an explicit step: the second probe has started (and hangs)
            if len(probes) > 1:
                break
            await asyncio.sleep(0.001)
        answers = [await asyncio.wait_for(front.ready(), 5) for _ in range(20)]  # answered while it hangs
        gate.set()
        for _ in range(1000):  # the released probe's answer is the state now
            if front._ready_state[1]["det"] is False:
                break
            await asyncio.sleep(0.001)
        after = await front.ready()
        front._ready_task.cancel()
        front.renders.close()
        return first, answers, after

    first, answers, after = asyncio.run(go())
    assert first == {"det": True, "rec": True} and all(a == first for a in answers)
    assert after == {"det": False, "rec": True}


def test_readyz_answers_503_when_the_pipeline_never_answers_its_probe(app):
    """With no live pipeline replica Serve holds the probe until one starts:
    /readyz must answer not-ready instead of hanging with it."""
    client, front = app
    never = asyncio.Event()

    async def ready():
        await never.wait()  # never set: a probe nobody answers

    front.pipeline.ready = Method(ready)
    front.args = IngressArgs(ready_cache_s=0, ready_timeout_s=0.05)
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json() == {"ready": False, "stages": {}}


def test_job_submits_have_their_own_in_flight_gate(app):
    client, front = app
    front.in_flight = front.args.max_in_flight  # synchronous requests are all busy: submits still go through
    r = client.post("/v1/ocr/jobs", content=PNG, headers={"Content-Type": "image/png"})
    assert r.status_code == 202
    front.submitting = front.args.max_submits_in_flight
    r = client.post("/v1/ocr/jobs", content=PNG, headers={"Content-Type": "image/png"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"


def test_the_page_is_open_and_what_it_calls_needs_the_token(app):
    client, front = app
    front.token = b"tok"
    for path in ("/", "/ui"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert 'src="ui/app.js"' in r.text
    assert client.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/app.css").headers["content-type"].startswith("text/css")
    assert [o["name"] for o in client.get("/ui/options.json").json()["options"]][:1] == ["cls"]
    assert client.get("/ui/ingress.py").status_code == 404
    assert client.get("/ui/..%2Fingress.py").status_code == 404
    r = client.get("/v1/stats")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"


def test_stats_gathers_replicas_stages_and_history_at_most_once_per_cache_period(app):
    client, front = app
    calls = []

    async def stats(n):
        calls.append(n)
        return {"det": [{"pid": 1, "queue_depth": 2, "max_batch_size": 4,
                         "recent_batches": [{"seq": 1, "t": 9e12, "requests": 2, "items": 2, "ms": 5.0}]}],
                "rec": [{"pid": 2, "queue_depth": 0, "pending_crops": 7, "max_batch_size": 24, "recent_batches": []},
                        {"pid": 3, "queue_depth": 1, "pending_crops": 0, "max_batch_size": 24,
                         "recent_batches": []}]}

    front.pipeline.stats = Method(stats)
    running = types.SimpleNamespace(status="HEALTHY", replica_states={"RUNNING": 2}, message="")
    status = types.SimpleNamespace(applications={"ocr": types.SimpleNamespace(
        deployments={"TextDetector": running, "TextRecognizer": running})})
    front.args = IngressArgs(stats_cache_s=60)
    assert post(client, b"ok").status_code == 200 and post(client, b"bad").status_code == 400
    front.cluster = Cluster("ocr", status)
    answers = [client.get("/v1/stats").json() for _ in range(20)]
    assert len(calls) == 1 and calls[0]["rec"] == 4  # twice the running replicas
    body = answers[-1]
    assert body["deployments"]["TextRecognizer"]["running"] == 2
    assert body["stages"]["rec"]["queue_depth"] == 1 and body["stages"]["rec"]["pending_crops"] == 7
    assert body["stages"]["det"]["deployment"] == "TextDetector" and body["stages"]["det"]["queue_depth"] == 2
    # the two requests' buckets (the 20 reads above may have crossed into the next bucket)
    seen = [b for b in body["history"]["buckets"] if b["requests"]]
    assert (sum(b["requests"] for b in seen), sum(b["client_errors"] for b in seen)) == (2, 1)
    assert {"total": 1.0} in [b["steps_ms"] for b in seen]
    assert len(body["history"]["buckets"]) == 120


def test_format_query_or_option_renders_the_answer_and_asks_for_word_boxes(app):
    client, _ = app
    r = client.post("/v1/ocr?format=text", content=b"read", headers={"Content-Type": "image/png"})
    assert r.status_code == 200 and r.headers["content-type"] == "text/plain; charset=utf-8"
    assert r.text == "read\n"
    assert Fake.calls[-1][1].format == "text" and not Fake.calls[-1][1].return_words
    r = client.post("/v1/ocr", json={"image": {"base64": base64.b64encode(b"js").decode()},
                                     "options": {"format": "text"}})
    assert r.text == "js\n"
    client.post("/v1/ocr?format=hocr", json={"image": {"base64": base64.b64encode(b"js").decode()},
                                             "options": {"format": "text"}})
    sent = Fake.calls[-1][1]
    assert sent.format == "hocr" and sent.return_words  # the query wins; hOCR places words
    bad = client.post("/v1/ocr?format=pdf", content=PNG, headers={"Content-Type": "image/png"})
    assert bad.status_code == 400 and "format is one of json, text, hocr, alto, markdown" in bad.json()["error"]["message"]


def test_a_job_result_stays_json_and_renders_on_get_with_format(app):
    client, _ = app
    r = client.post("/v1/ocr/jobs?format=alto", content=PNG, headers={"Content-Type": "image/png"})
    assert r.status_code == 202 and Fake.calls[-1][1].format == "alto" and Fake.calls[-1][1].return_words
    assert client.get("/v1/ocr/jobs/j1?format=text").json() == {"job_id": "j1", "status": "queued"}  # not done
    box = [[1, 1], [20, 1], [20, 9], [1, 9]]
    Fake.jobs["j1"] = {"job_id": "j1", "status": "succeeded", "request_id": "j1", "image": {"width": 30, "height": 10},
                       "results": [{"text": "done ok", "score": 0.9, "box": box}], "timings_ms": {}}
    assert client.get("/v1/ocr/jobs/j1").json()["results"][0]["text"] == "done ok"
    text = client.get("/v1/ocr/jobs/j1?format=text")
    assert text.text == "done ok\n" and text.headers["content-type"].startswith("text/plain")
    alto = client.get("/v1/ocr/jobs/j1?format=alto")
    assert alto.headers["content-type"].startswith("application/xml") and 'CONTENT="done"' in alto.text
    assert client.get("/v1/ocr/jobs/j1?format=xml").status_code == 400


def test_the_handle_api_gives_the_rendered_document_for_a_format(app):
    _, front = app
    assert asyncio.run(front.ocr(b"ok", {"format": "text"})) == "ok\n"
    assert Fake.calls[-1][1].format == "text"


# -- documents, batches, the PaddleX route (issue 15) ------------------------------------
def test_batch_answers_one_item_per_input_in_order_and_a_bad_item_fails_alone(app):
    client, front = app
    images = [{"base64": base64.b64encode(b).decode()} for b in (b"one", b"bad", b"three")]
    images.insert(1, {"base64": "@@not base64"})
    r = client.post("/v1/ocr/batch", json={"images": images, "options": {"cls": False}})
    assert r.status_code == 200
    items = r.json()["items"]
    assert [i["index"] for i in items] == [0, 1, 2, 3]
    assert items[0]["results"] == [{"text": "one"}] and items[3]["results"] == [{"text": "three"}]
    assert items[1]["error"]["code"] == "bad_request" and items[2]["error"]["code"] == "bad_image"
    assert sorted(c[0] for c in Fake.calls) == [b"bad", b"one", b"three"]
    assert all(c[1] == OcrOptions(cls=False, priority="interactive", model=DEFAULT_SET) for c in Fake.calls) and front.in_flight == 0
    r = client.post("/v1/ocr/batch", files=[("file", ("a.png", b"A")), ("file", ("b.png", b"B"))])
    assert [i["results"][0]["text"] for i in r.json()["items"]] == ["A", "B"]


def test_batch_over_the_item_limit_is_413(app):
    client, _ = app
    r = client.post("/v1/ocr/batch", json={"images": [{"base64": "eA=="}] * 5})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large" and not Fake.calls


def paddlex_post(client, **fields):
    return client.post("/ocr", json=fields)


def test_paddlex_route_answers_in_paddlex_shape(app):
    client, front = app

    async def with_boxes(upload, options, ctx=None):
        return {"image": {"width": 1, "height": 1}, "timings_ms": {},
                "results": [{"text": upload.data.decode(), "score": 0.9, "box": [[0, 0], [1, 0], [1, 1], [0, 1]]}]}

    front.pipeline = types.SimpleNamespace(ocr=Method(with_boxes))
    r = paddlex_post(client, file=base64.b64encode(b"hello").decode(), fileType=1, visualize=False)
    assert r.status_code == 200
    body = r.json()
    assert body["errorCode"] == 0 and body["errorMsg"] == "Success" and body["logId"]
    assert body["result"]["ocrResults"][0]["prunedResult"]["rec_texts"] == ["hello"]
    assert body["result"]["dataInfo"] == {"width": 1, "height": 1, "type": "image"}


@pytest.mark.parametrize("fields, status, needle", [
    ({"file": "https://example.com/x.png", "fileType": 1}, 400, "fetches nothing"),
    ({"file": base64.b64encode(b"bad").decode(), "fileType": 1, "visualize": False}, 400, "not an image"),
    ({"file": base64.b64encode(b"x").decode(), "fileType": 1, "useDocUnwarping": True}, 400, "useDocUnwarping"),
    ({"fileType": 1}, 422, "file"),
])
def test_paddlex_errors_are_status_and_its_error_body(app, fields, status, needle):
    client, _ = app
    r = paddlex_post(client, **fields)
    assert r.status_code == status
    body = r.json()
    assert set(body) == {"logId", "errorCode", "errorMsg"} and body["errorCode"] == status
    assert needle in body["errorMsg"]


def test_job_submit_checks_a_pdf_before_accepting_it(app):
    from harness.pdfs import blank_pdf, encrypted_pdf

    client, front = app
    front.documents = DocumentLimits(max_pages=3)
    for body, status in ((encrypted_pdf(), 400), (b"%PDF-1.4 junk", 400), (blank_pdf(4), 413)):
        r = client.post("/v1/ocr/jobs", content=body, headers={"Content-Type": "application/pdf"})
        assert r.status_code == status, r.text
    assert not Fake.calls
    r = client.post("/v1/ocr/jobs", content=blank_pdf(3), headers={"Content-Type": "application/pdf"})
    assert r.status_code == 202 and Fake.calls[0][0][:5] == b"%PDF-"


# -- one read path (issue 23) ------------------------------------------------------------
def paddlex_file(data: bytes, **fields) -> dict:
    return {"file": base64.b64encode(data).decode(), "fileType": 1, "visualize": False, **fields}


async def boxed_ocr(upload, options, ctx=None):
    """pipeline_ocr's answer with a box on each line (what PaddleX's shape reads)."""
    body = await pipeline_ocr(upload, options, ctx)
    return {**body, "results": [{**r, "score": 0.9, "box": [[0, 0], [1, 0], [1, 1], [0, 1]]} for r in body["results"]]}


def test_every_door_says_how_the_cache_answered_and_shares_one_cache(app):
    client, front = app
    front.pipeline = types.SimpleNamespace(ocr=Method(boxed_ocr))
    front.dedupe = Dedupe("model", ResultCache(1 << 20, 60), True, None, downstream)
    assert post(client, b"same").headers["x-cache"] == "miss"
    items = [{"base64": base64.b64encode(b).decode()} for b in (b"same", b"other", b"other")]
    batch = client.post("/v1/ocr/batch", json={"images": items}).json()["items"]
    # The first item is the /v1/ocr answer's; of two identical new items one computes, the other waits on
    # it (or, if the first finished while the second was being priced off the loop, takes its stored answer).
    assert batch[0]["cache"] == "hit" and sorted(i["cache"] for i in batch[1:]) in (["miss", "shared"], ["hit", "miss"])
    assert [[r["text"] for r in i["results"]] for i in batch] == [["same"], ["other"], ["other"]]
    px = client.post("/ocr", json=paddlex_file(b"other"))
    assert px.status_code == 200 and px.headers["x-cache"] == "hit"
    assert px.json()["result"]["ocrResults"][0]["prunedResult"]["rec_texts"] == ["other"]
    assert asyncio.run(front.ocr(b"other"))["cache"] == "hit"
    fresh = client.post("/v1/ocr/batch", json={"images": items[:1]}, headers={"Cache-Control": "no-cache"})
    assert fresh.json()["items"][0]["cache"] == "bypass"
    assert [c[0] for c in Fake.calls] == [b"same", b"other", b"same"]  # each content computed once, and the fresh one


def test_paddlex_goes_through_the_same_token_check_in_its_error_shape(app):
    client, front = app
    front.pipeline = types.SimpleNamespace(ocr=Method(boxed_ocr))
    front.token = b"tok"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = client.post("/ocr", json=paddlex_file(b"hello"), headers=headers)
        assert r.status_code == 401
        body = r.json()
        assert set(body) == {"logId", "errorCode", "errorMsg"} and body["errorCode"] == 401
        assert "bearer token" in body["errorMsg"]
    ok = client.post("/ocr", json=paddlex_file(b"hello"), headers={"Authorization": "Bearer tok"})
    assert ok.status_code == 200 and ok.json()["errorCode"] == 0
    assert [c[0] for c in Fake.calls] == [b"hello"]  # refused requests reached nothing
    assert {"route": "/ocr", "code": "401"} in front.metrics.requests.seen and {"code": "unauthorized"} in front.metrics.errors.seen


def test_paddlex_goes_through_the_same_media_type_check_body_budget_byte_limit_and_slot(app):
    client, front = app
    front.pipeline = types.SimpleNamespace(ocr=Method(boxed_ocr))
    body = json.dumps(paddlex_file(b"hello")).encode()
    r = client.post("/ocr", content=body, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json()["errorCode"] == 415 and "application/json" in r.json()["errorMsg"]
    assert client.post("/ocr", content=body).status_code == 415  # no Content-Type at all
    front.bodies = BodyBudget(len(body) - 1, retry_after_s=2)  # this body would take the ingress over its budget
    r = client.post("/ocr", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 503 and r.json()["errorCode"] == 503 and r.headers["retry-after"] == "2"
    assert front.bodies.held == 0  # the refused body's bytes were given back
    front.bodies = BodyBudget(front.args.max_body_bytes)
    front.limits = ImageLimits(max_bytes=4)
    r = client.post("/ocr", json=paddlex_file(b"hello"))
    assert r.status_code == 413 and r.json()["errorMsg"] == "file is 5 bytes, over the limit of 4"
    front.limits = ImageLimits()
    front.in_flight = front.args.max_in_flight
    r = client.post("/ocr", json=paddlex_file(b"hello"))
    assert r.status_code == 503 and r.json()["errorCode"] == 503 and r.headers["retry-after"] == "2"
    assert not Fake.calls and front.bodies.held == 0


def test_the_pipeline_gets_the_requests_context_its_id_deadline_and_lane(app):
    import time

    client, _ = app
    before = time.time()
    assert post(client, b"a", **{"X-Request-ID": "rid-1", "X-Request-Timeout": "30"}).status_code == 200
    assert post(client, b"b", **{"X-Request-ID": "rid-2", "X-Priority": "bulk"}).status_code == 200
    first, second = Fake.contexts
    assert (first.request_id, first.lane) == ("rid-1", "interactive") and before < first.deadline <= time.time() + 30
    assert (second.request_id, second.lane) == ("rid-2", "bulk")
    assert Fake.calls[1][1].priority == "bulk"  # the lane resolved once: options and context agree


def test_a_batch_holds_one_slot_and_gives_every_byte_back(app):
    client, front = app
    items = [{"base64": base64.b64encode(b).decode()} for b in (b"one", b"two")]
    r = client.post("/v1/ocr/batch", json={"images": items})
    assert r.status_code == 200 and [i["cache"] for i in r.json()["items"]] == ["bypass", "bypass"]
    assert front.in_flight == 0 and front.bulk_in_flight == 0 and front.bodies.held == 0
    front.in_flight = front.args.max_in_flight
    r = client.post("/v1/ocr/batch", json={"images": items})
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded" and front.bodies.held == 0


def test_a_request_over_its_own_share_is_503_naming_jobs_on_an_empty_ledger(app):
    client, front = app
    front.admission = Admission(AdmissionArgs(max_queued_cost_s=1.5, prior_base_s=1.0, prior_s_per_mp=0,
                                            prior_s_per_line=0), default_retry_s=2)  # one request: 0.75 s at most
    r = post(client, b"new")
    assert r.status_code == 503 and "POST /v1/ocr/jobs" in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) >= 1 and front.admission.refused == {"too_big": 1} and not Fake.calls


# -- one picture drawer (issue 23 item 4) --------------------------------------------------
def _pipeline_behind(front, limits: ImageLimits = ImageLimits()):
    """The real Pipeline (decode, crop, assemble, the drawer) over stand-in
    detect/recognise stages, behind the ingress's pipeline handle; returns
    the list each decode of an upload appends to."""
    import numpy as np

    import serve_app.flow.pipeline as pipeline_module
    from serve_app.flow.pipeline import Pipeline, Stages
    from serve_app.core.results import Recognition

    async def detect(work, params=None, ctx=None):
        return np.asarray([[[10, 10], [110, 10], [110, 40], [10, 40]]], np.float32)

    async def recognize(crops, ctx=None):
        return [Recognition("line", 0.9) for _ in crops]

    pipe = Pipeline(Stages(detect, None, recognize), EngineConfig(limits=limits))

    async def read(upload, options, ctx=None):
        return (await pipe.read(upload.data, options, ctx)).to_dict()

    front.pipeline = types.SimpleNamespace(ocr=Method(read))
    decodes: list[int] = []
    real = pipeline_module.decode_image

    def counted(data, *args, **kwargs):
        decodes.append(len(data))
        return real(data, *args, **kwargs)

    return decodes, mock.patch.object(pipeline_module, "decode_image", counted)


def _png_of(w: int, h: int) -> bytes:
    import cv2
    import numpy as np

    return cv2.imencode(".png", np.full((h, w, 3), 255, np.uint8))[1].tobytes()


def _jpeg_shape(b64: str) -> tuple:
    import cv2
    import numpy as np

    return cv2.imdecode(np.frombuffer(base64.b64decode(b64), np.uint8), cv2.IMREAD_COLOR).shape


def test_paddlex_picture_is_drawn_by_the_pipeline_from_its_one_decode(app):
    client, front = app
    decodes, patch = _pipeline_behind(front)
    data = _png_of(300, 120)
    with patch:
        r = client.post("/ocr", json={"file": base64.b64encode(data).decode(), "fileType": 1})
        assert r.status_code == 200, r.text
        assert decodes == [len(data)]  # one decode of the upload, in the pipeline; none in the ingress
        (res,) = r.json()["result"]["ocrResults"]
        assert res["prunedResult"]["rec_texts"] == ["line"]
        assert _jpeg_shape(res["ocrImage"]) == _jpeg_shape(res["inputImage"]) == (120, 300, 3)  # the image's size
        assert "visualization" not in res and set(res) == {"prunedResult", "ocrImage", "inputImage"}
        off = client.post("/ocr", json={"file": base64.b64encode(data).decode(), "fileType": 1, "visualize": False})
        assert set(off.json()["result"]["ocrResults"][0]) == {"prunedResult"} and len(decodes) == 2


def test_paddlex_picture_of_a_maximum_size_image_is_bounded_and_the_pixel_limit_holds(app):
    """Hostile: the largest image the pixel limit lets in, visualized. The
    picture is two copies at most 2000 px a side whatever the image (the
    image itself is the one decoded copy the read holds anyway); one pixel
    more is a 413 from the header, before any decode."""
    client, front = app
    limits = ImageLimits(max_pixels=4000 * 1000)
    decodes, patch = _pipeline_behind(front, limits)
    with patch:
        r = client.post("/ocr", json={"file": base64.b64encode(_png_of(4000, 1000)).decode(), "fileType": 1})
        assert r.status_code == 200, r.text
        res = r.json()["result"]["ocrResults"][0]
        assert _jpeg_shape(res["ocrImage"]) == _jpeg_shape(res["inputImage"]) == (500, 2000, 3)
        over = client.post("/ocr", json={"file": base64.b64encode(_png_of(4001, 1000)).decode(), "fileType": 1})
        assert over.status_code == 413 and over.json()["errorCode"] == 413 and "pixel" in over.json()["errorMsg"]
    assert len(decodes) == 2  # the refused one was stopped by decode_image's header check


# -- bounded answers and reads (issue 38, item 5) -----------------------------------------------


def test_a_synchronous_answer_over_max_answer_bytes_is_a_413_naming_the_jobs_api(app):
    """A 49 kB text-layer PDF gave a 126 MB answer; now an answer over
    ingress.max_answer_bytes is refused, naming where such results go."""
    client, front = app
    front.args = front.args.model_copy(update={"max_answer_bytes": 4096})
    small = client.post("/v1/ocr", content=b"a short line", headers={"Content-Type": "image/png"})
    assert small.status_code == 200 and small.json()["results"][0]["text"] == "a short line"
    long_line = b"x" * 5000
    for fmt in ("json", "text"):  # (the stand-in pipeline gives no boxes for hOCR)
        r = client.post(f"/v1/ocr?format={fmt}", content=long_line, headers={"Content-Type": "image/png"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
        assert "POST /v1/ocr/jobs" in r.json()["error"]["message"]


def test_a_job_result_is_sent_as_its_stored_bytes_and_large_reads_are_gated(app):
    client, front = app
    box = [[1, 1], [20, 1], [20, 9], [1, 9]]
    Fake.jobs["j1"] = {"job_id": "j1", "status": "succeeded", "created_at": 1.0, "request_id": "j1",
                       "image": {"width": 30, "height": 10},
                       "results": [{"text": "done é", "score": 0.9, "box": box}] * 50, "timings_ms": {}}
    r = client.get("/v1/ocr/jobs/j1")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == Fake.jobs["j1"]  # the head's fields and the stored result's, as one body
    front.renders.large_bytes = 100  # this result is now "large"
    front.renders.large_reads = front.renders.max_large_reads  # as if that many were being sent
    busy = client.get("/v1/ocr/jobs/j1?format=hocr")
    assert busy.status_code == 503 and int(busy.headers["retry-after"]) >= 1
    front.renders.large_reads = 0
    assert client.get("/v1/ocr/jobs/j1?format=hocr").status_code == 200
    assert front.renders.held == 0 and front.renders.large_reads == 0  # nothing left held


def test_text_hocr_and_alto_past_the_render_pool_are_a_503_not_a_thread_each(app):
    client, front = app
    front.renders.held = front.renders.slots  # as if every worker and waiting place were taken
    r = client.post("/v1/ocr?format=hocr", content=b"ok", headers={"Content-Type": "image/png"})
    assert r.status_code == 503 and "format=json" in r.json()["error"]["message"]
    assert client.post("/v1/ocr", content=b"ok", headers={"Content-Type": "image/png"}).status_code == 200  # JSON
    front.renders.held = 0


@pytest.mark.parametrize("make", ["jpeg_comments", "chunks_after_idat_png", "gif_frames"])
def test_a_flood_of_segments_chunks_or_frames_is_a_400_at_the_door(app, make):
    """Walked at the door as decode walks it: refused before a price, a
    cache look-up or the pipeline (a JPEG of comments took 9 s to decode)."""
    from harness import hostile as hostile_costs

    body = {"jpeg_comments": lambda: hostile_costs.jpeg_comments(1),
            "chunks_after_idat_png": lambda: hostile_costs.chunks_after_idat_png(1),
            "gif_frames": lambda: hostile_costs.gif_frames(2000)}[make]()
    client, _ = app
    for path in ("/v1/ocr", "/v1/ocr/jobs"):
        r = client.post(path, content=body, headers={"Content-Type": "image/png"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_image", path
    assert Fake.calls == []  # neither the pipeline nor the job store saw it


def test_a_paddlex_answer_over_max_answer_bytes_is_a_413_in_paddlex_shape(app):
    client, front = app
    front.pipeline = types.SimpleNamespace(ocr=Method(boxed_ocr))
    front.args = front.args.model_copy(update={"max_answer_bytes": 4096})
    assert client.post("/ocr", json=paddlex_file(b"short")).status_code == 200
    r = client.post("/ocr", json=paddlex_file(b"y" * 5000))
    assert r.status_code == 413 and r.json()["errorCode"] == 413 and "POST /v1/ocr/jobs" in r.json()["errorMsg"]


def test_a_model_set_through_every_door_and_an_unserved_one_is_a_400_that_costs_nothing(app):
    """options.model on /v1/ocr, /v1/ocr/batch, PaddleX's /ocr, jobs and the
    handle reaches the pipeline resolved; an unserved or unknown set is a 400
    listing the served ones before admission, the cache or the pipeline (a
    stranger cannot make a set load or warm: nothing loads for a request)."""
    client, front = app
    front.models = ("ppocrv4_mobile", "ppocrv6_small")

    async def with_boxes(upload, options, ctx=None):  # PaddleX's shape needs each line's box and score
        body = await pipeline_ocr(upload, options, ctx)
        body["results"][0].update(score=0.9, box=[[0, 0], [1, 0], [1, 1], [0, 1]])
        return body

    front.pipeline = types.SimpleNamespace(ocr=Method(with_boxes))
    models = client.get("/v1/models").json()
    assert models["default"] == "ppocrv4_mobile"
    assert [m["name"] for m in models["models"]] == ["ppocrv4_mobile", "ppocrv6_small"]
    assert models["models"][1]["dictionary"] == {"file": "ppocrv6_dict.txt", "classes": 18708}
    assert "de" in models["models"][1]["languages"] and "cost" in models["models"][1]
    b64 = base64.b64encode(b"ok").decode()
    small = {"model": "ppocrv6_small"}
    assert client.post("/v1/ocr", json={"image": {"base64": b64}, "options": small}).status_code == 200
    batch = client.post("/v1/ocr/batch", json={"images": [{"base64": b64}], "options": small})
    assert batch.status_code == 200 and batch.json()["items"][0]["results"][0]["text"] == "ok"
    assert client.post("/ocr", json={"file": b64, "fileType": 1, "model": "ppocrv6_small"}).status_code == 200
    png = base64.b64encode(PNG).decode()  # a job's upload is checked at the door: a real image
    assert client.post("/v1/ocr/jobs", json={"image": {"base64": png}, "options": small}).status_code == 202
    asyncio.run(front.ocr(b"ok", small))
    assert [c[1].model for c in Fake.calls] == ["ppocrv6_small"] * 5
    Fake.calls.clear()
    for name in ("ppocrv6_tiny", "nope"):
        bad = {"model": name}
        for r in (client.post("/v1/ocr", json={"image": {"base64": b64}, "options": bad}),
                  client.post("/ocr", json={"file": b64, "fileType": 1, "model": name}),
                  client.post("/v1/ocr/jobs", json={"image": {"base64": png}, "options": bad})):
            assert r.status_code == 400, r.text
            assert "served: ppocrv4_mobile, ppocrv6_small" in r.text
        item = client.post("/v1/ocr/batch", json={"images": [{"base64": b64}], "options": bad}).json()["items"][0]
        assert item["error"]["code"] == "bad_request" and "served: ppocrv4_mobile" in item["error"]["message"]
        with pytest.raises(BadRequest, match="served: ppocrv4_mobile, ppocrv6_small"):
            asyncio.run(front.ocr(b"ok", bad))
    assert Fake.calls == [] and front.admission.queued_s == 0 and front.in_flight == 0


def test_named_tokens_authorize_and_name_their_client_and_a_forwarded_for_names_none(app):
    from serve_app.http.clients import ClientIdentity, parse_named_tokens

    client, front = app
    front.clients = ClientIdentity(parse_named_tokens("alice:s3cret,bob:hunter2"))
    job = {"Content-Type": "image/png"}
    assert client.post("/v1/ocr/jobs", content=PNG, headers={**job, "Authorization": "Bearer nope"}).status_code == 401
    assert post(client, b"ok").status_code == 401
    r = client.post("/v1/ocr/jobs", content=PNG, headers={**job, "Authorization": "Bearer s3cret",
                                                          "X-Forwarded-For": "10.9.9.9"})
    assert r.status_code == 202 and Fake.clients[-1] == "token:alice"
    client.post("/v1/ocr/jobs", content=PNG, headers={**job, "Authorization": "Bearer hunter2"})
    assert Fake.clients[-1] == "token:bob"
    front.clients = ClientIdentity()
    client.post("/v1/ocr/jobs", content=PNG, headers={**job, "X-Forwarded-For": "10.9.9.9"})
    assert Fake.clients[-1] == "addr:testclient"  # the test client is no loopback proxy: its own address


def test_large_job_submits_past_their_places_are_a_503_before_the_body_is_read(app):
    client, front = app
    front.args = front.args.model_copy(update={"large_result_bytes": 1000, "max_large_submits": 1})
    front.large_submits = 1  # as if one large body were being read
    big = PNG + b"\0" * 2000
    r = client.post("/v1/ocr/jobs", content=big, headers={"Content-Type": "image/png"})
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1 and "large job submits" in r.text
    assert client.post("/v1/ocr/jobs", content=PNG, headers={"Content-Type": "image/png"}).status_code == 202  # small
    front.large_submits = 0
    assert client.post("/v1/ocr/jobs", content=big, headers={"Content-Type": "image/png"}).status_code == 202
    assert front.large_submits == 0  # given back


def test_large_job_submits_are_paced_in_bytes_a_second_and_a_chunked_one_counts_as_large(app):
    """Four clients sending 19 MB PNG jobs back to back held /healthz at
    120-160 ms p99 one at a time: large bodies are also taken at
    ingress.submit_bytes_per_s, all clients together (a fake clock here)."""
    from serve_app.http.body import BytePace

    client, front = app
    now = [100.0]
    front.args = front.args.model_copy(update={"large_result_bytes": 1000, "submit_bytes_per_s": 1000})
    front.submit_pace = BytePace(1000, clock=lambda: now[0])
    big = PNG + b"\0" * 2900  # ~3 s of the pace
    job = {"Content-Type": "image/png"}
    assert client.post("/v1/ocr/jobs", content=big, headers=job).status_code == 202
    r = client.post("/v1/ocr/jobs", content=big, headers=job)
    assert r.status_code == 503 and r.headers["retry-after"] == str(-(-len(big) // 1000)) and "bytes a second" in r.text
    assert client.post("/v1/ocr/jobs", content=PNG, headers=job).status_code == 202  # a small one is not paced
    now[0] += len(big) / 1000
    assert client.post("/v1/ocr/jobs", content=big, headers=job).status_code == 202
    assert front.large_submits == 0
    # A body without a Content-Length (chunked) takes a large place before it is read, and pays for its bytes after.
    now[0] += 10
    front.large_submits = front.args.max_large_submits
    chunked = lambda: iter([PNG, b"\0" * 100])  # noqa: E731
    assert client.post("/v1/ocr/jobs", content=chunked(), headers=job).status_code == 503
    front.large_submits = 0
    assert client.post("/v1/ocr/jobs", content=chunked(), headers=job).status_code == 202
    assert front.submit_pace.paid_until == pytest.approx(now[0] + (len(PNG) + 100) / 1000)


def recording_put(puts: list, ref):
    """A stand-in for ray.put: records (bytes, whether it ran off an event
    loop) and returns ref(data)."""
    def put(data):
        try:
            asyncio.get_running_loop()
            off_loop = False
        except RuntimeError:  # a worker thread: no event loop runs here
            off_loop = True
        puts.append((len(data), off_loop))
        return ref(data)

    return put


def test_a_large_job_body_reaches_the_job_store_through_the_object_store_put_off_the_loop(app):
    client, front = app
    puts = []
    front.put = recording_put(puts, lambda data: ("ref", len(data)))
    big = PNG + b"\0" * (1024 * 1024)
    job = {"Content-Type": "image/png"}
    assert client.post("/v1/ocr/jobs", content=PNG, headers=job).status_code == 202
    assert Fake.calls[-1][0] == PNG and puts == []  # a small one as it is
    front.args = front.args.model_copy(update={"large_result_bytes": 64 * 1024 * 1024})
    assert client.post("/v1/ocr/jobs", content=big, headers=job).status_code == 202
    assert Fake.calls[-1][0] == ("ref", len(big)) and puts == [(len(big), True)]


def test_a_large_sync_body_reaches_the_pipeline_through_the_object_store_put_off_the_loop_once_it_starts(app):
    """POST /v1/ocr of a body of LARGE_ARG_BYTES or more: its bytes are put
    into the object store by a worker thread when its computation starts
    (serialised by the handle call, a 19 MB body held the ingress's loop),
    and the pipeline gets the reference; a small body goes as it is, and a
    refused one is never put."""
    client, front = app
    puts = []
    front.put = recording_put(puts, lambda data: b"put:%d" % len(data))  # the stand-in pipeline reads bytes as text
    big = PNG + b"\0" * (1024 * 1024)
    headers = {"Content-Type": "image/png"}
    r = client.post("/v1/ocr", content=b"small", headers=headers)
    assert r.status_code == 200 and r.json()["results"][0]["text"] == "small" and puts == []  # a small one as it is
    r = client.post("/v1/ocr", content=big, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["text"] == f"put:{len(big)}" and puts == [(len(big), True)]
    front.in_flight = front.args.max_in_flight  # refused at the door: nothing put
    assert client.post("/v1/ocr", content=big, headers=headers).status_code == 503 and len(puts) == 1
