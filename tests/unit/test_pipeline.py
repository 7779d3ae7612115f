"""The one pipeline (serve_app.pipeline) over stand-in stages: what it sends
each stage, what it answers, and the fan-out split and merge. No Ray, no
models."""

from __future__ import annotations

import asyncio

import cv2
import numpy as np
import pytest

from serve_app.config import EngineConfig
from serve_app.errors import BadImage
from serve_app.options import OcrOptions
from serve_app.pipeline import (
    Pipeline, Stages, assemble, deal_by_width, fan_out_parts, fanned_out, merge_shares, whole_image_box,
)
from serve_app.results import Direction, Recognition
from serve_app.stages.det_preprocess import Geometry


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

    async def detect(self, work, params=None):
        self.seen["det"].append(work.shape)
        self.seen.setdefault("det_params", []).append(params)
        return self.boxes

    async def classify(self, crops):
        self.seen["cls"].append(len(crops))
        return self.directions or [Direction("0", 1.0)] * len(crops)

    async def recognize(self, crops):
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

    async def recognize(crops):
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

    async def recognize(crops):
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
    from serve_app.pipeline import preferred_replica

    hints = []

    async def recognize(crops, part=None):
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
    from serve_app.pipeline import PART_OFFSETS, parse_route_tag, route_tag

    assert route_tag(None) == "whole" and parse_route_tag("whole") is None
    assert parse_route_tag(route_tag((17, 1))) == (17, 1)
    for bad in ("", "part", "part:1", "part:x:1", "part:1:-1", "model:1:2"):
        assert parse_route_tag(bad) is None
    offsets = set()

    async def recognize(crops, part=None):
        offsets.add(part[0])
        return [0] * len(crops)

    crops = [np.zeros((10, w, 3), np.uint8) for w in range(10, 90, 10)]
    for _ in range(300):
        asyncio.run(fanned_out(recognize, 2, 4, tag_parts=True)(crops))
    assert offsets <= set(range(PART_OFFSETS)) and len(offsets) > PART_OFFSETS // 2


def test_a_passed_deadline_stops_the_pipeline_before_its_next_step_and_reaches_the_stages():
    import time

    from serve_app.errors import DeadlineExceeded
    from serve_app.pipeline import current_deadline

    seen = []

    class Slow(Calls):
        async def detect(self, work, params=None):
            seen.append(current_deadline())  # what the Serve pipeline passes on with the detector call
            await asyncio.sleep(0.2)  # the deadline passes while detection runs
            return await super().detect(work, params)

    calls = Slow([BOX_A])
    deadline = time.time() + 0.1
    with pytest.raises(DeadlineExceeded, match="before cropping"):
        asyncio.run(Pipeline(calls.stages(), EngineConfig()).read(png(100, 240), OcrOptions(), deadline))
    assert seen == [deadline] and calls.seen["cls"] == [] and calls.seen["rec"] == []
    with pytest.raises(DeadlineExceeded, match="before decoding"):
        asyncio.run(Pipeline(calls.stages(), EngineConfig()).read(png(100, 240), OcrOptions(), time.time() - 1))
    assert len(read(Calls([BOX_A]), png(100, 240)).lines) == 1  # no deadline: as before


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
    from serve_app.options import DetParams

    calls = Calls([BOX_A, BOX_B])
    assert len(read(calls, png(100, 240)).lines) == 2  # read at 0.9, over the config's 0.5
    assert calls.seen["det_params"] == [DetParams()]
    calls = Calls([BOX_A, BOX_B])
    assert read(calls, png(100, 240), drop_score=0.95, box_thresh=0.7, limit_side_len=640).lines == ()
    assert calls.seen["det_params"] == [DetParams(limit_side_len=640, box_thresh=0.7)]


def test_a_long_image_s_tiles_reach_the_detector_through_a_bounded_window():
    from serve_app.config import PipelineOptions
    from serve_app.stages.tiling import tile_count

    cfg = EngineConfig(pipeline=PipelineOptions(tile_window=3, max_tiles=20))
    total = tile_count(40, 19_000, cfg.pipeline, 1280)

    class Window(Calls):
        """A tile waits in detection until 3 are there (or every tile has
        come): explicit steps, no race of sleeps."""
        active = most = started = 0
        cond = None

        async def detect(self, work, params=None):
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
