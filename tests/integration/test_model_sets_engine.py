"""Each model set through the in-process engine's command line, real models:
each PP-OCRv6 tier reads a German line's ö and ß exactly and two peer
images, and each set's dictionary writes every language the set lists.
The v6 tiers run in a child process each (`python -m serve_app --model`,
the CLI door): an engine keeps ~1 GB after close, the child's goes back
when it exits. No Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.latin import GERMAN_LINE, LETTERS, line_png
from harness.peer import PEER
from serve_app.core.model_sets import SETS
from serve_app.inference.weights import dictionary_path

REPO = PEER.parents[2]


def cli(model: str, *paths) -> list[dict]:
    """One JSON object per image from `python -m serve_app --model MODEL`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "serve_app", "--model", model, *map(str, paths)], env=env,
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.fixture(scope="module")
def german(tmp_path_factory):
    path = tmp_path_factory.mktemp("latin") / "german.png"
    path.write_bytes(line_png(GERMAN_LINE))
    return path


def text(body: dict) -> str:
    return " ".join(r["text"] for r in body["results"])


@pytest.mark.parametrize("model", ["ppocrv6_small", "ppocrv6_tiny"])
def test_each_v6_tier_reads_a_german_line_and_a_peer_image(model, german):
    got = cli(model, german, PEER / "paddleocr_ger_1.jpg", PEER / "rapidocr_ch_en_num.jpg")
    assert text(got[0]) == GERMAN_LINE
    # the road sign "EPPING / Twinned with Eppingen, Germany"
    assert {"EPPING", "Twinned with", "Eppingen, Germany"} <= {r["text"] for r in got[1]["results"]}
    assert got[2]["results"][0]["text"] == "正品促销"  # the product photo's first line (RapidOCR's own assertion)


def test_the_default_set_reads_the_german_line_and_v4_cannot_write_its_letters(engine, german):
    assert " ".join(line.text for line in engine.read(german).lines) == GERMAN_LINE  # the session's engine: v6 small
    read = text(cli("ppocrv4_mobile", german)[0])
    assert read and "ß" not in read and "ö" not in read


@pytest.mark.parametrize("model", list(SETS))
def test_each_sets_dictionary_writes_the_languages_it_lists(model):
    chars = set(dictionary_path(None, model).read_text(encoding="utf-8").splitlines())
    assert len(chars - {""}) == SETS[model].dictionary.classes
    for lang in SETS[model].languages:
        missing = [c for c in LETTERS[lang] if c not in chars]
        assert not missing, f"{model} lists {lang} but its dictionary lacks {''.join(missing)}"
