"""Admission by cost (serve_app.http.policies.admission): the size read at the door, the
cost model learned from requests that ran alone, the drain rate over busy
time, Retry-After, the admit/refuse decision, the ledger, and the hook in
the result cache's Dedupe (a hit or a shared answer is never admitted)."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from harness.pdfs import blank_pdf, lying_count_pdf
from serve_app.http.policies.drain import DrainMeter
from serve_app.http.policies.cost import (
    UNKNOWN_PIXELS, Calibration, CostModel, Size, decide, expected_seconds, image_size, retry_after,
)
from serve_app.http.policies.admission import Admission, Gate, count_lines
from serve_app.core.engine_config import DocumentLimits
from serve_app.core.errors import BadRequest, DeadlineExceeded, Overloaded
from serve_app.core.request_options import OcrOptions
from serve_app.http.policies.result_cache import Dedupe, ResultCache
from serve_app.core.app_args import AdmissionArgs


def png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), "white").save(buf, "PNG")
    return buf.getvalue()


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Seen:
    """A stand-in metric recording what it was given."""

    def __init__(self):
        self.values: list = []

    def inc(self, tags=None):
        self.values.append(tags)

    def set(self, v):
        self.values.append(v)

    def observe(self, v):
        self.values.append(v)


class FakeMetrics:
    def __init__(self):
        self.refusals, self.queued_cost, self.drain_rate, self.estimate_ratio = Seen(), Seen(), Seen(), Seen()
        self.slowdown = Seen()


# -- size at the door ----------------------------------------------------------------


def test_size_comes_from_headers_arrays_and_pdf_pages_and_junk_gets_a_default():
    assert image_size(png(640, 480)) == Size(640 * 480, width=640, height=480)
    assert image_size(np.zeros((30, 40, 3), np.uint8)) == Size(1200, width=40, height=30)
    assert image_size(b"not an image") == Size(UNKNOWN_PIXELS, known=False)
    pdf = blank_pdf(3)
    # open_timeout_s raised: a PDF child's start beside a busy core is not what this checks
    size = image_size(pdf, DocumentLimits(render_dpi=72, open_timeout_s=60))
    with_dpi = image_size(pdf, DocumentLimits(render_dpi=144, open_timeout_s=60))
    assert size.pages == with_dpi.pages == 3
    assert with_dpi.pixels == pytest.approx(4 * size.pixels, rel=0.02)  # twice the DPI, four times the pixels
    assert image_size(pdf) == Size(UNKNOWN_PIXELS, known=False)  # no document limits: not opened as a PDF


@pytest.mark.parametrize("count", [2, 100, 5000])
def test_a_page_count_that_lies_is_refused_before_it_is_priced(count):
    """The price is pages x the first page's pixels: a /Count of 100 over one
    page would be priced as 100 pages (a 503 'submit it as a job' on a slow
    CPU, whose job then fails). Opening reads the last page's size: a 400
    naming it, whatever the cost model has learned."""
    with pytest.raises(BadRequest, match=f"page {count} cannot be loaded"):
        image_size(lying_count_pdf(count), DocumentLimits(open_timeout_s=60, max_pages=10_000))


# -- the cost model ---------------------------------------------------------------------


def test_the_prior_costs_bigger_images_and_more_pages_more():
    m = CostModel(0.1, 0.2, 0.01, lines_per_mp=30)
    small, big = m.estimate(Size(10_000)), m.estimate(Size(2_000_000))
    assert small == pytest.approx(0.1 + 0.2 * 0.01 + 0.01 * 30 * 0.01)
    assert big == pytest.approx(0.1 + 0.2 * 2 + 0.01 * 30 * 2)
    assert m.estimate(Size(2_000_000, pages=5)) == pytest.approx(5 * big)


def test_the_model_learns_the_true_coefficients_and_lines_per_megapixel():
    m = CostModel(0.5, 1.0, 0.05)  # a poor prior
    rng = np.random.default_rng(3)
    for _ in range(200):
        mp = float(rng.uniform(0.01, 2.0))
        lines = int(rng.integers(1, 80))
        m.observe(Size(int(mp * 1e6)), lines, 0.05 + 0.3 * mp + 0.004 * lines)
    base, per_mp, per_line = m.theta
    assert base == pytest.approx(0.05, abs=0.01)
    assert per_mp == pytest.approx(0.3, abs=0.02)
    assert per_line == pytest.approx(0.004, abs=0.0005)
    assert m.observed == 200 and m.snapshot()["observed"] == 200


def test_one_image_seen_again_and_again_stays_solvable_and_fits_its_own_cost():
    m = CostModel(0.15, 0.2, 0.006)
    for _ in range(100):
        m.observe(Size(110_000), 69, 0.6)  # a dense page: few pixels, many lines
    assert m.estimate(Size(110_000)) == pytest.approx(0.6, rel=0.05)
    assert all(np.isfinite(m.theta)) and (m.theta >= 0).all()


def test_documents_and_nonsense_are_not_learned():
    m = CostModel(0.15, 0.2, 0.006)
    before = m.theta.copy()
    m.observe(Size(1_000_000, pages=4), 10, 3.0)
    m.observe(Size(1_000_000), 10, float("nan"))
    m.observe(Size(1_000_000), 10, 0.0)
    assert (m.theta == before).all() and m.observed == 0


def sized_tiff(sizes: list[tuple[int, int]]) -> bytes:
    """A 1-bit TIFF, each page of its own size (G4: a blank page is a few bytes)."""
    ims = [Image.new("1", wh, 1) for wh in sizes]
    buf = io.BytesIO()
    ims[0].save(buf, format="TIFF", compression="group4", save_all=True, append_images=ims[1:])
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["tiff", "pdf"])
def test_every_page_of_a_document_is_priced_from_its_own_header_not_its_first(kind):
    """Issue 38, item 2: 199 pages whose first is 16 x 16 px are priced as
    199 full pages, not 199 x the sliver; each page's size is read from
    the TIFF's directories or PDFium's page sizes (nothing rendered)."""
    from harness.pdfs import sized_pdf

    limits = DocumentLimits()
    if kind == "tiff":
        body = sized_tiff([(16, 16)] + [(2000, 2800)] * 198)
        full = 2000 * 2800
    else:  # 16 px at the render DPI, then A4 pages
        sliver = 16 * 72 / limits.render_dpi
        body = sized_pdf([(sliver, sliver)] + [(595, 842)] * 198)
        full = image_size(sized_pdf([(595, 842)]), limits).pixels
    size = image_size(body, limits)
    assert size.pages == 199 and size.page_pixels[0] == 256 and set(size.page_pixels[1:]) == {full}
    m = CostModel(0.15, 0.2, 0.006)
    page = m.estimate(Size(full))
    assert m.estimate(size) == pytest.approx(198 * page + m.estimate(Size(256)))
    assert m.estimate(size) > 5 * 199 * m.estimate(Size(256))  # the old price: 199 x the sliver's


@pytest.mark.parametrize("body, code", [
    ("lying", "bad_request"), ("long_page", "bad_request"), ("tiff_page_over_limit", "too_large"),
])
def test_a_bad_document_is_refused_for_being_bad_before_it_is_priced(body, code):
    from harness.pdfs import lying_count_pdf, sized_pdf
    from serve_app.core.errors import OcrError

    data = {"lying": lying_count_pdf(199),
            "long_page": sized_pdf([(595, 842)] * 3 + [(1, 10_000)]),
            "tiff_page_over_limit": sized_tiff([(16, 16), (9000, 9000)])}[body]
    clock = Clock()
    a = Admission(args(), None, clock)

    async def go():
        with Gate(a, data, 10.0, DocumentLimits(max_page_pixels=50_000_000), clock=clock) as gate:
            await gate.admit()

    with pytest.raises(OcrError) as e:
        asyncio.run(go())
    assert e.value.code == code and "page" in e.value.message
    assert a.seq == 0 and a.queued_s == 0 and not a.refused  # never priced, nothing held


def test_the_options_add_their_work_to_the_price():
    from serve_app.core.request_options import parse_options

    m = CostModel(0.15, 0.2, 0.006, s_per_tile=0.1, min_turned=0.1)
    plain = image_size(png(4000, 4000), options=parse_options({"page_orientation": False}))
    turned = image_size(png(4000, 4000), options=parse_options({"page_orientation": True}))
    fine = image_size(png(4000, 4000), options=parse_options({"page_orientation": False, "limit_side_len": 640}))
    picture = image_size(png(4000, 4000), options=parse_options({"page_orientation": False, "visualize": True}))
    base = m.estimate(plain)
    assert m.estimate(turned) == pytest.approx(base * 1.1)  # a tenth of the pages priced as read twice
    assert fine.extra_tiles == 31 and m.estimate(fine) == pytest.approx(base + 31 * 0.1)  # at most max_tiles
    assert m.estimate(picture) == pytest.approx(base + 0.05 * 16)
    for _ in range(200):  # every page seen turned: priced as read twice
        m.observe_turned(1, 1)
    assert m.estimate(turned) == pytest.approx(base * 2, rel=0.01)


def test_blank_or_adversarial_pages_cannot_move_the_model_far():
    """Blank 40 MP pages answered in 1.5 s teach nothing; 40 MP pages with
    one line each, answered fast, move a 40 MP page's price at most
    `drift` times down from the prior's (a floor), and absurdly slow
    answers at most `drift` times up (a ceiling)."""
    m = CostModel(0.15, 0.2, 0.006, drift=4.0)
    big = Size(40_000_000)
    prior = m.estimate(big)
    for _ in range(300):
        m.observe(big, 0, 1.5)  # blank
    assert m.observed == 0 and m.estimate(big) == prior
    for _ in range(2000):
        m.observe(big, 1, 0.5 * m.estimate(big))  # one line, each answered in half its price
        m.observe(Size(1_000_000), 1, 0.5 * m.estimate(Size(1_000_000)))
    assert m.observed > 0 and m.estimate(big) == pytest.approx(prior / 4)
    m2 = CostModel(0.15, 0.2, 0.006, drift=4.0)
    for _ in range(2000):
        m2.observe(Size(100_000), 5, 2.0 * m2.estimate(Size(100_000)))
    assert m2.estimate(Size(100_000)) <= 4 * CostModel(0.15, 0.2, 0.006).estimate(Size(100_000)) + 1e-9


def test_each_model_set_has_its_own_cost_model():
    clock = Clock()
    a = Admission(args(), None, clock)
    t = a.admit(Size(1_000_000, model="ppocrv6_small"), None)
    clock.t += 3.0
    a.finish(t, RESULT)
    assert a.models["ppocrv6_small"].observed == 1 and a.model.observed == 0
    assert "ppocrv6_small" in a.snapshot()["models"]


def test_a_page_read_twice_teaches_only_the_turned_share():
    clock = Clock()
    a = Admission(args(), None, clock)
    t = a.admit(Size(1_000_000, orientation=True), None)
    clock.t += 2.0
    a.finish(t, {"results": [{"text": "a"}], "timings_ms": {"det": 1.0, "orientation": 900.0}})
    assert a.model.observed == 0 and a.model.turned_share() > 0.1


# -- the drain rate ------------------------------------------------------------------------


def test_drain_rate_is_work_done_per_busy_second_and_keeps_its_last_value():
    d = DrainMeter(window_s=10, min_done=3, min_busy_s=0.5)
    assert d.rate(0.0) is None
    d.busy(0.0, True)
    for t in (1.0, 2.0, 3.0):
        d.finished(t, 2.0)  # 6 s of work in 4 busy seconds
    d.busy(4.0, False)
    assert d.rate(4.0) == pytest.approx(6 / 4)
    assert d.rate(8.0) == pytest.approx(6 / 4)  # idle time does not count against it
    assert d.busy_seconds(8.0) == pytest.approx(4.0)
    assert d.rate(30.0) == pytest.approx(6 / 4)  # window empty: the last measured rate stands
    d.busy(30.0, True)
    d.finished(31.0, 1.0)
    assert d.rate(31.0) == pytest.approx(6 / 4)  # too little in the window to measure again


def test_drain_rate_kept_as_entries_come_and_go_matches_the_window_summed_afresh():
    """The window's sums, kept incrementally (constant time an admission),
    against the same window summed from every event, over a long random run
    whose spans straddle the window's start."""
    import random

    rnd = random.Random(7)
    d = DrainMeter(window_s=5, min_done=1, min_busy_s=0.01)
    done, spans, since, now = [], [], None, 0.0
    for _ in range(3000):
        now += rnd.expovariate(4.0)
        if rnd.random() < 0.3:
            is_busy = rnd.random() < 0.5
            d.busy(now, is_busy)
            if is_busy and since is None:
                since = now
            elif not is_busy and since is not None:
                spans.append((since, now))
                since = None
        else:
            cost = rnd.uniform(0.01, 2.0)
            d.finished(now, cost)
            done.append((now, cost))
        start = now - 5
        busy = sum(max(0.0, e - max(s, start)) for s, e in spans) + (now - max(since, start) if since is not None else 0)
        work = sum(c for t, c in done if t >= start)
        assert d.busy_seconds(now) == pytest.approx(busy, abs=1e-9)
        if busy >= 0.01 and work > 0:
            assert d.rate(now) == pytest.approx(work / busy, rel=1e-9)
    assert len(d.spans) < len(spans) and len(d.done) < len(done)  # what left the window is gone


# -- Retry-After and the decision ------------------------------------------------------------


def test_retry_after_rounds_up_and_is_clamped():
    assert retry_after(3.2, 2.0, 1, 30) == 2  # 1.6 s -> 2
    assert retry_after(0.01, 2.0, 1, 30) == 1
    assert retry_after(1000, 2.0, 1, 30) == 30
    assert retry_after(3.0, None, 5, 30) == 5  # no rate measured: the configured default


def test_an_empty_ledger_always_admits():
    d = decide(0.0, 50.0, 1.0, 1.0, max_queued_s=10, deadline_share=0.8)
    assert d.admit and d.expected_s == 50.0


def test_refused_when_it_would_finish_past_its_deadline_with_retry_after_from_the_drain_rate():
    # 6 s queued + 1 s own at 2 s of work per second: done in 3.5 s; 0.8 x 4 s = 3.2 s allowed.
    d = decide(6.0, 1.0, 2.0, 4.0, max_queued_s=60, deadline_share=0.8)
    assert not d.admit and d.reason == "deadline" and d.expected_s == pytest.approx(3.5)
    # 7 - 3.2 * 2 = 0.6 s of work must drain first: 0.3 s at the rate -> 1 s.
    assert d.retry_after_s == 1
    assert decide(6.0, 1.0, 2.0, 5.0, max_queued_s=60, deadline_share=0.8).admit  # 3.5 <= 4.0
    longer = decide(30.0, 1.0, 2.0, 4.0, max_queued_s=60, deadline_share=0.8)
    assert longer.retry_after_s == 13  # (31 - 3.2 x 2) / 2 = 12.3 s -> 13


def test_too_big_for_its_deadline_even_alone_waits_for_the_whole_queue():
    d = decide(4.0, 5.0, 2.0, 3.0, max_queued_s=60, deadline_share=0.8)
    assert not d.admit and d.reason == "deadline" and d.retry_after_s == 2  # 4 s of work at 2/s


def test_the_cost_bound_refuses_and_without_a_rate_only_it_applies():
    d = decide(9.5, 1.0, 2.0, None, max_queued_s=10, deadline_share=0.8)
    assert not d.admit and d.reason == "cost_bound" and d.retry_after_s == 1  # 0.5 s over at 2/s
    # Before any drain rate: a long queue is admitted up to the bound, whatever the deadline.
    assert decide(8.0, 1.0, None, 2.0, max_queued_s=10, deadline_share=0.8).admit
    assert decide(9.5, 1.0, None, 100.0, max_queued_s=10, deadline_share=0.8, default_retry_s=3).retry_after_s == 3


def test_a_large_request_among_many_small_ones_expects_a_share_of_the_rate():
    # 10 requests, 2 s of work queued, at 1 s of work per second.
    assert expected_seconds(2.0, 0.1, 1.0, 10) == pytest.approx(2.1)  # a small one: the ledger first
    assert expected_seconds(2.0, 0.5, 1.0, 10) == pytest.approx(5.5)  # a large one: 1/11 of the rate
    assert expected_seconds(2.0, 0.5, 1.0, 10, slowdown=2.0) == pytest.approx(11.0)
    assert expected_seconds(2.0, 0.5, None, 10, slowdown=1.5) == pytest.approx(0.75)  # no rate: its own work
    d = decide(2.0, 0.5, 1.0, 4.0, max_queued_s=60, deadline_share=0.8, others=10)
    assert not d.admit and d.reason == "deadline" and d.retry_after_s == 1  # the ledger is short: soon
    assert decide(2.0, 0.1, 1.0, 4.0, max_queued_s=60, deadline_share=0.8, others=10).admit


def test_calibration_tracks_a_high_quantile_of_the_estimates_bias():
    c = Calibration(q=0.95, step=0.05, cap=3.0)
    for _ in range(50):
        c.observe(0.6)  # cautious estimates: no correction
    assert c.factor == 1.0
    rng = np.random.default_rng(5)
    for _ in range(4000):
        c.observe(float(rng.uniform(0.5, 2.5)))  # 95th percentile: 2.4
    assert c.factor == pytest.approx(2.4, abs=0.15)
    for _ in range(100):
        c.observe(50.0)
    assert c.factor == 3.0  # capped
    c.observe(float("nan"))
    assert c.factor == 3.0


def test_a_late_request_raises_the_slowdown_and_an_answer_within_its_estimate_does_not():
    clock = Clock()
    a = Admission(args(), None, clock)
    t = a.admit(ONE, 1.5)  # expected 1 s
    clock.t += 1.5
    a.finish(t, None, late=True)  # 504 after 1.5 s: at least 1.5 x its estimate
    assert a.calibration.value > 1.0
    before = a.calibration.value
    t = a.admit(ONE, 10.0)
    clock.t += 0.5
    a.finish(t, RESULT)
    assert a.calibration.value < before and a.snapshot()["slowdown"] >= 1.0


# -- the ledger -----------------------------------------------------------------------------


def args(**kw) -> AdmissionArgs:
    return AdmissionArgs(**{"prior_base_s": 1.0, "prior_s_per_mp": 0.0, "prior_s_per_line": 0.0, **kw})


ONE = Size(1_000_000)
RESULT = {"results": [{"text": "a"}, {"text": "b"}]}


def test_the_ledger_holds_admitted_work_and_refuses_with_a_503_and_retry_after():
    clock, metrics = Clock(), FakeMetrics()
    a = Admission(args(max_queued_cost_s=3.5), metrics, clock)
    tickets = [a.admit(ONE, None) for _ in range(3)]
    assert a.queued_s == pytest.approx(3.0) and len(a.held) == 3
    with pytest.raises(Overloaded) as e:
        a.admit(ONE, None)  # 4 s of work over the 3.5 s bound
    assert e.value.status == 503 and e.value.retry_after_s == 1  # no rate yet: the default
    assert "queued here" in e.value.message
    assert metrics.refusals.values == [{"reason": "cost_bound"}] and a.refused == {"cost_bound": 1}
    clock.t += 1.5
    for t in tickets:
        a.finish(t, RESULT)
    assert a.queued_s == 0 and not a.held
    assert a.meter.rate(clock.t) == pytest.approx(3.0 / 1.5)  # 3 s of work drained in 1.5 busy seconds
    assert metrics.queued_cost.values[-1] == 0 and metrics.drain_rate.values[-1] == pytest.approx(2.0)
    assert metrics.estimate_ratio.values == [1.5] * 3  # each took 1.5 s, expected in 1 s (its own work)
    assert metrics.slowdown.values[-1] == a.calibration.factor > 1.0


def test_a_request_expected_past_its_deadline_is_refused_with_the_drain_time():
    clock = Clock()
    a = Admission(args(), None, clock)
    a.meter.last = 2.0  # measured: 2 s of work per second
    held = [a.admit(ONE, 10.0) for _ in range(6)]  # 6 s queued: done in 3 s
    with pytest.raises(Overloaded) as e:
        a.admit(ONE, 4.0)  # (6 + 1) / 2 = 3.5 s > 0.8 x 4 s
    assert e.value.retry_after_s == 1 and "deadline" in e.value.message
    assert a.admit(ONE, 5.0).expected_s == pytest.approx(3.5)
    assert a.refused == {"deadline": 1} and len(held) == 6


def test_failed_or_late_requests_leave_the_ledger_but_do_not_count_as_drained():
    clock = Clock()
    a = Admission(args(), None, clock)
    t = a.admit(ONE, None)
    clock.t += 1
    a.finish(t, None)
    a.finish(t, RESULT)  # twice: no effect
    assert a.queued_s == 0 and not a.meter.done


def test_only_requests_that_ran_alone_teach_the_model():
    clock = Clock()
    a = Admission(args(), None, clock)
    first = a.admit(ONE, None)
    second = a.admit(ONE, None)  # ran alongside the first
    clock.t += 2
    a.finish(first, RESULT)
    a.finish(second, RESULT)
    assert a.model.observed == 0
    alone = a.admit(ONE, None)
    clock.t += 0.5
    a.finish(alone, RESULT)
    assert a.model.observed == 1 and a.snapshot()["model"]["observed"] == 1


def test_disabled_admits_everything_but_still_measures():
    clock = Clock()
    a = Admission(args(enabled=False, max_queued_cost_s=1), None, clock)
    tickets = [a.admit(ONE, 0.1) for _ in range(5)]
    assert a.queued_s == pytest.approx(5.0) and not a.refused
    clock.t += 1
    for t in tickets:
        a.finish(t, RESULT)
    assert a.snapshot()["drain_rate"] == pytest.approx(5.0) and a.snapshot()["enabled"] is False


def test_lines_of_images_and_documents_are_counted():
    assert count_lines(RESULT) == 2
    assert count_lines({"pages": [{"results": [1, 2, 3]}, {"results": []}, {"results": [4]}]}) == 4
    assert count_lines({}) == 0


# -- a request's gate, and the result cache's hook ------------------------------------------------


def test_a_gate_admits_with_the_time_left_and_gives_the_cost_back_on_error():
    clock = Clock()
    a = Admission(args(), None, clock)

    async def go():
        with pytest.raises(RuntimeError):
            with Gate(a, png(100, 100), 10.0, DocumentLimits(), clock=clock) as gate:
                await gate.admit()
                assert a.queued_s == pytest.approx(1.0)
                raise RuntimeError("the pipeline failed")
        assert a.queued_s == 0 and not a.meter.done and a.calibration.value == 1.0
        with pytest.raises(DeadlineExceeded):
            with Gate(a, png(100, 100), 10.0, DocumentLimits(), clock=clock) as gate:
                await gate.admit()
                clock.t += 10.0
                raise DeadlineExceeded("late")
        assert a.queued_s == 0 and a.calibration.value > 1.0  # a 504 counts against the estimates
        with Gate(a, blank_pdf(2), 10.0, DocumentLimits(), clock=clock) as gate:
            await gate.admit()
            assert gate.ticket.size.pages == 2 and a.queued_s == pytest.approx(2.0)
            gate.done({"pages": []})
        assert a.queued_s == 0 and len(a.meter.done) == 1

    asyncio.run(go())


def test_a_cache_hit_or_a_shared_computation_is_never_admitted():
    async def go():
        admitted: list = []

        async def admit():
            admitted.append(1)

        async def compute():
            await asyncio.sleep(0.05)
            return {"results": []}

        d = Dedupe("m", ResultCache(1 << 20, 60), share=True)
        start = lambda deadline: asyncio.ensure_future(compute())  # noqa: E731
        got = await asyncio.gather(*(d.read(b"img", OcrOptions(), 5, start, admit=admit) for _ in range(4)))
        hit = await d.read(b"img", OcrOptions(), 5, start, admit=admit)
        fresh = await d.read(b"img", OcrOptions(), 5, start, fresh=True, admit=admit)
        return admitted, [h for _, h in got], hit[1], fresh[1]

    admitted, how, hit, fresh = asyncio.run(go())
    assert sorted(how) == ["miss", "shared", "shared", "shared"] and hit == "hit" and fresh == "bypass"
    assert len(admitted) == 2  # the miss and the bypass


def test_a_refused_admission_starts_no_computation():
    async def go():
        started: list = []

        async def refuse():
            raise Overloaded("full", retry_after_s=3)

        d = Dedupe("m", None, share=False)
        with pytest.raises(Overloaded):
            await d.read(b"img", OcrOptions(), 5, lambda deadline: started.append(1), admit=refuse)
        return started, d.flights

    started, flights = asyncio.run(go())
    assert started == [] and flights == {}


class HeldCall:
    """A handle call that runs until the test releases it (explicit steps, no race of sleeps)."""

    def __init__(self, calls: list, deadline):
        self.deadline = deadline
        self.cancelled = False
        self.release = asyncio.Event()
        calls.append(self)
        self.task = asyncio.ensure_future(self._run())

    async def _run(self):
        await self.release.wait()
        return {"results": [{"text": "TEST"}]}

    def cancel(self):
        self.cancelled = True
        self.task.cancel()

    def __await__(self):
        return self.task.__await__()


async def until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.001)


def reader(a: Admission, d: Dedupe, start, clock):
    """read(body, timeout, client): one request through the gate and the table, as the ingress does."""
    from serve_app.http.policies.admission import set_client

    def read(body, timeout, client):
        async def one():
            set_client(client)
            gate = Gate(a, body, timeout, DocumentLimits(), clock=clock)
            with gate:
                result, how = await d.read(body, OcrOptions(), timeout, start, gate=gate)
                gate.done(result)
                return result, how
        return asyncio.ensure_future(one())
    return read


def test_a_joined_request_shares_the_ticket_which_stays_charged_after_the_payer_leaves():
    """The hostile pair (issue 38, item 1): a body with a short deadline,
    then the same body with 600 s that joins its computation. When the
    payer leaves, the computation stays in the ledger, charged to the
    joiner's client, until it ends; of eight such pairs the ledger's bound
    (four requests' cost) admits four and refuses the rest, instead of
    running eight with the ledger at 0. (Each costs 10 ms here, to fit
    the payer's 250 ms deadline.)"""
    clock = Clock()
    a = Admission(args(prior_base_s=0.01, max_queued_cost_s=0.045), None, clock)

    async def go():
        calls: list = []
        d = Dedupe("m", None, share=True, flight_timeout_s=600)
        read = reader(a, d, lambda deadline: HeldCall(calls, deadline), clock)
        payers, joiners = [], []
        for i in range(8):
            body = png(100 + i, 100)
            payer = read(body, 0.25, "addr:payer")
            await until(lambda: payer.done() or len(d.flights) > len(joiners))
            if not payer.done():  # admitted: its computation is in flight; the same body joins it
                joiners.append(read(body, 600, "addr:joiner"))
                # joined: each earlier flight has its joiner, this one its payer too
                await until(lambda: payer.done() or sum(f.waiters for f in d.flights.values()) == len(joiners) + 1)
            payers.append((await asyncio.gather(payer, return_exceptions=True))[0])
        held = (a.queued_s, sorted(set(a.owner.values())), len(a.held))
        for call in calls:
            call.release.set()
        answers = await asyncio.gather(*joiners)
        return calls, payers, held, answers

    calls, payers, held, answers = asyncio.run(go())
    assert [type(p).__name__ for p in payers] == ["DeadlineExceeded"] * 4 + ["Overloaded"] * 4
    assert held == (pytest.approx(0.04), ["addr:joiner"], 4)  # charged to the client still waiting
    assert len(calls) == 4 and all(c.deadline is not None for c in calls)  # never without a deadline
    assert [how for _, how in answers] == ["shared"] * 4 and all(r["results"] for r, _ in answers)
    assert a.queued_s == 0 and not a.held and not a.owner and not a.waiters


def test_a_shared_computation_leaves_the_ledger_cancelled_when_its_last_waiter_leaves():
    clock = Clock()
    a = Admission(args(), None, clock)

    async def go():
        calls: list = []
        d = Dedupe("m", None, share=True, flight_timeout_s=600)
        read = reader(a, d, lambda deadline: HeldCall(calls, deadline), clock)
        body = png(50, 50)
        first = read(body, 0.02, "addr:a")  # (the prior: 1 s of work; an empty ledger admits it)
        await until(lambda: d.flights)
        second = read(body, 600, "addr:b")
        await until(lambda: next(iter(d.flights.values())).waiters == 2)
        await asyncio.gather(first, return_exceptions=True)
        during = (a.queued_s, list(a.owner.values()))
        second.cancel()  # its client went away
        await asyncio.gather(second, return_exceptions=True)
        await asyncio.sleep(0)
        return calls, during, d

    calls, during, d = asyncio.run(go())
    assert during == (pytest.approx(1.0), ["addr:b"])
    assert calls[0].cancelled and not d.flights and a.queued_s == 0 and not a.held


def test_a_request_alone_that_goes_away_cancels_its_computation_and_gives_its_cost_back():
    clock = Clock()
    a = Admission(args(), None, clock)

    async def go():
        calls: list = []
        d = Dedupe("m", None, share=False)
        read = reader(a, d, lambda deadline: HeldCall(calls, deadline), clock)
        r = read(png(50, 50), 600, "addr:a")
        await until(lambda: calls)
        held = a.queued_s
        r.cancel()
        await asyncio.gather(r, return_exceptions=True)
        return calls, held

    calls, held = asyncio.run(go())
    assert held == pytest.approx(1.0) and calls[0].cancelled and a.queued_s == 0


# -- admission that cannot be gamed (issue 24, item 3) ---------------------------------------


def empty_chunks_png(mib: float) -> bytes:
    """A 1x1 PNG with `mib` MiB of empty private chunks before its image data."""
    import struct
    import zlib

    real = png(1, 1)
    chunk = struct.pack(">I", 0) + b"prVt" + struct.pack(">I", zlib.crc32(b"prVt"))
    n = int(mib * 1024 * 1024 / len(chunk))
    return real[:33] + chunk * n + real[33:]


def test_a_png_of_empty_chunks_is_sized_from_a_capped_header_and_refused_by_the_decoder():
    from serve_app.core.engine_config import ImageLimits
    from serve_app.core.errors import BadImage
    from serve_app.ocr.decode import decode_image

    data = empty_chunks_png(20)
    assert len(data) > 20 * 1024 * 1024 - 100
    assert image_size(data) == Size(UNKNOWN_PIXELS, known=False)  # at most 256 chunk headers walked
    with pytest.raises(BadImage, match="over 256 chunks before its image data"):
        decode_image(data, ImageLimits(max_bytes=32 * 1024 * 1024))
    assert image_size(empty_chunks_png(0.0001)) == Size(1, width=1, height=1)  # a few chunks: fine


def test_a_long_image_s_tiles_are_part_of_its_cost():
    long_png = png(1000, 30_000)
    size = image_size(long_png)
    assert size.pixels == 30_000_000 and size.tiles > 10
    m = CostModel(0.1, 0.2, 0.0, s_per_tile=0.1)
    assert m.estimate(size) == pytest.approx(m.estimate(Size(size.pixels)) + 0.1 * (size.tiles - 1))


def test_a_request_over_its_own_share_is_refused_even_by_an_empty_ledger_naming_jobs():
    a = Admission(args(max_queued_cost_s=10, max_request_share=0.5), None, Clock())
    with pytest.raises(Overloaded) as e:
        a.admit(Size(1_000_000, pages=6), None)  # 6 s of work, over 5 s
    assert e.value.status == 503 and e.value.retry_after_s >= 1
    assert "POST /v1/ocr/jobs" in e.value.message and a.refused == {"too_big": 1} and not a.held
    assert a.admit(Size(1_000_000, pages=5), None)  # within it: admitted


def test_the_model_ignores_implausible_answers_and_clips_outliers():
    m = CostModel(0.15, 0.2, 0.006)
    before = m.estimate(Size(1_000_000))
    for _ in range(5):
        m.observe(Size(1), 0, 9.0)  # a 1-pixel image that took 9 s (a PNG of empty chunks)
        m.observe(Size(UNKNOWN_PIXELS, known=False), 0, 3.0)  # size unknown
    assert m.observed == 0 and m.estimate(Size(1_000_000)) == before
    for _ in range(5):  # plausible but slow: clipped to 2x the estimate, each
        m.observe(Size(1_000_000), 30, before * 10)
    assert m.observed == 5 and m.estimate(Size(1_000_000)) < 3 * before


def test_one_client_may_fill_the_ledger_alone_but_only_its_share_when_others_come():
    clock = Clock()
    a = Admission(args(max_queued_cost_s=10, max_request_share=1.0, client_share=0.5), None, clock,
                  max_requests=8)
    hog = [a.admit(ONE, None, "addr:10.0.0.1") for _ in range(8)]  # alone: all of it
    assert len(a.held) == 8
    for t in hog[:6]:
        a.finish(t, RESULT)
    a.count_refusal("in_flight", "addr:10.0.0.2")  # another client was turned away at the door
    more = [a.admit(ONE, None, "addr:10.0.0.1") for _ in range(2)]  # up to its share: 4 requests
    with pytest.raises(Overloaded) as e:
        a.admit(ONE, None, "addr:10.0.0.1")
    assert "fair share" in e.value.message and "10.0.0.1" in e.value.message
    assert a.refused["client_share"] == 1
    other = [a.admit(ONE, None, "addr:10.0.0.2") for _ in range(4)]  # the other client gets in
    assert len(other) == 4 and len(more) == 2
    # once the other client has gone quiet for client_window_s, the first may take it all again
    for t in hog[6:] + more + other:
        a.finish(t, RESULT)
    clock.t += 11
    assert len([a.admit(ONE, None, "addr:10.0.0.1") for _ in range(8)]) == 8


def test_a_gate_reads_its_client_from_the_context():
    from serve_app.http.policies.admission import CLIENT

    clock = Clock()
    a = Admission(args(), None, clock)
    token = CLIENT.set("addr:192.0.2.7")
    try:
        gate = Gate(a, png(10, 10), None, clock=clock)
    finally:
        CLIENT.reset(token)
    asyncio.run(gate.admit())
    assert list(a.owner.values()) == ["addr:192.0.2.7"]


def test_an_image_over_the_pixel_limit_is_a_413_at_the_door_never_priced():
    """A decompression bomb's header says billions of pixels: that is the
    pixel limit's 413 (what the decoder would answer), not a request too big
    to take (503) nor work that teaches the cost model anything."""
    from serve_app.core.engine_config import ImageLimits
    from serve_app.core.errors import TooLarge

    clock = Clock()
    a = Admission(args(), None, clock)

    async def go():
        with pytest.raises(TooLarge, match="over the limit of 1000000"):
            with Gate(a, png(2000, 1000), 10.0, DocumentLimits(), clock=clock,
                      limits=ImageLimits(max_pixels=1_000_000)) as gate:
                await gate.admit()
        assert a.queued_s == 0 and not a.meter.done and a.refused == {}
        with Gate(a, png(900, 1000), 10.0, DocumentLimits(), clock=clock,
                  limits=ImageLimits(max_pixels=1_000_000)) as gate:  # under it: priced as before
            await gate.admit()
            assert gate.ticket is not None

    asyncio.run(go())


def test_a_strip_over_the_aspect_limit_is_a_400_at_the_door_however_busy():
    """A 1 x 40,000,000 px PNG (78 kB) is bad input: the decoder's 400
    (limits.max_aspect), answered from its header before it is priced, even
    when the cost model has learned a rate that prices it far over one
    request's share (seen: a 503 "submit it as a job", whose job would then
    fail with the same 400)."""
    from serve_app.core.engine_config import ImageLimits
    from serve_app.core.errors import BadImage

    import struct
    import zlib

    from serve_app.http.policies.cost import Size

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    # The header of a 1 x 40,000,000 px PNG (no pixel data is needed to price it).
    strip = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 40_000_000, 8, 2, 0, 0, 0)) \
        + chunk(b"IEND", b"")
    clock = Clock()
    a = Admission(args(model_drift=1000), None, clock)  # a prior of 1 s at any size: let it learn freely
    limits = ImageLimits(max_pixels=50_000_000, max_aspect=500.0)
    for _ in range(60):  # a slow service: about 3 s a megapixel
        a.model.observe(Size(1_000_000), 60, 3.0)
    assert a.model.estimate(Size(40_000_000)) > 30  # priced over one request's share: a 503 if priced

    async def go():
        with pytest.raises(BadImage, match="max_aspect"):
            with Gate(a, strip, 10.0, DocumentLimits(), clock=clock, limits=limits) as gate:
                await gate.admit()
        assert a.queued_s == 0 and a.refused == {}
        with Gate(a, png(400, 1000), 10.0, DocumentLimits(), clock=clock, limits=limits) as gate:
            await gate.admit()  # a page of an ordinary shape: priced as before
            assert gate.ticket is not None

    asyncio.run(go())


def test_a_model_sets_first_requests_are_priced_as_that_set_and_it_learns_apart():
    """Each set has its own cost model; before it has learnt anything, its
    prior is the default set's scaled by the set's relative cost (the
    most expensive request a stranger can name a set for is priced as that
    set, not as v4)."""
    from serve_app.core.model_sets import DEFAULT_MODEL, SETS

    clock = Clock()
    adm = Admission(AdmissionArgs(max_queued_cost_s=100.0, max_request_share=1.0), clock=clock)
    plain = adm.model_for(None).estimate(Size(1_000_000, width=1000, height=1000))
    for name, s in SETS.items():  # relative to the default set (ppocrv6_small), whose prior the settings are
        size = Size(1_000_000, width=1000, height=1000, model=name)
        expected = plain * s.cost.relative / SETS[DEFAULT_MODEL].cost.relative
        assert adm.model_for(name).estimate(size) == pytest.approx(expected)
    assert adm.model_for("ppocrv6_tiny").estimate(size) < plain < adm.model_for("ppocrv4_mobile").estimate(size) * 2
    small = Size(1_000_000, width=1000, height=1000, model="ppocrv6_small")
    t = adm.admit(small, None)
    assert adm.queued_s == pytest.approx(t.cost_s)
    clock.t += 0.4
    adm.finish(t, {"results": [{"text": "x"}] * 10})
    assert adm.queued_s == 0
    assert adm.model_for("ppocrv6_small").observed == 1 and adm.model_for(None).observed == 0


def test_a_pdf_whose_page_count_lies_is_a_400_at_the_door_however_busy():
    """A one-page PDF whose /Count says 100 is bad input: the 400 naming the
    page, before it is priced (seen on a slower CPU: priced as 100 pages,
    ~36 s of work, a 503 "submit it as a job" whose job then failed)."""
    from serve_app.http.policies.cost import Size

    clock = Clock()
    a = Admission(args(), None, clock)
    for _ in range(60):  # a slow service: about 3 s a megapixel
        a.model.observe(Size(1_000_000), 60, 3.0)
    limits = DocumentLimits(open_timeout_s=60)
    assert a.model.estimate(image_size(blank_pdf(100), limits)) > 30  # 100 true pages: over one request's share

    async def go():
        with pytest.raises(BadRequest, match="page 100 cannot be loaded"):
            with Gate(a, lying_count_pdf(100), 10.0, limits, clock=clock) as gate:
                await gate.admit()
        assert a.queued_s == 0 and a.refused == {}

    asyncio.run(go())


def test_a_request_past_its_estimate_stops_counting_ahead_of_others_and_drains_what_it_read():
    """A page of 1,000 lone letters is priced from its pixels (a few
    seconds) and takes minutes to read: while it ran, the whole of its
    price counted as work ahead of every new request and the drain rate
    (little finished per busy second) fell towards 0, so a one-word image
    with 120 s to its deadline was refused for ~30 s ("would take ~1284 s";
    here the word is priced 1 s, its deadline 60 s).
    Its price now counts ahead of others only for as long as it was
    expected to take, and it drains what it read: lines over its price's
    at the learned seconds a line."""
    clock = Clock()
    a = Admission(args(prior_s_per_line=0.01), None, clock)
    a.meter.last = 0.05  # collapsed: little finished per busy second
    big = a.admit(Size(4_000_000), None)
    word = Size(20_000)
    with pytest.raises(Overloaded):  # just admitted: its work is ahead of the word's
        a.admit(word, 60.0)
    clock.t += 1.5 * big.expected_s  # past its estimate, still running
    assert a.ahead_s(clock.t) == 0 and a.queued_s == pytest.approx(big.cost_s)
    small = a.admit(word, 60.0)  # its own work at a share of the rate: (1 + 1) / 0.05 = 40 s
    assert small.expected_s < 0.8 * 60.0
    a.finish(small, RESULT)
    a.finish(big, {"results": [{"text": "x"}] * 1000})
    drained = a.meter.done[-1][1]
    expected_lines = a.model.lines_per_mp() * 4.0
    assert drained == pytest.approx(big.cost_s + 0.01 * (1000 - expected_lines), rel=0.05) and drained > 4 * big.cost_s


def test_a_request_running_far_past_its_estimate_is_credited_as_it_runs_and_a_small_one_beside_it_is_admitted():
    """A page priced from its pixels at 1 s whose detected lines keep the
    service busy for minutes (the 1,600 lone letters of test_front_stall):
    credited only when it ended, the drain rate fell to the small requests
    finishing beside it, and each of them was refused as expected past its
    deadline. Re-priced as it runs, it counts as work done at its expected
    pace; the small requests, each 3 s beside it, are all admitted."""
    clock = Clock()
    a = Admission(args(), None, clock)
    page = a.admit(ONE, None)  # to an empty ledger: expected in its own 1 s
    refused = 0
    for _ in range(40):  # two minutes of small requests with a 6 s deadline (without the credit: 37 refused)
        try:
            t = a.admit(ONE, 6.0)
        except Overloaded:
            refused += 1
            clock.t += 1
            continue
        clock.t += 3  # slow beside the page
        a.finish(t, RESULT)
    assert refused == 0
    assert a.running_work(clock.t) == pytest.approx(10.0)  # the window's 10 s at its 1 s of work per second
    clock.t += 1
    a.finish(page, RESULT)  # its answer: credited once, no longer as it runs
    assert a.running_work(clock.t) == 0 and a.queued_s == 0


def test_running_requests_are_credited_at_their_expected_pace_and_at_their_price_once_they_end():
    clock = Clock()
    a = Admission(args(), None, clock)
    held = [a.admit(ONE, None) for _ in range(3)]  # each expected in its own 1 s (no rate yet)
    clock.t += 0.5
    assert a.running_work(clock.t) == pytest.approx(1.5)  # half of each
    clock.t += 1.0  # each 0.5 s past its expected finish: still worked on
    assert a.running_work(clock.t) == pytest.approx(4.5)
    for t in held:
        a.finish(t, RESULT)
    assert a.running_work(clock.t) == 0 and a.rate(clock.t) == pytest.approx(3.0 / 1.5)


def test_a_tiffs_pages_stored_in_many_tiles_are_priced_by_their_tile_count():
    """A 16 MP page of 62,500 16 x 16 px tiles decodes for ~1-2.5 s (Pillow
    walks every tile) whatever it shows: priced by its tiles past an
    ordinary page's, at the door, from its directory."""
    from harness.pages import tiled_tiff
    from serve_app.http.policies.cost import CHUNKS_FREE, S_PER_CHUNK

    tiled = image_size(tiled_tiff(4, first=16), DocumentLimits())
    assert tiled.pages == 4 and tiled.page_chunks == (1, 62500, 62500, 62500)
    plain = Size(tiled.pixels, tiled.pages, tiled.tiles, page_pixels=tiled.page_pixels, page_tiles=tiled.page_tiles)
    model = CostModel(0.05, 0.3, 0.002)
    assert model.estimate(tiled) - model.estimate(plain) == pytest.approx(3 * (62500 - CHUNKS_FREE) * S_PER_CHUNK)
    assert model.estimate(tiled) > 3 * 2.5  # each big page at least the ~2.5 s it decodes for beside other work
