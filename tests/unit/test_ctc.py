"""Recognition stage: dictionary loading, CTC decoding, batch widths and the
recogniser's pre-processing."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.core.engine_config import RecOptions
from serve_app.ocr.recognition import (
    batch_limit, batch_width, ctc_decode, input_shapes as rec_input_shapes, load_charset, rec_preprocess, width_order,
)
from serve_app.core.results import Recognition

CHARSET = ["blank", "a", "b", "c", " "]


def sequence(indices: list[int], probs: list[float], classes: int = len(CHARSET)) -> np.ndarray:
    """T x C probabilities: `probs[t]` on `indices[t]`, the rest shared out
    evenly over the other classes (each well below the chosen one)."""
    assert len(indices) == len(probs)
    out = np.empty((len(indices), classes), dtype=np.float32)
    for t, (i, p) in enumerate(zip(indices, probs)):
        out[t] = (1.0 - p) / (classes - 1)
        out[t, i] = p
    return out


def decode_one(indices, probs) -> Recognition:
    (rec,) = ctc_decode(sequence(indices, probs)[None], CHARSET)
    return rec


# --- ctc_decode ---------------------------------------------------------------


def test_repeats_are_merged_and_blanks_dropped():
    rec = decode_one([1, 1, 1, 0, 2, 2, 3], [0.9, 0.8, 0.7, 0.99, 0.6, 0.5, 0.7])
    assert rec.text == "abc"
    # Kept steps: the first of each run of a non-blank label (t = 0, 4, 6).
    assert rec.score == pytest.approx((0.9 + 0.6 + 0.7) / 3, rel=1e-6)


def test_a_character_repeated_across_a_blank_is_kept_twice():
    rec = decode_one([1, 0, 1], [0.8, 0.9, 0.6])
    assert rec.text == "aa"
    assert rec.score == pytest.approx(0.7, rel=1e-6)
    # Without the blank it is one character.
    assert decode_one([1, 1], [0.8, 0.6]).text == "a"


def test_leading_and_trailing_blanks_do_not_count_in_the_score():
    rec = decode_one([0, 0, 2, 0, 0], [0.99, 0.99, 0.5, 0.99, 0.99])
    assert rec.text == "b"
    assert rec.score == pytest.approx(0.5, rel=1e-6)


def test_all_blank_reads_as_empty_with_score_zero():
    rec = decode_one([0, 0, 0, 0], [0.9, 0.9, 0.9, 0.9])
    assert (rec.text, rec.score) == ("", 0.0)
    assert isinstance(rec, Recognition)


def test_space_is_the_last_label():
    rec = decode_one([1, 4, 2], [0.9, 0.9, 0.9])
    assert rec.text == "a b"


def test_each_row_of_a_batch_is_decoded_on_its_own():
    probs = np.stack(
        [
            sequence([3, 3, 0, 1], [0.9, 0.9, 0.9, 0.5]),
            sequence([0, 0, 0, 0], [0.9, 0.9, 0.9, 0.9]),
            sequence([2, 0, 2, 2], [0.6, 0.9, 0.8, 0.1 + 0.7]),
        ]
    )
    recs = ctc_decode(probs, CHARSET)
    assert [r.text for r in recs] == ["ca", "", "bb"]
    assert recs[0].score == pytest.approx(0.7, rel=1e-6)
    assert recs[1].score == 0.0
    assert recs[2].score == pytest.approx(0.7, rel=1e-6)


def test_decode_uses_the_argmax_not_the_first_large_value():
    # Step 0: 'a' 0.4, 'c' 0.6 -> 'c'.
    probs = np.array([[[0.0, 0.4, 0.0, 0.6, 0.0]]], dtype=np.float32)
    (rec,) = ctc_decode(probs, CHARSET)
    assert rec.text == "c"
    assert rec.score == pytest.approx(0.6, rel=1e-6)


# --- load_charset ------------------------------------------------------------


def test_load_charset_puts_blank_first_and_space_last(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("a\nb\n中\n", encoding="utf-8")
    assert load_charset(path) == ["blank", "a", "b", "中", " "]
    assert load_charset(path, use_space_char=False) == ["blank", "a", "b", "中"]


def test_load_charset_strips_windows_line_endings(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_bytes(b"x\r\ny\r\n")
    assert load_charset(path, use_space_char=False) == ["blank", "x", "y"]


def test_load_charset_keeps_a_space_entry_of_the_dictionary(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("a\n \nb\n", encoding="utf-8")
    assert load_charset(path, use_space_char=False) == ["blank", "a", " ", "b"]


def test_load_charset_splits_on_newlines_only(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("a\n\u2028\nb\n", encoding="utf-8")
    assert load_charset(path, use_space_char=False) == ["blank", "a", "\u2028", "b"]


# --- batch_width ---------------------------------------------------------------


def test_batch_width_is_at_least_image_width():
    opts = RecOptions()
    assert batch_width([0.5], opts) == 320
    assert batch_width([2.0, 6.0], opts) == 320
    # 320 / 48 exactly
    assert batch_width([320 / 48], opts) == 320


def test_batch_width_rounds_up_to_the_ladder():
    opts = RecOptions()  # default ladder 320, 384, 448, 512, 576, 640, 768, ...
    assert batch_width([384 / 48], opts) == 384  # on a rung: unchanged
    assert batch_width([10.0], opts) == 512  # 480 -> 512
    assert batch_width([1.0, 13.4, 3.0], opts) == 768  # the widest ratio decides: 643 -> 768
    assert batch_width([10.0], RecOptions(width_ladder=[320, 500, 900], max_width=900)) == 500


def test_batch_width_without_a_ladder_rounds_up_to_the_bucket():
    opts = RecOptions(width_ladder=[])
    assert batch_width([10.0], opts) == 480  # 480 is a multiple of 32
    assert batch_width([10.1], opts) == 512  # int(484.8) = 484 -> 512
    assert batch_width([1.0, 10.1, 3.0], opts) == 512  # the widest ratio decides
    assert batch_width([10.1], RecOptions(width_ladder=[], width_bucket=1)) == 484
    assert batch_width([10.1], RecOptions(width_ladder=[], width_bucket=100)) == 500


def test_batch_width_is_capped_at_max_width():
    assert batch_width([100.0], RecOptions()) == 3200  # past the last rung: squeezed to it
    assert batch_width([60.0], RecOptions()) == 3200  # 2880 -> 3200
    assert batch_width([50.0], RecOptions()) == 2560  # 2400 -> 2560
    assert batch_width([66.0], RecOptions(width_ladder=[])) == 3168  # 3168 = 99 * 32, under the cap
    assert batch_width([67.0], RecOptions(width_ladder=[])) == 3200  # 3216 -> capped
    assert batch_width([20.0], RecOptions(width_ladder=[], max_width=400)) == 400


def test_width_ladder_is_validated():
    for bad in ([320, 320], [640, 480], [200, 480], [320, 4000]):
        with pytest.raises(ValueError, match="width_ladder"):
            RecOptions(width_ladder=bad)


def test_batch_limit_keeps_wide_batches_under_the_column_budget():
    opts = RecOptions()  # batch_size 6, batch_columns 6144
    assert [batch_limit(w, opts) for w in (320, 1024, 1280, 2048, 2560, 3200)] == [6, 6, 4, 3, 2, 1]
    assert batch_limit(3200, RecOptions(batch_columns=100)) == 1  # always at least one crop


def test_input_shapes_are_every_batch_size_at_every_rung():
    opts = RecOptions(width_ladder=[320, 1280, 3200])
    assert rec_input_shapes(opts) == [(n, 320) for n in range(1, 7)] + [(n, 1280) for n in range(1, 5)] + [(1, 3200)]
    assert len(rec_input_shapes(RecOptions())) == 71


# --- rec_preprocess ----------------------------------------------------------------


def test_rec_preprocess_resizes_to_height_48_normalises_and_pads_with_zeros():
    crop = np.zeros((20, 100, 3), dtype=np.uint8)
    crop[..., 0] = 0  # B
    crop[..., 1] = 255  # G
    crop[..., 2] = 51  # R
    out = rec_preprocess(crop, 320, RecOptions())
    assert out.shape == (3, 48, 320)
    assert out.dtype == np.float32
    rw = 240  # ceil(48 * 100 / 20)
    np.testing.assert_allclose(out[0, :, :rw], -1.0)
    np.testing.assert_allclose(out[1, :, :rw], 1.0)
    np.testing.assert_allclose(out[2, :, :rw], 51 / 255 * 2 - 1, atol=1e-6)
    assert np.all(out[:, :, rw:] == 0.0)
    assert out.min() >= -1.0 and out.max() <= 1.0


def test_rec_preprocess_squeezes_crops_wider_than_the_batch_width():
    rng = np.random.default_rng(0)
    crop = rng.integers(0, 256, (10, 100, 3), dtype=np.uint8)  # needs 480 at height 48
    out = rec_preprocess(crop, 320, RecOptions())
    assert out.shape == (3, 48, 320)
    # No padding column: the last column holds image data, not zeros.
    assert np.any(out[:, :, -1] != 0.0)
    assert out.min() >= -1.0 and out.max() <= 1.0


def test_rec_preprocess_of_a_tiny_crop_keeps_one_column():
    crop = np.full((48, 1, 3), 255, dtype=np.uint8)
    out = rec_preprocess(crop, 320, RecOptions())
    np.testing.assert_allclose(out[:, :, 0], 1.0)
    assert np.all(out[:, :, 1:] == 0.0)


def test_width_order_sorts_by_aspect_ratio_stably():
    crops = [np.zeros((10, w, 3), np.uint8) for w in (50, 20, 50, 10)]
    assert width_order(crops) == [3, 1, 0, 2]


# --- the recogniser's use of ctc_decode ------------------------------------------


def test_text_recognizer_batches_by_width_and_maps_results_back():
    from harness.fakes import StandInPredictor
    from serve_app.inference.runners import TextRecognizer

    probs = np.stack([sequence([1, 0, 2], [0.9, 0.9, 0.9]), sequence([3, 3, 0], [0.8, 0.8, 0.8])])
    predictor = StandInPredictor(probs, name="rec")
    recognizer = TextRecognizer(predictor, RecOptions(), CHARSET)
    crops = [np.zeros((20, 60, 3), np.uint8), np.zeros((20, 40, 3), np.uint8)]
    recs = recognizer.recognize(crops)
    assert predictor.inputs[0].shape == (2, 3, 48, 320)
    # Crops are batched narrowest first: crop 1 gets row 0 of the output.
    assert [r.text for r in recs] == ["c", "ab"]
