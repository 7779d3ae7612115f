"""What users send besides the peer images, made from them: tight word and
line crops 10-30 px high, one page at many sizes and aspect ratios. The
engine with its defaults (the detector's closed input ladder)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from harness.in_child import call_in_child
from harness.peer import PEER, tight_line_errors, tight_line_errors_at, tight_lines

# height -> (CER at most, lines read as nothing at most), for fp32 and bf16
# numerics alike. Measured on 2026-12-03 (2 cores of an AMD EPYC with avx512_bf16,
# harness.peer.tight_line_errors_at per precision): CER fp32 / bf16 at
# 10 px 0.152 / 0.139 (4 / 3 empty), 14 px 0.082 / 0.082, 20 px 0.074 / 0.037,
# 30 px 0.004 / 0.004. At 20 px fp32 reads one line as nothing: the
# 28 px-high "www.997788.com中国收症" of paddleocr_00006737.jpg, which bf16
# half reads and every height reads worst.
# (max CER, max crops read as nothing) per height. 14 px: one empty crop allowed since the default set is
# PP-OCRv6 small (v4 read all 12 at 14 px; small leaves one, at bf16 and fp32 alike).
BOUNDS = {10: (0.25, 4), 14: (0.15, 1), 20: (0.10, 1), 30: (0.05, 0)}


@pytest.fixture(scope="module")
def lines() -> list[tuple[np.ndarray, str]]:
    """12 lines the reference read with confidence, cut tight by its boxes."""
    return tight_lines()


def check_tight_lines(errors: int, chars: int, empty: int, height: int, numerics: str) -> None:
    max_cer, max_empty = BOUNDS[height]
    print(f"{height} px ({numerics}): CER {errors / chars:.3f}, {empty} of 12 read nothing")
    assert empty <= max_empty
    assert errors / chars <= max_cer


@pytest.mark.parametrize("height", BOUNDS)
def test_tight_line_crops_are_read_down_to_10_px(engine, lines, height):
    """The session's engine: OpenVINO at bf16 where the CPU has it natively, else fp32."""
    read = lambda img: " ".join(line.text for line in engine.read(img).lines)  # noqa: E731
    check_tight_lines(*tight_line_errors(read, lines, height), height, "the engine's defaults")


@pytest.fixture(scope="module")
def fp32_errors() -> dict:
    """The same at fp32 numerics, which a CPU without bf16 gets by default:
    an engine of its own, in a child process (it keeps ~1 GB after close)."""
    return call_in_child(tight_line_errors_at, "fp32", list(BOUNDS))


@pytest.mark.parametrize("height", BOUNDS)
def test_tight_line_crops_are_read_down_to_10_px_at_fp32(fp32_errors, height):
    check_tight_lines(*fp32_errors[height], height, "fp32")


@pytest.fixture(scope="module")
def page():
    img = cv2.imread(str(PEER / "rapidocr_ch_en_num.jpg"))  # 323 x 430, 18 lines
    return img


@pytest.fixture(scope="module")
def page_lines(engine, page) -> set[str]:
    got = {line.text for line in engine.read(page).lines}
    assert len(got) >= 16
    return got


@pytest.mark.parametrize("long_side, min_same", [(160, 5), (300, 10), (600, 12), (1200, 12), (2400, 11), (4000, 11)])
def test_one_page_at_many_sizes(engine, page, page_lines, long_side, min_same):
    s = long_side / max(page.shape[:2])
    img = cv2.resize(page, (round(page.shape[1] * s), round(page.shape[0] * s)))
    got = [line.text for line in engine.read(img).lines]
    print(f"long side {long_side}: {len(got)} lines, {len(set(got) & page_lines)} as at full size")
    assert len(set(got) & page_lines) >= min_same


@pytest.mark.parametrize("ratio, min_same", [((1, 4), 8), ((4, 1), 10), ((1, 12), 8), ((12, 1), 8)])
def test_one_page_on_odd_aspect_ratios(engine, page, page_lines, ratio, min_same):
    """The page on a white canvas of an extreme shape: read, bounded. A
    1:12 canvas is read in tiles (serve_app.ocr.tiling; shrunk whole
    onto the detector's last rung it read 1-2 of the page's lines)."""
    h, w = page.shape[:2]
    H, W = max(h, w * ratio[0] // ratio[1]), max(w, h * ratio[1] // ratio[0])
    canvas = np.full((H, W, 3), 255, np.uint8)
    canvas[:h, :w] = page
    got = [line.text for line in engine.read(canvas).lines]
    print(f"aspect {ratio} ({W}x{H}): {len(got)} lines, {len(set(got) & page_lines)} as on the page alone")
    assert len(set(got) & page_lines) >= min_same


def read_with(engine, img, **pipeline_options):
    """The engine's reading with other pipeline settings, on the same
    predictors (a second engine would hold ~1 GB more in this process for
    the rest of the session: closing one does not give its memory back)."""
    from serve_app.flow.pipeline import Pipeline

    cfg = engine.config.model_copy(update={"pipeline": engine.config.pipeline.model_copy(update=pipeline_options)})
    return engine._run(Pipeline(engine.pipeline.stages, cfg).read(img)).lines


@pytest.mark.parametrize("name, copies, axis", [("mmocr_wildreceipt_1.jpeg", 6, 0), ("paddleocr_00006737.jpg", 4, 1)])
def test_long_images_are_read_in_tiles(engine, name, copies, axis):
    """A long receipt (six WildReceipt scans stacked: 1600x7200) and a wide
    strip (four boarding passes side by side): read in overlapping tiles
    (serve_app.ocr.tiling), about as many lines as the copies read one
    by one, the same texts, no line read twice at a seam. Shrunk whole onto
    the detector's input they read fewer (v4 a small share; the default
    PP-OCRv6 small reads more of a shrunk strip: 104 of the 121 lines)."""
    one = cv2.imread(str(PEER / name))
    single = [line.text for line in engine.read(one).lines]
    big = np.concatenate([one] * copies, axis=axis)
    got = [line.text for line in engine.read(big).lines]
    shrunk = [line.text for line in read_with(engine, big, tile_aspect=0, fine_text_px=0)]  # one pass, whole
    want = len(single) * copies
    same = sum(min(got.count(t), single.count(t) * copies) for t in set(got))
    print(f"{name} x{copies} {big.shape[1]}x{big.shape[0]}: tiled {len(got)} lines ({same} as read alone), "
          f"untiled {len(shrunk)}, alone {len(single)} x {copies} = {want}")
    assert 0.9 * want <= len(got) <= 1.08 * want
    assert same >= 0.65 * want
    assert len(shrunk) < len(got)


def test_small_text_on_a_large_image_is_detected_again_in_tiles(engine):
    """Two dense pages at 3/4 size, one above the other (1512x506, text
    ~11 px high): shrunk onto the detector's 1280 px, v4 read about 20
    lines (they melt together) and the default PP-OCRv6 small about 250;
    the first pass's small boxes send it through a second detection in a
    grid of tiles at a larger scale (serve_app.ocr.tiling.finer_scale),
    which reads most lines (small: ~440)."""
    page = cv2.imread(str(PEER / "mmocr_demo_densetext_det.jpg"))  # 221 lines alone
    small = cv2.resize(page, None, fx=0.75, fy=0.75, interpolation=cv2.INTER_AREA)
    img = np.concatenate([small, small], axis=0)
    got = engine.read(img).lines
    before = read_with(engine, img, fine_text_px=0)
    print(f"two dense pages at 0.75, {img.shape[1]}x{img.shape[0]}: {len(got)} lines, one pass {len(before)}")
    assert len(got) >= 0.5 * 2 * 221
    assert len(before) < 0.75 * len(got)
