"""Per-request options (serve_app.core.request_options): parsed once, at the edge, into a
frozen OcrOptions; a bad option is a 400 naming it. No Ray."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from serve_app.core.errors import BadRequest
from serve_app.core.request_options import FIELDS, DetParams, OcrOptions, parse_options, with_format


def test_none_and_empty_give_the_defaults():
    assert parse_options(None) == parse_options({}) == OcrOptions(det=True, cls=None, return_chars=False)


def test_a_dict_is_parsed_and_an_options_object_passes_through():
    opts = parse_options({"det": False, "cls": True, "return_chars": True})
    assert opts == OcrOptions(det=False, cls=True, return_chars=True)
    assert parse_options(opts) is opts


def test_options_are_frozen_and_round_trip_through_a_dict_and_pickle():
    opts = OcrOptions(cls=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.det = False  # type: ignore[misc]
    assert opts.to_dict() == {"det": True, "cls": False, "return_chars": False, "return_words": False,
                              "format": "json", "limit_side_len": None, "thresh": None, "box_thresh": None,
                              "unclip_ratio": None, "drop_score": None,
                              "visualize": False, "pdf_text_layer": False, "page_orientation": None, "blocks": None,
                              "priority": None, "model": None, "structure": False}
    assert parse_options(opts.to_dict()) == opts
    assert pickle.loads(pickle.dumps(opts)) == opts  # how it travels to the pipeline and the job store


@pytest.mark.parametrize("options,needle", [
    ({"nope": 1}, "bad option nope"),
    ({"det": "maybe"}, "bad option det"),
    ({"cls": [1]}, "bad option cls"),
    ([("det", False)], "options must be an object, got list"),
    ("det=false", "options must be an object, got str"),
])
def test_bad_options_are_400_naming_the_option(options, needle):
    with pytest.raises(BadRequest) as e:
        parse_options(options)
    assert needle in e.value.message and e.value.status == 400
    if "bad option" in needle:
        assert f"(allowed: {', '.join(FIELDS)})" in e.value.message and "det, cls, return_chars" in e.value.message


@pytest.mark.parametrize("field,value,range_", [
    ("limit_side_len", 16, "[32, 4096]"), ("limit_side_len", 5000, "[32, 4096]"),
    ("thresh", 0, "(0, 1)"), ("thresh", 1.0, "(0, 1)"), ("box_thresh", 1.5, "(0, 1)"),
    ("box_thresh", float("nan"), "(0, 1)"), ("unclip_ratio", 0.1, "[0.5, 5]"), ("unclip_ratio", "wide", "[0.5, 5]"),
    ("drop_score", -0.1, "[0, 1]"), ("drop_score", 1.01, "[0, 1]"),
])
def test_detection_options_out_of_bounds_are_400_naming_field_and_range(field, value, range_):
    with pytest.raises(BadRequest) as e:
        parse_options({field: value})
    assert e.value.message.startswith(f"bad option {field}: ") and f"{field} must be" in e.value.message
    assert range_ in e.value.message and e.value.status == 400


def test_detection_options_within_bounds_are_taken():
    opts = parse_options({"limit_side_len": 960, "thresh": 0.2, "box_thresh": 0.7, "unclip_ratio": 2.0,
                          "drop_score": 0.8})
    assert (opts.limit_side_len, opts.thresh, opts.box_thresh, opts.unclip_ratio, opts.drop_score) == (
        960, 0.2, 0.7, 2.0, 0.8)
    assert opts.det_params() == DetParams(960, 0.2, 0.7, 2.0)


def test_format_is_one_of_four_and_word_formats_ask_for_word_boxes():
    assert parse_options({"format": "alto"}).format == "alto"
    with pytest.raises(BadRequest, match="format is one of json, text, hocr, alto, markdown"):
        parse_options({"format": "pdf"})
    with pytest.raises(BadRequest, match="query parameter format"):
        with_format(OcrOptions(), "xml")
    assert with_format(OcrOptions(format="text"), "hocr").format == "hocr"  # the query wins
    assert with_format(OcrOptions(format="text"), None).format == "text"
    assert OcrOptions(format="hocr").for_pipeline().return_words
    assert OcrOptions(format="alto").for_pipeline().return_words
    assert not OcrOptions(format="text").for_pipeline().return_words


def test_a_limit_side_len_keeps_the_detector_on_its_closed_ladder():
    """Under the "ladder" policy a request's limit only drops rungs: every
    input shape it can give is one of the warmed set."""
    from serve_app.core.engine_config import DetOptions
    from serve_app.ocr.det_preprocess import det_input_shapes, det_layout

    ladder = DetOptions()  # rungs 640, 960, 1280
    assert DetParams(1000).apply(ladder).side_ladder == [640, 960]
    assert DetParams(1280).apply(ladder).side_ladder == [640, 960, 1280]
    assert DetParams(100).apply(ladder).side_ladder == [640]  # below the first rung: the first
    assert DetParams().apply(ladder) is ladder
    warmed = set(det_input_shapes(ladder))
    for limit in (32, 700, 960, 1100, 4096):
        opts = DetParams(limit).apply(ladder)
        for h, w in [(3000, 2000), (500, 4000), (40, 200), (1000, 1000), (1300, 100)]:
            assert det_layout(h, w, opts)[1] in warmed, (limit, h, w)
        assert max(det_layout(3000, 2000, opts)[1]) == max(r for r in ladder.side_ladder if r <= max(limit, 640))
    open_max = DetOptions(limit_type="max", limit_side_len=960)
    assert DetParams(736).apply(open_max).limit_side_len == 736
    assert DetParams(box_thresh=0.7, thresh=0.2, unclip_ratio=2.0).apply(ladder).model_dump(
        include={"box_thresh", "thresh", "unclip_ratio"}) == {"box_thresh": 0.7, "thresh": 0.2, "unclip_ratio": 2.0}
