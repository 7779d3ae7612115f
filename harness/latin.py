"""Lines of accented Latin text, drawn here (the font the visualizer finds:
DejaVu Sans on this image), and each language's own letters, for the model
set tests (tests/integration/test_model_sets_engine.py, test_light_profile)."""

from __future__ import annotations

import io

# The letters a dictionary must write for a set to list the language
# (serve_app.core.model_sets.ModelSet.languages); punctuation such as
# Spanish ¡ is not counted.
LETTERS = {
    "en": "AZaz09", "zh": "中文汉字", "zh-Hant": "體說這們", "ja": "あいうアイウ",
    "de": "äöüßÄÖÜ", "fr": "éèêëàâîïôûùçœÉÈÀÇ", "es": "ñáéíóúüÑ¿", "pt": "ãõçáéíóúâêôàÃÕ", "it": "àèéìòù",
    "nl": "ëïéè", "pl": "ąćęłńóśźżĄĆĘŁŃÓŚŹŻ", "cs": "čďěňřšťůžýáéíóúČŘŠŽ", "sv": "åäöÅÄÖ", "da": "æøåÆØÅ",
    "no": "æøåÆØÅ", "fi": "äöåÄÖ",
}

GERMAN_LINE = "Königstraße 5, Göttingen"


def line_png(text: str, size: int = 32) -> bytes:
    """`text` in black on white, one line, as PNG bytes."""
    from PIL import Image, ImageDraw, ImageFont

    from serve_app.ocr.visualize import find_font

    path = find_font(None, ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",))
    font = ImageFont.truetype(path, size) if path else ImageFont.load_default()
    img = Image.new("RGB", (int(font.getlength(text)) + 2 * size, 2 * size), "white")
    ImageDraw.Draw(img).text((size, size // 2), text, font=font, fill="black")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()
