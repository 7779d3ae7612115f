"""Words from a line's characters (serve_app.ocr.words) and the word
boxes the pipeline makes from them. No Ray, no models."""

from __future__ import annotations

import asyncio

import numpy as np

from serve_app.core.engine_config import EngineConfig
from serve_app.core.request_options import OcrOptions
from serve_app.flow.pipeline import Pipeline, Stages
from serve_app.core.results import Recognition
from serve_app.ocr.words import split_words


def spans(n):
    return [(i / n, (i + 1) / n) for i in range(n)]


def test_latin_words_are_runs_between_spaces_with_their_extent_and_mean_score():
    text = "Hello, big world"
    scores = [0.9] * 6 + [0.5] + [0.6, 0.8, 1.0] + [0.5] + [0.7] * 5
    words = split_words(text, spans(len(text)), scores)
    assert [w.text for w in words] == ["Hello,", "big", "world"]
    assert words[0].start == 0 and abs(words[0].end - 6 / 16) < 1e-9
    assert abs(words[1].start - 7 / 16) < 1e-9 and abs(words[1].end - 10 / 16) < 1e-9
    assert abs(words[1].score - 0.8) < 1e-9
    assert words[2].end == 1.0


def test_each_chinese_or_japanese_character_is_a_word_and_latin_runs_stay_whole():
    text = "PP-OCRv4模型，カナ 2024年"
    words = split_words(text, spans(len(text)), [1.0] * len(text))
    assert [w.text for w in words] == ["PP-OCRv4", "模", "型", "，", "カ", "ナ", "2024", "年"]


def test_korean_is_split_on_spaces_like_latin():
    assert [w.text for w in split_words("안녕 세계", spans(5), [1.0] * 5)] == ["안녕", "세계"]


def test_mismatched_spans_give_no_words_rather_than_wrong_ones():
    assert split_words("abc", spans(2), [1.0] * 3) == []
    assert split_words("", [], []) == []


class OneLine:
    def __init__(self, text):
        self.text = text

    async def detect(self, work, params=None, ctx=None):
        return np.array([[[10, 10], [210, 10], [210, 40], [10, 40]]], np.float32)

    async def recognize(self, crops, ctx=None):
        n = len(self.text)
        return [Recognition(self.text, 0.9, tuple(spans(n)), tuple([0.9] * n))]


def read(text, **opts):
    stages = OneLine(text)
    img = np.full((100, 240, 3), 255, np.uint8)
    return asyncio.run(Pipeline(Stages(stages.detect, None, stages.recognize), EngineConfig()).read(
        img, OcrOptions(**opts)))


def test_pipeline_words_lie_along_the_line_box_and_come_only_when_asked():
    line = read("ab cd").lines[0]
    assert line.words is None and "words" not in line.to_dict()
    line = read("ab cd", return_words=True).lines[0]
    d = line.to_dict()["words"]
    assert [w["text"] for w in d] == ["ab", "cd"] and all(w["score"] == 0.9 for w in d)
    (x0, y0), (x1, _), (_, y2), _ = d[0]["box"]
    (u0, _), (u1, _), _, _ = d[1]["box"]
    assert x0 == 10 and abs(x1 - 90) < 0.2 and y0 == 10 and y2 == 40  # first 2 of 5 character spans
    assert abs(u0 - 130) < 0.2 and u1 == 210  # the space between them belongs to neither


def test_hocr_and_alto_formats_ask_the_pipeline_for_words():
    assert read("ab cd", format="hocr").lines[0].words is None  # Pipeline.read takes options as given
    assert read("ab cd", **{**OcrOptions(format="alto").for_pipeline().to_dict()}).lines[0].words
