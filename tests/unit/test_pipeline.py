"""The one pipeline (serve_app.flow.pipeline) over stand-in stages: what it sends
each stage, what it answers, and the fan-out split and merge. No Ray, no
models."""

from __future__ import annotations

import asyncio

import cv2
import numpy as np
import pytest

from serve_app.core.engine_config import EngineConfig
from serve_app.core.errors import BadImage
from serve_app.core.request_options import OcrOptions
from serve_app.flow.pipeline import Pipeline, Stages, assemble, whole_image_box
from serve_app.flow.fan_out import deal_by_width, fan_out_parts, fanned_out, merge_shares
from serve_app.core.results import Direction, Recognition
from serve_app.ocr.det_preprocess import Geometry


def png(h: int, w: int) -> bytes:
    img = np.full((h, w, 3), 255, np.uint8)
    return cv2.imencode(".png", img)[1].tobytes()


class Calls:
    """Stand-in stages that record what they were given."""

    def __init__(self, boxes, directions=None, texts=None):
        self.boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4, 2)
        self.directions = directions
        self.texts = texts
        self.seen: dict[str, list] = {"det": [], "cls": [], "rec": []}

    async def detect(self, work, params=None, ctx=None):
        self.seen["det"].append(work.shape)
        self.seen.setdefault("det_params", []).append(params)
        return self.boxes

    async def classify(self, crops, ctx=None):
        self.seen["cls"].append(len(crops))
        return self.directions or [Direction("0", 1.0)] * len(crops)

    async def recognize(self, crops, ctx=None):
        self.seen["rec"].append([c.shape for c in crops])
        texts = self.texts or [f"line{i}" for i in range(len(crops))]
        return [Recognition(t, 0.9, ((0.0, 0.5), (0.5, 1.0))[: len(t)]) for t in texts]

    def stages(self, cls: bool = True) -> Stages:
        return Stages(self.detect, self.classify if cls else None, self.recognize)


def read(calls: Calls, image, with_cls=True, **opts):
    return asyncio.run(Pipeline(calls.stages(with_cls), EngineConfig()).read(image, OcrOptions(**opts)))


BOX_A = [[10, 10], [110, 10], [110, 40], [10, 40]]  # upper line
BOX_B = [[10, 60], [200, 60], [200, 90], [10, 90]]  # lower line


def test_lines_come_back_in_reading_order_with_boxes_in_image_coordinates():
    calls = Calls([BOX_B, BOX_A])  # the detector's order is not reading order
    result = read(calls, png(100, 240))
    assert (result.width, result.height) == (240, 100)
    assert [l.text for l in result.lines] == ["line0", "line1"]
    assert [l.box for l in result.lines] == [[[float(x), float(y)] for x, y in BOX_A],
                                             [[float(x), float(y)] for x, y in BOX_B]]
    assert calls.seen["det"] == [(100, 240, 3)]
    assert calls.seen["cls"] == [2]
    assert [s[0] for s in calls.seen["rec"][0]] == [30, 30]  # crops of the boxes' height
    assert set(result.timings_ms) == {"decode", "det", "cls", "rec", "total"}


def test_det_false_reads_the_whole_image_as_one_line():
    calls = Calls([BOX_A])
    result = read(calls, png(32, 200), det=False)
    assert calls.seen["det"] == []
    assert calls.seen["rec"] == [[(32, 200, 3)]]
    assert result.lines[0].box == whole_image_box(200, 32)


def test_classifier_runs_unless_switched_off_or_absent():
    for cls_stage, opt, called in [(True, None, True), (True, True, True), (True, False, False),
                                   (False, None, False), (False, True, False)]:
        calls = Calls([BOX_A])
        read(calls, png(100, 240), with_cls=cls_stage, **({} if opt is None else {"cls": opt}))
        assert bool(calls.seen["cls"]) is called, (cls_stage, opt)


def test_a_flipped_crop_is_rotated_before_recognition():
    img = np.zeros((100, 240, 3), np.uint8)
    img[10:40, 10:60] = 255  # left half of BOX_A white: a 180 rotation puts it on the right
    seen = []

    async def recognize(crops, ctx=None):
        seen.extend(crops)
        return [Recognition("x", 0.9)] * len(crops)

    calls = Calls([BOX_A], directions=[Direction("180", 0.99)])
    stages = Stages(calls.detect, calls.classify, recognize)
    asyncio.run(Pipeline(stages, EngineConfig()).read(img, OcrOptions()))
    crop = seen[0]
    assert crop[:, : crop.shape[1] // 2].mean() < crop[:, crop.shape[1] // 2 :].mean()


def test_no_boxes_reads_nothing_and_calls_no_model_after_the_detector():
    calls = Calls(np.zeros((0, 4, 2)))
    result = read(calls, png(50, 50))
    assert result.lines == ()
    assert calls.seen["cls"] == [] and calls.seen["rec"] == []


def test_junk_is_a_bad_image_before_any_model_runs():
    calls = Calls([BOX_A])
    with pytest.raises(BadImage):
        read(calls, b"not an image")
    with pytest.raises(BadImage):
        read(calls, {"image": 1})
    assert calls.seen["det"] == []


def test_return_chars_gives_each_character_a_box_inside_its_line():
    result = read(Calls([BOX_A], texts=["ab"]), png(100, 240), return_chars=True)
    (line,) = result.lines
    assert [c.text for c in line.chars] == ["a", "b"]
    xs = [p[0] for c in line.chars for p in c.box]
    assert min(xs) >= 10 and max(xs) <= 110


def test_assemble_drops_low_scores_and_empty_text_and_keeps_boxes_aligned():
    boxes = np.array([BOX_A, BOX_B, BOX_A], dtype=np.float32)
    recs = [Recognition("low", 0.2), Recognition("kept", 0.8), Recognition("", 0.99)]
    lines = assemble(boxes, recs, Geometry(2.0, 2.0, 5, 1000, 1000), drop_score=0.5)
    assert [l.text for l in lines] == ["kept"]
    # working -> original: minus the letterbox pad, times the scale
    assert lines[0].box == [[20.0, 110.0], [400.0, 110.0], [400.0, 170.0], [20.0, 170.0]]


def test_assemble_strips_edge_whitespace_and_keeps_char_and_word_boxes_on_their_characters():
    # " ab cd " read along a 100 px wide box: each character 1/7 of it
    text = " ab cd "
    spans = tuple((i / 7, (i + 1) / 7) for i in range(7))
    box = np.array([[[0, 0], [70, 0], [70, 10], [0, 10]]], dtype=np.float32)
    recs = [Recognition(text, 0.9, spans, (0.5, 0.9, 0.8, 0.5, 0.7, 0.6, 0.5))]
    (line,) = assemble(box, recs, Geometry(1.0, 1.0, 0, 70, 10), 0.5, return_chars=True, return_words=True)
    assert line.text == "ab cd"
    assert [c.text for c in line.chars] == ["a", "b", "c", "d"]
    # "a" was the 2nd of 7 characters: x 10..20; "d" the 6th: x 50..60
    assert (line.chars[0].box[0][0], line.chars[0].box[1][0]) == (10.0, 20.0)
    assert (line.chars[-1].box[0][0], line.chars[-1].box[1][0]) == (50.0, 60.0)
    assert [(w.text, w.box[0][0], w.box[1][0]) for w in line.words] == [("ab", 10.0, 30.0), ("cd", 40.0, 60.0)]
    assert line.words[0].score == pytest.approx(0.85)
    # only spaces: no line
    assert assemble(box, [Recognition("   ", 0.9, spans[:3], (0.9,) * 3)], Geometry(1.0, 1.0, 0, 70, 10), 0.5) == ()


@pytest.mark.parametrize("n, fan_out, min_items, parts", [
    (3, 2, 4, 1), (4, 2, 4, 2), (40, 2, 4, 2), (5, 4, 4, 2), (40, 4, 12, 4), (11, 4, 12, 1), (12, 1, 4, 1),
])
def test_fan_out_parts(n, fan_out, min_items, parts):
    assert fan_out_parts(n, fan_out, min_items) == parts


def test_fan_out_deals_crops_by_width_and_merges_answers_back_in_order():
    crops = [np.zeros((10, w, 3), np.uint8) for w in (50, 10, 40, 20, 30)]
    shares = deal_by_width(crops, 2)
    assert shares == [[1, 4, 0], [3, 2]]  # widths 10, 30, 50 | 20, 40
    answers = [[f"w{crops[i].shape[1]}" for i in s] for s in shares]
    assert merge_shares(shares, answers, len(crops)) == ["w50", "w10", "w40", "w20", "w30"]
    with pytest.raises(RuntimeError):
        merge_shares(shares, [answers[0], answers[1][:1]], len(crops))


def test_fanned_out_recognize_calls_once_per_part_and_answers_like_one_call():
    calls = []

    async def recognize(crops, ctx=None):
        calls.append(len(crops))
        return [c.shape[1] for c in crops]

    crops = [np.zeros((10, w, 3), np.uint8) for w in range(10, 90, 10)]
    out = asyncio.run(fanned_out(recognize, 2, 4)(crops))
    assert out == [c.shape[1] for c in crops]
    assert calls == [4, 4]
    calls.clear()
    assert asyncio.run(fanned_out(recognize, 2, 4)(crops[:3])) == [10, 20, 30]
    assert calls == [3]


def test_tagged_parts_of_one_page_prefer_distinct_replicas_and_pages_spread_evenly():
    from serve_app.flow.fan_out import preferred_replica

    hints = []

    async def recognize(crops, ctx=None, part=None):
        hints.append(part)
        return [0] * len(crops)

    crops = [np.zeros((10, w, 3), np.uint8) for w in range(10, 90, 10)]
    firsts = []
    for _ in range(400):
        hints.clear()
        asyncio.run(fanned_out(recognize, 2, 4, tag_parts=True)(crops))
        (o0, k0), (o1, k1) = hints
        assert o0 == o1 and (k0, k1) == (0, 1)
        assert preferred_replica(2, o0, k0) != preferred_replica(2, o1, k1)
        firsts.append(preferred_replica(2, o0, 0))
    assert 150 < firsts.count(0) < 250  # each replica is first for about half the pages
    assert [preferred_replica(3, 5, k) for k in range(3)] == [2, 0, 1]
    hints.clear()
    asyncio.run(fanned_out(recognize, 2, 4, tag_parts=True)(crops[:3]))
    assert hints == [None]  # a single call carries no hint


def test_route_tags_round_trip_and_stay_few():
    from serve_app.flow.fan_out import PART_OFFSETS, parse_route_tag, route_tag

    assert route_tag(None) == "whole" and parse_route_tag("whole") is None
    assert parse_route_tag(route_tag((17, 1))) == (17, 1)
    for bad in ("", "part", "part:1", "part:x:1", "part:1:-1", "model:1:2"):
        assert parse_route_tag(bad) is None
    offsets = set()

    async def recognize(crops, ctx=None, part=None):
        offsets.add(part[0])
        return [0] * len(crops)

    crops = [np.zeros((10, w, 3), np.uint8) for w in range(10, 90, 10)]
    for _ in range(300):
        asyncio.run(fanned_out(recognize, 2, 4, tag_parts=True)(crops))
    assert offsets <= set(range(PART_OFFSETS)) and len(offsets) > PART_OFFSETS // 2


def test_a_passed_deadline_stops_the_pipeline_before_its_next_step_and_reaches_the_stages(monkeypatch):
    import time
    import types

    import serve_app.core.request_context as request_context
    from serve_app.core.errors import DeadlineExceeded

    # The deadline's wall clock, moved by the test alone: no sleep races the deadline.
    clock = types.SimpleNamespace(now=1_000.0)
    monkeypatch.setattr(request_context, "time", types.SimpleNamespace(
        time=lambda: clock.now, perf_counter=time.perf_counter, monotonic=time.monotonic))
    seen = []

    class Slow(Calls):
        async def detect(self, work, params=None, ctx=None):
            seen.append(ctx.deadline)  # what the Serve pipeline passes on with the detector call
            clock.now += 1.0  # the deadline passes while detection runs
            return await super().detect(work, params)

    calls = Slow([BOX_A])
    deadline = clock.now + 0.5
    with pytest.raises(DeadlineExceeded, match="before cropping"):
        asyncio.run(Pipeline(calls.stages(), EngineConfig()).read(png(100, 240), OcrOptions(), deadline))
    assert seen == [deadline] and calls.seen["cls"] == [] and calls.seen["rec"] == []
    with pytest.raises(DeadlineExceeded, match="before decoding"):
        asyncio.run(Pipeline(calls.stages(), EngineConfig()).read(png(100, 240), OcrOptions(), clock.now - 1))
    assert len(read(Calls([BOX_A]), png(100, 240)).lines) == 1  # no deadline: as before


def test_every_stage_call_is_given_the_request_context_the_classifier_included():
    import time

    from serve_app.core.request_context import RequestContext

    got: dict[str, list] = {"det": [], "cls": [], "rec": []}

    class Seen(Calls):
        async def detect(self, work, params=None, ctx=None):
            got["det"].append(ctx)
            return await super().detect(work, params)

        async def classify(self, crops, ctx=None):
            got["cls"].append(ctx)
            return await super().classify(crops)

        async def recognize(self, crops, ctx=None):
            got["rec"].append(ctx)
            return await super().recognize(crops)

    ctx = RequestContext("rid-1", time.time() + 60, "bulk")
    result = asyncio.run(Pipeline(Seen([BOX_A, BOX_B]).stages(), EngineConfig()).read(png(100, 240), OcrOptions(), ctx))
    assert len(result.lines) == 2
    assert got == {"det": [ctx], "cls": [ctx], "rec": [ctx]}  # one value, the same for every stage
    # A bare deadline (the library, older callers) becomes a context with the options' lane.
    deadline = time.time() + 60
    got = {"det": [], "cls": [], "rec": []}
    asyncio.run(Pipeline(Seen([BOX_A]).stages(), EngineConfig()).read(png(100, 240), OcrOptions(priority="bulk"), deadline))
    assert got["cls"] == [RequestContext("", deadline, "bulk")] == got["det"] == got["rec"]


def test_visualize_adds_the_picture_of_the_lines_read_and_nothing_otherwise():
    import io

    from PIL import Image

    calls = Calls([BOX_A, BOX_B])
    plain = read(calls, png(100, 300))
    assert plain.visualization is None and "visualize" not in plain.timings_ms
    result = read(calls, png(100, 300), visualize=True)
    vis = result.visualization
    assert [l.text for l in result.lines] == [l.text for l in plain.lines]
    assert Image.open(io.BytesIO(vis.data)).format == "JPEG" and (vis.width, vis.height) == (600, 100)
    assert result.timings_ms["visualize"] >= 0 and result.to_dict()["visualization"]["media_type"] == "image/jpeg"
    img = np.asarray(Image.open(io.BytesIO(vis.data)).convert("L")).astype(int)
    assert (img[15:35, 20:100] < 230).mean() > 0.9  # BOX_A tinted on the white image
    assert (img[5:95, 220:290] > 245).mean() > 0.99  # right of the boxes: untouched
def test_request_detection_options_reach_the_detector_and_drop_score_drops_lines():
    from serve_app.core.request_options import DetParams

    calls = Calls([BOX_A, BOX_B])
    assert len(read(calls, png(100, 240)).lines) == 2  # read at 0.9, over the config's 0.5
    assert calls.seen["det_params"] == [DetParams()]
    calls = Calls([BOX_A, BOX_B])
    assert read(calls, png(100, 240), drop_score=0.95, box_thresh=0.7, limit_side_len=640).lines == ()
    assert calls.seen["det_params"] == [DetParams(limit_side_len=640, box_thresh=0.7)]


# -- page orientation and blocks (#25 items 2 and 3) over stand-in stages ---------


class UpsideDown(Calls):
    """A page whose lines the classifier calls upside down as it comes, and
    upright once the page is turned."""

    async def classify(self, crops, ctx=None):
        self.seen["cls"].append(len(crops))
        return [Direction("180" if len(self.seen["cls"]) == 1 else "0", 0.99)] * len(crops)


def test_a_page_whose_lines_all_read_upside_down_is_read_again_upright_and_answered_upright():
    calls = UpsideDown([BOX_A, BOX_B])
    result = read(calls, png(100, 240))
    assert calls.seen["det"] == [(100, 240, 3), (100, 240, 3)]  # once as it came, once turned upright
    assert result.orientation == 180 and "orientation" in result.timings_ms
    # the upright view's BOX_A (first in its reading order) is, in the image as sent, turned with it
    assert result.lines[0].box == [[130.0, 60.0], [230.0, 60.0], [230.0, 90.0], [130.0, 90.0]]
    assert result.to_dict()["orientation"] == 180
    assert [b.lines for b in result.blocks] == [(0, 1)]


def test_a_page_that_still_votes_turned_once_turned_stays_as_it_is():
    calls = Calls([BOX_A, BOX_B], directions=[Direction("180", 0.99)] * 2)  # upside down whichever way
    result = read(calls, png(100, 240))
    assert len(calls.seen["det"]) == 2 and result.orientation == 0


def test_a_page_that_votes_turned_but_reads_worse_turned_stays_as_it_is_after_one_more_pass():
    """The bound on what a page can make the pipeline do: one more pass at most."""

    class WorseTurned(Calls):
        async def recognize(self, crops, ctx=None):
            self.seen["rec"].append([c.shape for c in crops])
            text = "ab" if len(self.seen["rec"]) == 1 else "a"
            return [Recognition(text, 0.9, ((0.0, 0.5), (0.5, 1.0))[: len(text)]) for _ in crops]

    tall = [[10, 10], [40, 10], [40, 90], [10, 90]]  # a vertical line: votes 90 with an upright call
    calls = WorseTurned([tall, [[60, 10], [90, 10], [90, 90], [60, 90]]])
    result = read(calls, png(100, 240))
    assert len(calls.seen["det"]) == 2 and calls.seen["det"][1] == (240, 100, 3)
    assert result.orientation == 0 and [l.text for l in result.lines] == ["ab", "ab"]


def test_orientation_off_by_option_or_without_the_classifier_costs_no_pass():
    for opts, with_cls in (({"page_orientation": False}, True), ({"cls": False}, True), ({}, False)):
        calls = Calls([BOX_A, BOX_B], directions=[Direction("180", 0.99)] * 2)
        result = read(calls, png(100, 240), with_cls=with_cls, **opts)
        assert len(calls.seen["det"]) == 1 and result.orientation is None
        assert "orientation" not in result.to_dict()


def test_upright_pages_cost_no_extra_pass_and_answer_orientation_0_and_blocks():
    calls = Calls([BOX_A, BOX_B])
    body = read(calls, png(100, 240)).to_dict()
    assert len(calls.seen["det"]) == 1
    assert body["orientation"] == 0
    assert body["blocks"] == [{"box": [[10.0, 10.0], [200.0, 10.0], [200.0, 90.0], [10.0, 90.0]], "lines": [0, 1]}]


def test_the_reference_profile_keeps_the_references_answer_shape_and_order():
    from serve_app.core.engine_config import reference_config

    calls = Calls([BOX_A, BOX_B], directions=[Direction("180", 0.99)] * 2)
    result = asyncio.run(Pipeline(calls.stages(), reference_config()).read(png(100, 240), OcrOptions()))
    body = result.to_dict()
    assert len(calls.seen["det"]) == 1 and "orientation" not in body and "blocks" not in body


def test_a_long_image_s_tiles_reach_the_detector_through_a_bounded_window():
    from serve_app.core.engine_config import PipelineOptions
    from serve_app.ocr.tiling import tile_count

    cfg = EngineConfig(pipeline=PipelineOptions(tile_window=3, max_tiles=20))
    total = tile_count(40, 19_000, cfg.pipeline, 1280)

    class Window(Calls):
        """A tile waits in detection until 3 are there (or every tile has
        come): explicit steps, no race of sleeps."""
        active = most = started = 0
        cond = None

        async def detect(self, work, params=None, ctx=None):
            Window.cond = Window.cond or asyncio.Condition()
            Window.active += 1
            Window.started += 1
            Window.most = max(Window.most, Window.active)
            async with Window.cond:
                Window.cond.notify_all()
                await Window.cond.wait_for(lambda: Window.active >= 3 or Window.started >= total)
            Window.active -= 1
            self.seen["det"].append(work.shape)
            return np.zeros((0, 4, 2), np.float32)

    calls = Window([])
    asyncio.run(Pipeline(calls.stages(), cfg).read(np.full((40, 19_000, 3), 255, np.uint8)))
    assert 10 <= total <= 20 and len(calls.seen["det"]) == total and Window.most == 3


def test_a_requests_work_takes_its_clients_turn_at_the_bulk_gate_and_every_stage():
    """The Serve pipeline's bulk gate (a PriorityGate's hold) holds a bulk
    image as one place of its client's (a job's pages, many jobs of one
    client: one turn), and each stage call is given that client (the
    detector's and classifier's gates and the recogniser's scheduler give
    bulk places to clients in turn). On main the request's id went in as
    the place's weight: every bulk image went through the gate alone, and
    no owner was ever given a turn."""
    from serve_app.core.lanes import INTERACTIVE, PriorityGate
    from serve_app.core.request_context import RequestContext

    gate = PriorityGate(8, 5.0, bypass=(INTERACTIVE,))
    seen: list = []

    class Seen(Calls):
        async def detect(self, work, params=None, ctx=None):
            seen.append(("det", ctx.client, gate.used, dict(gate.held)))
            return await super().detect(work, params)

        async def classify(self, crops, ctx=None):
            seen.append(("cls", ctx.client))
            return await super().classify(crops)

        async def recognize(self, crops, ctx=None):
            seen.append(("rec", ctx.client))
            return await super().recognize(crops)

    pipe = Pipeline(Seen([BOX_A]).stages(), EngineConfig(), gate.hold)
    for job in range(2):
        ctx = RequestContext(f"job{job}", None, "bulk", "addr:10.0.0.1")
        assert len(asyncio.run(pipe.read(png(100, 240), OcrOptions(page_orientation=False), ctx)).lines) == 1
    assert seen == [("det", "addr:10.0.0.1", 1, {"addr:10.0.0.1": 1}), ("cls", "addr:10.0.0.1"),
                    ("rec", "addr:10.0.0.1")] * 2
    assert gate.used == 0 and gate.held == {} and gate.given == {}
