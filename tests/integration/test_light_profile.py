"""deployments.light.yaml with real Ray, real models and real HTTP: one
2-thread recogniser replica that also runs the detector, the direction
classifier and the pipeline (detector/classifier.beside_recognizer,
recognizer.with_pipeline; serve_app/serving/stages_in_one_process.py) answers
what the in-process engine answers, with the three stages ready, batched
and reconfigured in that one process. Each test runs twice: on the file
as shipped, and with the pipeline in a deployment of its own
(`with_pipeline: false`, the models still in one TextRecognizer process)."""

from __future__ import annotations

import base64
import copy
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from harness.latin import GERMAN_LINE, line_png
from harness.peer import PEER
from harness.procfs import pss_mb
from harness.service import REPO, apply_config, deploy_config, free_port, load_config, start_ray, stop_all
from harness.retry_after import post_following_retry_after
from harness.service import replica_pids, wait_shapes_built

LIGHT = REPO / "deployments.light.yaml"
# Rotated lines (the classifier turns them), a dense photo, a receipt, a word crop, an empty image.
IMAGES = ["rapidocr_text_cls_v3.jpg", "rapidocr_text_cls_v1.jpg", "rapidocr_ch_en_num.jpg",
          "mmocr_wildreceipt_2.jpeg", "mmocr_word_1036169.jpg", "rapidocr_empty_black.jpg",
          "paddleocr_00111002.jpg", "rapidocr_img_exif_orientation.jpg"]


def pipeline_apart(config: dict) -> dict:
    """The light profile with the pipeline in a deployment of its own and
    the three models in a TextRecognizer one (as before with_pipeline)."""
    out = copy.deepcopy(config)
    app = out["applications"][0]
    app["args"]["recognizer"]["with_pipeline"] = False
    deployments = [d for d in app["deployments"] if d["name"] != "OcrPipeline"]
    (models,) = [d for d in app["deployments"] if d["name"] == "OcrPipeline"]
    # As in deployments.yaml: the model-free pipeline with a fixed mmap threshold, the models' process with one arena.
    deployments.append({"name": "OcrPipeline", "max_ongoing_requests": 64, "ray_actor_options": {
        "num_cpus": 0.1, "runtime_env": {"env_vars": {"MALLOC_MMAP_THRESHOLD_": "131072"}}}})
    deployments.append({"name": "TextRecognizer", "num_replicas": 1, "max_ongoing_requests": 96,
                        "ray_actor_options": {**models["ray_actor_options"], "num_cpus": 0.3},
                        "user_config": models["user_config"]})
    for name in app["args"].get("models", [])[1:]:  # a further model set: its own models process
        deployments.append({"name": f"TextRecognizer_{name}", "num_replicas": 1, "max_ongoing_requests": 96,
                            "ray_actor_options": {**models["ray_actor_options"], "num_cpus": 0.1},
                            "user_config": models["user_config"]})
    app["deployments"] = deployments
    return out


@pytest.fixture(scope="module", params=["shipped", "pipeline apart"])
def light(request):
    start_ray()
    try:
        config = load_config(LIGHT, model_sets=True)  # the shipped profile: all three sets
        assert config["applications"][0]["args"]["recognizer"]["with_pipeline"] is True
        if request.param == "pipeline apart":
            config = pipeline_apart(config)
        url = deploy_config(config, free_port())
        yield url, config
    finally:
        stop_all(graceful=False)  # the cluster goes with ray.shutdown(): no ~10 s Serve drain


def models_deployment(config: dict) -> str:
    """The deployment whose process holds the three models."""
    return "OcrPipeline" if config["applications"][0]["args"]["recognizer"]["with_pipeline"] else "TextRecognizer"


@pytest.fixture(scope="module")
def engine_reads(engine):  # the session's engine (each one made keeps ~1 GB)
    return {n: [line.to_dict() for line in engine.read(PEER / n).lines] for n in IMAGES}


def post(url: str, name: str) -> requests.Response:
    with open(PEER / name, "rb") as f:
        return requests.post(f"{url}/v1/ocr", files={"file": (name, f)}, timeout=120,
                             headers={"Cache-Control": "no-cache"})


def stage_stats() -> dict:
    """stage -> the stats() of its replicas, through the pipeline (as the
    live view gathers them)."""
    from ray import serve

    pipeline = serve.get_deployment_handle("OcrPipeline", "ocr")
    return pipeline.stats.remote({"det": 2, "cls": 2, "rec": 2}).result(timeout_s=60)


def test_one_recogniser_process_holds_the_three_stages(light):
    from ray import serve

    url, config = light
    # The default set's stages; with the pipeline apart, every catalogued set's (deployments of their
    # own, a further set's as "det@SET" and "rec@SET"); beside the pipeline, further sets load on demand.
    # /readyz is 200 once the default set's stages answer; a further set's stages join its answer a
    # second or two after Serve runs them (the fixture waited for every replica): the pipeline reads
    # Serve's status at most once a second, and the front reuses a probe's answer for ready_cache_s.
    models = models_deployment(config)
    further = {} if models == "OcrPipeline" else {
        f"{stage}@{name}": True for name in ("ppocrv4_mobile", "ppocrv6_tiny") for stage in ("det", "rec")}
    want = {"det": True, "cls": True, "rec": True, **further}
    deadline = time.monotonic() + 15
    while True:
        r = requests.get(f"{url}/readyz", timeout=10)
        assert r.status_code == 200, r.text
        if r.json()["stages"] == want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.json()["stages"] == want
    deployments = serve.status().applications["ocr"].deployments
    assert "DirectionClassifier" not in deployments and "TextDetector" not in deployments
    assert deployments[models].replica_states == {"RUNNING": 1}
    if models == "OcrPipeline":
        assert "TextRecognizer" not in deployments
    stages = stage_stats()
    (det,), (cls,), (rec,) = stages["det"], stages["cls"], stages["rec"]
    assert (det["stage"], cls["stage"], rec["stage"]) == ("det", "cls", "rec")
    assert det["pid"] == cls["pid"] == rec["pid"]  # one process
    assert replica_pids([models])[models] == [rec["pid"]]  # the pipeline's too, with_pipeline
    live = requests.get(f"{url}/v1/stats", timeout=30).json()["stages"]  # the page's Live tab
    assert {s: live[s]["deployment"] for s in ("det", "cls", "rec")} == {"det": models, "cls": models, "rec": models}
    # Every predictor on both cores (building the classifier's first once narrowed the process to core 0).
    assert rec["cpu_affinity"] == cls["cpu_affinity"] == det["cpu_affinity"] == [0, 1]
    assert rec["ready_at"] and cls["ready_at"] and det["ready_at"]
    # The detector was built beside the recogniser, not before it: its load
    # and warm-up overlapped the recogniser's.
    assert det["started_at"] < rec["ready_at"] and rec["started_at"] < det["ready_at"]


def test_it_reads_what_the_engine_reads_under_concurrency(light, engine_reads):
    url, _ = light
    names = IMAGES * 2
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: post(url, n), names))
    for name, r in zip(names, answers):
        assert r.status_code == 200, (name, r.text)
        assert r.json()["results"] == engine_reads[name], name
    assert [x["text"] for x in engine_reads["rapidocr_text_cls_v3.jpg"]]  # the rotated image has text to turn
    stages = stage_stats()
    assert sum(b["items"] for rep in stages["cls"] for b in rep["recent_batches"]) > 0
    # The detector's images, in its own batches (of up to its own 4, not the recogniser's 24).
    det_batches = [b for rep in stages["det"] for b in rep["recent_batches"]]
    assert sum(b["items"] for b in det_batches) >= len(names) and max(b["items"] for b in det_batches) <= 4


def test_the_recogniser_builds_its_other_shapes_after_ready_and_reads_the_same(light, engine_reads):
    """recognizer.warm: core (the default): ready with the widths up to
    1024 at batch size 1 (recognizer.warm_core_max_width); the other 42
    shapes its `batch_sizes: [1, 2, 4]` keeps (51 of 71) are built in the
    replica's idle moments
    (serve_app/serving/shapes_after_ready.py), and what it reads is the
    engine's before (the test above), meanwhile and after, a batch of a
    size not kept (3, 5) running as kept ones."""
    url, _ = light
    wait_shapes_built()
    (rec,) = stage_stats()["rec"]
    shapes = rec["deferred_shapes"]
    assert (shapes["total"], shapes["built"], shapes["left"], shapes["failed"]) == (51, 51, 0, 0), shapes
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: post(url, n), IMAGES))
    for name, r in zip(IMAGES, answers):
        assert r.status_code == 200, (name, r.text)
        assert r.json()["results"] == engine_reads[name], name


def test_a_new_user_config_reaches_the_classifier_and_recogniser_and_the_detector_keeps_its_own(light):
    url, config = light
    changed = copy.deepcopy(config)
    for d in changed["applications"][0]["deployments"]:
        if d["name"] == models_deployment(config):
            d["user_config"] = {"max_batch_size": 7, "batch_wait_timeout_s": 0.0}
    apply_config(changed)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stages = stage_stats()
            sizes = {s: [rep["max_batch_size"] for rep in stages[s]] for s in ("det", "cls", "rec")}
            if sizes == {"det": [4], "cls": [7], "rec": [7]}:
                break
            time.sleep(1)
        assert sizes == {"det": [4], "cls": [7], "rec": [7]}
        assert post(url, "rapidocr_ch_en_num.jpg").status_code == 200
    finally:
        apply_config(config)


def wait_trimmed(timeout_s: float = 60) -> dict:
    """The models' process once its heap was trimmed after its last work
    (serve_app/serving/heap.py): nothing in flight and no trim pending, read
    from its stats (explicit steps, not a sleep)."""
    end = time.monotonic() + timeout_s
    while True:
        (rec,) = stage_stats()["rec"]
        heap = rec["heap"]
        if heap["in_flight"] == 0 and not heap["trim_pending"]:
            return rec
        assert time.monotonic() < end, heap
        time.sleep(0.2)


def test_a_burst_of_40_megapixel_pages_is_given_back_once_the_process_is_idle(light):
    """The heap settings' hostile case: image-sized buffers are reused from
    the heap instead of mapped per request (~25 ms an image less), so a
    burst of the largest pages a stranger may send (40 MP, the pixel limit,
    mostly blank, one line of text; as ~0.3 MB of JPEG, a few kB of AVIF or
    HEIC, in turn) grows the models'
    process; once it has been idle for malloc_trim_idle_s the heap's free
    pages go back to the OS. What admission takes of the burst is read."""
    import cv2
    import numpy as np

    import io

    from PIL import Image

    import serve_app.ocr.decode  # noqa: F401  registers HEIF with Pillow

    url, _ = light
    page = np.full((5600, 7000, 3), 255, np.uint8)
    cv2.putText(page, "HEAP TRIM 2026", (400, 2800), cv2.FONT_HERSHEY_SIMPLEX, 12, (0, 0, 0), 30)
    # The same page as JPEG (~0.3 MB) and in the phone formats, which carry
    # it in far fewer bytes and cost about twice a JPEG's decode (a 36 MP
    # blank page here: AVIF 1 kB 663 ms, HEIC 22 kB 587 ms, JPEG 563 kB 294 ms).
    bodies = [(cv2.imencode(".jpg", page, [cv2.IMWRITE_JPEG_QUALITY, 80])[1].tobytes(), "image/jpeg")]
    for fmt, ctype in (("AVIF", "image/avif"), ("HEIF", "image/heic")):
        buf = io.BytesIO()
        Image.fromarray(page).save(buf, fmt, quality=60)
        bodies.append((buf.getvalue(), ctype))
    assert all(len(body) < 1_000_000 for body, _ in bodies)
    rec = wait_trimmed()
    assert rec["heap"]["arena_max_env"] == "1" and rec["heap"]["idle_s"] == 1.0
    pid, trims = rec["pid"], rec["heap"]["trims"]
    before = pss_mb(pid)["pss"]

    def read(i):
        body, ctype = bodies[i % len(bodies)]
        r = requests.post(f"{url}/v1/ocr", data=body, timeout=180,
                          headers={"Content-Type": ctype, "Cache-Control": "no-cache"})
        text = " ".join(x["text"] for x in r.json().get("results", [])) if r.status_code == 200 else r.text
        return r.status_code, text, r.headers.get("Retry-After"), pss_mb(pid)["pss"]

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(read, range(8)))
    # Admission bounds the burst's cost (~8 s of work a page, serve_app/http/policies/admission.py):
    # what it takes is read, the rest is 503 with Retry-After; one is always taken.
    read_ = [a for a in answers if a[0] == 200]
    assert read_ and all("HEAP" in text.replace(" ", "").upper() for _, text, _, _ in read_), answers
    assert all(a[0] == 503 and a[2] for a in answers if a[0] != 200), answers
    peak = max(a[3] for a in answers)
    rec = wait_trimmed()
    after = pss_mb(pid)["pss"]
    assert rec["heap"]["trims"] > trims
    assert after < before + 64, (before, peak, after)


def test_the_default_reads_accents_and_spaces_and_further_sets_load_on_their_first_request(light):
    """The catalogue's default (PP-OCRv6 small) is loaded before ready and
    reads a German line exactly, accents and spaces included, with no
    options. Beside the pipeline, v4 and tiny are not loaded until asked
    for: GET /v1/models says so, and the models' process grows only when
    one is first asked for (answered 200, after its load or by following
    Retry-After); a third set that fits set_loading.memory_mb beside the
    second is loaded at once, both kept, each one's measured PSS in
    GET /v1/models. A set outside the catalogue is a
    400 listing it, answered without any work. With the pipeline apart,
    every set is a deployment of its own, loaded before ready."""
    url, config = light
    image = {"base64": base64.b64encode(line_png(GERMAN_LINE)).decode()}
    on_demand = models_deployment(config) == "OcrPipeline"

    def states() -> dict:
        got = requests.get(f"{url}/v1/models", timeout=30).json()
        assert got["default"] == "ppocrv6_small"
        return {m["name"]: m["state"] for m in got["models"]}

    assert list(states()) == ["ppocrv6_small", "ppocrv4_mobile", "ppocrv6_tiny"]
    default = requests.post(f"{url}/v1/ocr", json={"image": image}, timeout=120, headers={"Cache-Control": "no-cache"})
    assert default.status_code == 200, default.text
    assert " ".join(r["text"] for r in default.json()["results"]) == GERMAN_LINE
    if not on_demand:
        assert set(states().values()) == {"loaded"}
        v4, _ = post_following_retry_after(url, {"image": image, "options": {"model": "ppocrv4_mobile"}})
        assert v4.status_code == 200 and "ß" not in " ".join(r["text"] for r in v4.json()["results"])
    else:
        assert states() == {"ppocrv6_small": "loaded", "ppocrv4_mobile": "not loaded", "ppocrv6_tiny": "not loaded"}
        pid = wait_trimmed()["pid"]
        before = pss_mb(pid)["pss"]
        v4, waits = post_following_retry_after(url, {"image": image, "options": {"model": "ppocrv4_mobile"}})
        assert v4.status_code == 200, v4.text
        assert "ß" not in " ".join(r["text"] for r in v4.json()["results"])  # v4's dictionary has no ß
        assert states() == {"ppocrv6_small": "loaded", "ppocrv4_mobile": "loaded", "ppocrv6_tiny": "not loaded"}
        wait_trimmed()
        with_v4 = pss_mb(pid)["pss"]
        assert with_v4 > before + 100, (before, with_v4)  # v4's predictors, loaded only now
        # Asked for right after v4's load, tiny fits set_loading.memory_mb beside it (auto: half the
        # memory available at start): loaded on its first request, v4 kept, no churn wait.
        tiny, tiny_waits = post_following_retry_after(url, {"image": image, "options": {"model": "ppocrv6_tiny"}})
        assert tiny.status_code == 200, tiny.text
        assert "ö" in " ".join(r["text"] for r in tiny.json()["results"])
        got = {m["name"]: m for m in requests.get(f"{url}/v1/models", timeout=30).json()["models"]}
        assert {n: m["state"] for n, m in got.items()} == dict.fromkeys(got, "loaded")
        # each one's PSS added by its load, as measured (before its shapes built after ready: tiny's ~60 MB)
        assert got["ppocrv4_mobile"]["mb"] > 100 and got["ppocrv6_tiny"]["mb"] > 0, got
        print(f"models' process PSS: {before:.0f} MB default only, {with_v4:.0f} MB with v4 "
              f"({waits} 503s before v4's answer), {pss_mb(pid)['pss']:.0f} MB with tiny beside it "
              f"({tiny_waits} 503s); measured per set: v4 {got['ppocrv4_mobile']['mb']} MB, "
              f"tiny {got['ppocrv6_tiny']['mb']} MB")
    bad = requests.post(f"{url}/v1/ocr", json={"image": image, "options": {"model": "ppocrv5_mobile"}}, timeout=30)
    assert bad.status_code == 400
    assert "served: ppocrv6_small, ppocrv4_mobile, ppocrv6_tiny" in bad.json()["error"]["message"]


def test_plain_english_and_accented_lines_are_read_with_their_spaces_through_the_service(light, engine):
    """What a new user of `make serve` sends first: one printed line, no
    options. Through the service the default set reads each English line
    (three sizes, 120 images) and each accented Latin line (60 at 26 px)
    as the in-process engine does, and at least 95% of the English lines
    exactly, spaces and punctuation included."""
    import cv2

    from harness.eval_sets import accented_latin, english, score_lines

    url, _ = light
    items = english() + accented_latin(sizes=(26,))

    def read(item) -> str:
        png = cv2.imencode(".png", item.image)[1].tobytes()
        r = requests.post(f"{url}/v1/ocr", files={"file": (f"{item.name}.png", png)}, timeout=120,
                          headers={"Cache-Control": "no-cache"})
        assert r.status_code == 200, (item.name, r.text)
        return " ".join(line["text"] for line in r.json()["results"])

    with ThreadPoolExecutor(4) as pool:
        served = list(pool.map(read, items))
    in_process = [" ".join(line.text for line in engine.read(item.image).lines) for item in items]
    differ = [(item.name, s, e) for item, s, e in zip(items, served, in_process) if s != e]
    assert not differ, differ[:5]
    n_en = len(english())
    n, _, exact, errors, chars = score_lines(tuple(i.truth[0] for i in items[:n_en]), served[:n_en])
    assert exact >= 0.95 * n, (exact, n, errors / chars)
