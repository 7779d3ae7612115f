"""Per-request options (serve_app.options): parsed once, at the edge, into a
frozen OcrOptions; a bad option is a 400 naming it. No Ray."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from serve_app.errors import BadRequest
from serve_app.options import FIELDS, OcrOptions, parse_options


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
    assert opts.to_dict() == {"det": True, "cls": False, "return_chars": False, "pdf_text_layer": False}
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
