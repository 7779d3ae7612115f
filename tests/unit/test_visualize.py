"""serve_app.ocr.visualize: the `visualize` picture is a JPEG of bounded size
with each line's box drawn where the line is, and its text (or, where the
font lacks the glyphs, its number) written in the panel."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from serve_app.core.results import OcrResult, TextLine
from serve_app.ocr.visualize import can_draw, picture_scale, render

BOX = [[40.0, 30.0], [200.0, 30.0], [200.0, 70.0], [40.0, 70.0]]


def decode(vis) -> np.ndarray:
    img = Image.open(io.BytesIO(vis.data))
    assert img.format == "JPEG" and img.size == (vis.width, vis.height)
    return np.asarray(img.convert("RGB")).astype(int)


def changed(a: np.ndarray, region) -> float:
    """Share of pixels in region (x0, y0, x1, y1) that are not (near) white."""
    x0, y0, x1, y1 = region
    patch = a[y0:y1, x0:x1]
    return float((np.abs(patch - 255).max(axis=2) > 40).mean())


def test_boxes_are_drawn_where_the_lines_are_and_nowhere_else():
    white = np.full((100, 300, 3), 255, np.uint8)
    vis = render(white, [TextLine("HELLO", 0.99, BOX)], font_path=None)
    assert vis.media_type == "image/jpeg" and (vis.width, vis.height) == (600, 100)
    a = decode(vis)
    assert changed(a, (50, 38, 190, 62)) > 0.9  # inside the box: tinted
    assert changed(a, (220, 0, 300, 100)) < 0.01 and changed(a, (0, 80, 300, 100)) < 0.01  # outside: untouched
    panel = a[:, 300:]
    assert changed(panel, (42, 32, 198, 68)) > 0.02  # the text is written in the panel's box
    assert changed(panel, (220, 0, 300, 100)) < 0.01


def test_the_picture_is_bounded_and_the_image_never_enlarged():
    big = np.full((3000, 4000, 3), 200, np.uint8)
    vis = render(big, [TextLine("A", 0.9, [[0, 0], [400, 0], [400, 100], [0, 100]])], max_side=1000)
    assert max(vis.width, vis.height) <= 1000 and vis.width == 2 * 500
    decode(vis)
    tall = render(np.zeros((5000, 100, 3), np.uint8), [], max_side=800)
    assert tall.height == 800
    small = render(np.zeros((20, 30, 3), np.uint8), [], max_side=1600)
    assert (small.width, small.height) == (60, 20)
    assert picture_scale(800, 600, 1600) == 1.0


def test_a_line_the_font_cannot_write_gets_its_number_on_both_halves():
    builtin = None  # Pillow's built-in font: Latin only
    assert can_draw("HELLO 123", builtin)
    assert not can_draw("正品促销", builtin) and not can_draw("ABC 正", builtin)
    white = np.full((100, 300, 3), 255, np.uint8)
    lines = [TextLine("正品促销", 0.99, BOX)]
    a = decode(render(white, lines, font_path=builtin))
    assert changed(a[:, 300:], (42, 32, 198, 68)) > 0.01  # the number, in the panel's box
    # The number tag on the image sits at the box's first corner, over the tint.
    assert changed(a, (40, 30, 60, 45)) > 0.5


def test_the_result_body_carries_the_picture_as_base64():
    vis = render(np.zeros((10, 10, 3), np.uint8), [])
    body = OcrResult(10, 10, (), {"total": 1.0}, vis).to_dict()
    import base64

    assert body["visualization"]["media_type"] == "image/jpeg"
    assert base64.b64decode(body["visualization"]["base64"]) == vis.data
    assert "visualization" not in OcrResult(10, 10).to_dict()


def test_a_tilted_line_is_written_along_its_box():
    import math

    a = math.radians(20)
    c, s = math.cos(a), math.sin(a)
    x0, y0, length, height = 40.0, 40.0, 200.0, 30.0
    quad = [[x0, y0], [x0 + length * c, y0 + length * s],
            [x0 + length * c - height * s, y0 + length * s + height * c], [x0 - height * s, y0 + height * c]]
    white = np.full((200, 300, 3), 255, np.uint8)
    panel = decode(render(white, [TextLine("WWWWWWWWWW", 0.9, quad)], font_path=None))[:, 300:]
    # Ink near the box's middle, none in the empty corner the tilt leaves above its right end.
    mx, my = int(x0 + length * c / 2 - height * s / 2), int(y0 + length * s / 2 + height * c / 2)
    assert changed(panel, (mx - 15, my - 6, mx + 15, my + 6)) > 0.1
    assert changed(panel, (200, 20, 290, 70)) < 0.01


def test_the_boxes_picture_is_paddlexs_ocr_image_and_input_image_at_most_2000_px():
    """`visualize: "boxes"` (what PaddleX's /ocr asks): the page with its
    boxes drawn (ocrImage) and the page alone (inputImage), as PaddleX sends
    them: no larger than 2000 px a side."""
    from serve_app.ocr.visualize import render_boxes

    img = np.full((3000, 1000, 3), 255, np.uint8)
    lines = (TextLine("TEST", 0.9, ((83.0, 166.0), (770.0, 164.0), (771.0, 410.0), (84.0, 411.0))),)
    vis = render_boxes(img, lines)
    ocr, inp = decode(vis), decode(vis.input)
    assert ocr.shape == inp.shape == (2000, 666, 3) and (vis.width, vis.height) == (666, 2000)
    assert int(inp.min()) > 200 and int(ocr.min()) < 100  # the boxes are drawn on ocrImage only
    body = vis.to_dict()
    assert body["media_type"] == body["input"]["media_type"] == "image/jpeg" and body["input"]["width"] == 666
    small = render_boxes(np.full((120, 300, 3), 255, np.uint8), lines)
    assert decode(small).shape == (120, 300, 3)  # never enlarged: the image's own size
