"""Words of a recognised line, from its characters: where each word starts
and ends along the line, and its score.

A word is a run of characters between spaces, as in Latin, Cyrillic, Greek
or Korean text. Chinese and Japanese are written without spaces, and telling
their words apart needs a dictionary model this service does not have; so
there, as Tesseract does in its hOCR for chi_sim and jpn, every ideograph,
kana or full-width sign is a word of its own. A run of Latin letters or
digits inside Chinese text ("PP-OCRv4模型") stays one word."""

from __future__ import annotations

import unicodedata
from typing import NamedTuple, Sequence


class WordSpan(NamedTuple):
    text: str
    start: float  # fraction of the line's length where the word starts
    end: float
    score: float  # mean probability of its characters


# Scripts written without spaces between words: each character a word.
_CJK_RANGES = (
    (0x2E80, 0x2FDF),  # CJK radicals, Kangxi radicals
    (0x3000, 0x303F),  # CJK symbols and punctuation
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x31BF),  # Bopomofo
    (0x31C0, 0x31FF),  # CJK strokes, Katakana extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFE30, 0xFE4F),  # CJK compatibility forms
    (0xFF00, 0xFFEF),  # half- and full-width forms
    (0x20000, 0x3134F),  # CJK extensions B-G
)


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def split_words(text: str, spans: Sequence[tuple[float, float]], scores: Sequence[float]) -> list[WordSpan]:
    """Words of `text`, given each character's (start, end) along the line
    and its probability (one of each per character of text, spaces
    included). Spaces separate words and belong to none."""
    if len(spans) != len(text):
        return []
    scores = list(scores) if len(scores) == len(text) else [0.0] * len(text)
    words: list[WordSpan] = []
    run: list[int] = []

    def close() -> None:
        if run:
            words.append(WordSpan("".join(text[i] for i in run), spans[run[0]][0], spans[run[-1]][1],
                                  sum(scores[i] for i in run) / len(run)))
            run.clear()

    for i, ch in enumerate(text):
        if ch.isspace() or unicodedata.category(ch) == "Zs":
            close()
        elif is_cjk(ch):
            close()
            run.append(i)
            close()
        else:
            run.append(i)
    close()
    return words
