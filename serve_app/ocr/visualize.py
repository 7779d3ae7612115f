"""The one drawer of an OCR result's picture, two styles:
- `visualize: true` ("panels"): on the left the image with each line's box
  tinted and outlined, on the right a white panel with each line's text
  written where its box is (`render`);
- `visualize: "boxes"`: PaddleX's `ocrImage` (the image itself with the line
  boxes drawn on it) and `inputImage` (the image as read), `render_boxes`.
Both are drawn by the pipeline from the image it decoded (nothing decodes an
upload a second time to draw it).

Bounded: the picture (both halves) is scaled so that its longest side is at
most `max_side` pixels (never enlarged; "boxes": PaddleX's 2000), and
encoded as JPEG. The memory it takes is that of the scaled copies, at most
max_side squared pixels each, whatever the image's size (which the pixel
limit bounds before the pipeline decodes it).

Fonts. Chinese needs a font with CJK glyphs, and none ships in this
project's Python dependencies (Pillow's built-in font and matplotlib's
DejaVu are Latin, Greek and Cyrillic). So the font is looked for, never
required: the configured one, then the CJK fonts Debian's packages install
(fonts-noto-cjk, fonts-wqy-microhei, fonts-wqy-zenhei,
fonts-droid-fallback), then DejaVu Sans, then Pillow's built-in. A line whose
characters the font found cannot all draw gets its number instead (on both
halves, the same number: its 1-based index in `results`), so the picture
never shows empty boxes for text it could not write; the text itself is in
the JSON. Pure: numpy, OpenCV and PIL; no Ray."""

from __future__ import annotations

import io
import math
import os
from dataclasses import replace
from functools import lru_cache
from typing import Any, Optional, Sequence, Union

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from serve_app.core.results import TextLine, Visualization

MAX_SIDE = 1600
BOXES_MAX_SIDE = 2000  # PaddleX's DEFAULT_MAX_OUTPUT_IMG_SIZE (2000, 2000)
JPEG_QUALITY = 80
FONT_CANDIDATES = (
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/truetype/droid/DroidSansFallbackFull.ttf",
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
)
# Distinct, readable on white and on photos (RGB).
PALETTE = ((230, 25, 75), (60, 140, 60), (0, 110, 200), (245, 130, 48), (145, 30, 180), (0, 150, 150),
           (200, 40, 160), (128, 100, 0), (70, 70, 200), (170, 60, 40))
# A code point no font maps: what the font draws for a missing glyph.
_UNMAPPED = "\U0010fffd"


def find_font(preferred: Optional[str] = None, candidates: Sequence[str] = FONT_CANDIDATES) -> Optional[str]:
    """The first font file that exists: `preferred`, then the candidates;
    None: Pillow's built-in font."""
    for path in ((preferred,) if preferred else ()) + tuple(candidates):
        if os.path.isfile(path):
            return path
    return None


@lru_cache(maxsize=64)
def _font(path: Optional[str], size: int) -> ImageFont.FreeTypeFont:
    if path is None:
        return ImageFont.load_default(size)
    return ImageFont.truetype(path, size, layout_engine=ImageFont.Layout.BASIC)


@lru_cache(maxsize=8192)
def _has_glyph(path: Optional[str], ch: str) -> bool:
    font = _font(path, 24)
    missing = font.getmask(_UNMAPPED)
    mask = font.getmask(ch)
    return mask.size != missing.size or bytes(mask) != bytes(missing)


def can_draw(text: str, font_path: Optional[str]) -> bool:
    """Whether the font has a glyph for every visible character of `text`."""
    return all(_has_glyph(font_path, ch) for ch in set(text) if not ch.isspace())


def picture_scale(width: int, height: int, max_side: int) -> float:
    """The scale of the image in the picture (two images wide)."""
    return min(1.0, max_side / max(2 * width, height))


def render(image_bgr: np.ndarray, lines: Sequence[TextLine], max_side: int = MAX_SIDE,
           font_path: Optional[str] = None, quality: int = JPEG_QUALITY) -> Visualization:
    """The picture (JPEG) of `lines` read from `image_bgr` (HxWx3, BGR)."""
    h, w = image_bgr.shape[:2]
    s = picture_scale(w, h, max_side)
    sw, sh = max(1, round(w * s)), max(1, round(h * s))
    small = cv2.resize(image_bgr, (sw, sh), interpolation=cv2.INTER_AREA) if s < 1 else image_bgr
    left = Image.fromarray(cv2.cvtColor(small, cv2.COLOR_BGR2RGB))
    right = Image.new("RGB", (sw, sh), "white")
    tint = Image.new("RGBA", (sw, sh), (0, 0, 0, 0))
    tint_draw, left_draw, right_draw = ImageDraw.Draw(tint), ImageDraw.Draw(left), ImageDraw.Draw(right)
    outline = max(1, round(min(sw, sh) / 400))
    for i, line in enumerate(lines):
        color = PALETTE[i % len(PALETTE)]
        quad = [(float(x) * s, float(y) * s) for x, y in line.box]
        tint_draw.polygon(quad, fill=color + (70,))
        left_draw.polygon(quad, outline=color, width=outline)
        right_draw.polygon(quad, outline=color, width=outline)
        if can_draw(line.text, font_path):
            _write(right, line.text, quad, font_path, (20, 20, 20))
        else:
            _write(right, str(i + 1), quad, font_path, color)
    left = Image.alpha_composite(left.convert("RGBA"), tint).convert("RGB")
    # Composited after the tint so that number tags stay opaque.
    for i, line in enumerate(lines):
        if not can_draw(line.text, font_path):
            color = PALETTE[i % len(PALETTE)]
            _tag(ImageDraw.Draw(left), str(i + 1), (float(line.box[0][0]) * s, float(line.box[0][1]) * s),
                 font_path, color)
    out = Image.new("RGB", (2 * sw, sh), "white")
    out.paste(left, (0, 0))
    out.paste(right, (sw, 0))
    buf = io.BytesIO()
    out.save(buf, "JPEG", quality=quality, optimize=True)
    return Visualization("image/jpeg", buf.getvalue(), out.width, out.height)


def render_boxes(image_bgr: np.ndarray, lines: Sequence[TextLine],
                 max_side: int = BOXES_MAX_SIDE) -> Visualization:
    """PaddleX's ocrImage (the line boxes drawn on the image) with its
    inputImage (`.input`: the image alone), as JPEGs no larger than
    `max_side` pixels a side, as PaddleX sends them."""
    h, w = image_bgr.shape[:2]
    f = min(1.0, max_side / max(h, w))
    small = cv2.resize(image_bgr, (max(1, int(w * f)), max(1, int(h * f)))) if f < 1.0 else image_bgr
    drawn = small.copy()
    for line in lines:
        quad = np.round(np.asarray(line.box, dtype=np.float64) * f).astype(np.int32)
        cv2.polylines(drawn, [quad], True, (0, 200, 0), 2)

    def jpeg(img: np.ndarray) -> Visualization:
        ok, buf = cv2.imencode(".jpg", img)
        return Visualization("image/jpeg", buf.tobytes(), img.shape[1], img.shape[0])

    return replace(jpeg(drawn), input=jpeg(small))


def _sides(quad: list[tuple[float, float]]) -> tuple[float, float]:
    (x0, y0), (x1, y1), _, (x3, y3) = quad
    return math.hypot(x1 - x0, y1 - y0), math.hypot(x3 - x0, y3 - y0)


def _write(panel: Image.Image, text: str, quad: list[tuple[float, float]], font_path: Optional[str],
           color: tuple[int, int, int]) -> None:
    """`text` fitted into the quad: along it (turned with it when the line
    is tilted), or one character per row for a vertical line."""
    draw = ImageDraw.Draw(panel)
    along, across = _sides(quad)
    if across > 1.5 * along and len(text) > 1:  # vertical
        x0, y0 = min(p[0] for p in quad), min(p[1] for p in quad)
        size = max(6, int(min(along * 0.85, across / len(text))))
        font = _font(font_path, size)
        for k, ch in enumerate(text):
            draw.text((x0 + along * 0.08, y0 + k * size), ch, fill=color, font=font)
        return
    size = max(6, int(across * 0.8))
    font = _font(font_path, size)
    width = draw.textlength(text, font=font)
    if width > along > 0:
        size = max(6, int(size * along / width))
        font = _font(font_path, size)
        width = draw.textlength(text, font=font)
    # From the middle of the box's left side, along its top edge's direction.
    (ax, ay), (bx, by), _, (dx, dy) = quad
    lx, ly = (ax + dx) / 2 + 1, (ay + dy) / 2
    angle = math.atan2(by - ay, bx - ax)
    if abs(math.degrees(angle)) < 2:
        draw.text((lx, ly), text, fill=color, font=font, anchor="lm")
        return
    w, h = int(math.ceil(width)) + 2, int(size * 1.4) + 2
    tile = Image.new("L", (w, h), 0)
    ImageDraw.Draw(tile).text((1, h / 2), text, fill=255, font=font, anchor="lm")
    tile = tile.rotate(-math.degrees(angle), resample=Image.BICUBIC, expand=True)
    cx, cy = lx + math.cos(angle) * w / 2, ly + math.sin(angle) * w / 2
    x, y = round(cx - tile.width / 2), round(cy - tile.height / 2)
    panel.paste(color, (x, y, x + tile.width, y + tile.height), tile)


def _tag(draw: ImageDraw.ImageDraw, number: str, at: tuple[float, float], font_path: Optional[str],
         color: tuple[int, int, int]) -> None:
    size = max(11, int(min(draw.im.size) / 40))
    font = _font(font_path, size)
    x0, y0, x1, y1 = draw.textbbox(at, number, font=font)
    pad = max(1, size // 6)
    draw.rectangle((x0 - pad, y0 - pad, x1 + pad, y1 + pad), fill=color)
    draw.text(at, number, fill="white", font=font)


def draw_result(img: np.ndarray, lines: tuple[TextLine, ...], opts: Any,
                style: Union[bool, str] = True) -> Visualization:
    """The `visualize` picture of one read image (`opts`: PipelineOptions), from
    the image the pipeline decoded: "boxes" is PaddleX's ocrImage, else the
    two panels."""
    if style == "boxes":
        return render_boxes(img, lines)
    return render(img, lines, opts.visualize_max_side, find_font(opts.visualize_font))
