"""The answer as text, hOCR and ALTO (serve_app.flow.formats), checked by the
readers people use, not by string comparison alone: ALTO against the
official ALTO 4.4 schema (tests/data/alto, resolved locally), hOCR by
OCRmyPDF's own hOCR parser and the hOCR spec validator (hocr-spec), both as
XML with lxml. No Ray, no models."""

from __future__ import annotations

import pytest
from lxml import etree

from serve_app.core.errors import BadRequest
from serve_app.flow.formats import render
from harness.xml_checks import ALTO, XHTML, alto_schema, hocr_page
from harness.xml_checks import hocr_words as words_of


def quad(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


# A line with word boxes (as `return_words` gives them), one without (its
# words estimated), a Chinese line with a Latin run, and a vertical line.
IMAGE_BODY = {
    "request_id": "r1",
    "image": {"width": 400, "height": 300},
    "results": [
        {"text": "Total due: 42.00", "score": 0.95, "box": quad(10, 10, 210, 40),
         "words": [{"text": "Total", "box": quad(10, 10, 60, 40), "score": 0.99},
                   {"text": "due:", "box": quad(70, 10, 110, 40), "score": 0.9},
                   {"text": "42.00", "box": quad(150, 10, 210, 40), "score": 0.5}]},
        {"text": "no word boxes here", "score": 0.8, "box": quad(10, 60, 190, 90)},
        {"text": "正品促销 PP-OCR", "score": 0.9, "box": quad(10, 100, 250, 130),
         "words": [{"text": "正", "box": quad(10, 100, 30, 130), "score": 0.9},
                   {"text": "品", "box": quad(30, 100, 50, 130), "score": 0.9},
                   {"text": "促", "box": quad(50, 100, 70, 130), "score": 0.9},
                   {"text": "销", "box": quad(70, 100, 90, 130), "score": 0.9},
                   {"text": "PP-OCR", "box": quad(100, 100, 250, 130), "score": 0.8}]},
        {"text": "竖排", "score": 0.9, "box": quad(300, 100, 330, 200)},
    ],
    "timings_ms": {"total": 1.0},
}

DOC_BODY = {
    "request_id": "r2",
    "document": {"type": "pdf", "pages": 2},
    "pages": [
        {"page": 1, "width": 400, "height": 300, "results": IMAGE_BODY["results"][:2], "timings_ms": {}},
        {"page": 2, "width": 200, "height": 100,
         "results": [{"text": "second page", "score": 0.7, "box": quad(5, 5, 150, 30)}], "timings_ms": {}},
    ],
    "timings_ms": {"total": 2.0},
}


def test_text_is_the_lines_in_order_and_pages_split_by_form_feed():
    doc, media = render(IMAGE_BODY, "text")
    assert media == "text/plain; charset=utf-8"
    assert doc == "Total due: 42.00\nno word boxes here\n正品促销 PP-OCR\n竖排\n"
    assert render(DOC_BODY, "text")[0] == "Total due: 42.00\nno word boxes here\n\fsecond page\n"
    assert render({"image": {"width": 5, "height": 5}, "results": []}, "text")[0] == ""


def test_hocr_is_read_by_ocrmypdfs_parser_with_every_word_box_and_confidence(tmp_path):
    doc, media = render(IMAGE_BODY, "hocr")
    assert media.startswith("application/xhtml+xml")
    page = hocr_page(doc, tmp_path)
    assert (page.bbox.left, page.bbox.top, page.bbox.right, page.bbox.bottom) == (0, 0, 400, 300)
    words = words_of(page)
    assert [w.text for w in words] == ["Total", "due:", "42.00", "no", "word", "boxes", "here",
                                       "正", "品", "促", "销", "PP-OCR", "竖", "排"]
    total = words[0]
    assert (total.bbox.left, total.bbox.top, total.bbox.right, total.bbox.bottom) == (10, 10, 60, 40)
    assert [round(w.confidence, 2) for w in words[:3]] == [0.99, 0.9, 0.5]
    # estimated boxes: each word's share of the line's characters, in order, inside the line
    est = words[3:7]
    assert all(10 <= w.bbox.left < w.bbox.right <= 190 and w.bbox.top == 60 for w in est)
    assert [w.bbox.left for w in est] == sorted(w.bbox.left for w in est)
    # the vertical line's words run down the page
    tall = words[-2:]
    assert tall[0].bbox.top < tall[1].bbox.top and all(w.bbox.left >= 300 for w in tall)


def test_hocr_is_well_formed_xhtml_valid_to_the_hocr_spec_and_keeps_the_texts_spacing(tmp_path):
    from hocr_spec.validate import HocrValidator

    doc, _ = render(IMAGE_BODY, "hocr")
    root = etree.fromstring(doc.encode())
    assert root.tag == f"{XHTML}html"
    meta = {m.get("name"): m.get("content") for m in root.iter(f"{XHTML}meta") if m.get("name")}
    from serve_app.core.model_sets import DEFAULT_MODEL, SETS

    # a body that names no set: the default set's languages
    assert meta["ocr-system"].startswith("serve_app PP-OCR ") and meta["ocr-langs"].split() == list(
        SETS[DEFAULT_MODEL].languages)
    assert "ocrx_word" in meta["ocr-capabilities"] and meta["ocr-number-of-pages"] == "1"
    lines = [el for el in root.iter(f"{XHTML}span") if el.get("class") == "ocr_line"]
    assert ["".join(el.itertext()) for el in lines] == [r["text"] for r in IMAGE_BODY["results"]]
    assert "textangle 270" in lines[-1].get("title") and "baseline" in lines[0].get("title")
    path = tmp_path / "doc.hocr"
    path.write_text(doc, encoding="utf-8")
    report = HocrValidator("standard").validate(str(path))
    assert report.is_valid(), [str(i) for i in report.items]


def test_hocr_of_a_document_has_one_ocr_page_per_page(tmp_path):
    from hocr_spec.validate import HocrValidator

    doc, _ = render(DOC_BODY, "hocr")
    root = etree.fromstring(doc.encode())
    pages = [el for el in root.iter(f"{XHTML}div") if el.get("class") == "ocr_page"]
    assert [p.get("title") for p in pages] == ["bbox 0 0 400 300; ppageno 0", "bbox 0 0 200 100; ppageno 1"]
    assert ["".join(p.itertext()).split() for p in pages][1] == ["second", "page"]
    path = tmp_path / "doc.hocr"
    path.write_text(doc, encoding="utf-8")
    assert HocrValidator("standard").validate(str(path)).is_valid()


@pytest.mark.parametrize("body", [IMAGE_BODY, DOC_BODY], ids=["image", "pdf"])
def test_alto_is_valid_against_the_official_alto_4_schema(body):
    doc, media = render(body, "alto")
    assert media.startswith("application/xml")
    tree = etree.fromstring(doc.encode())
    schema = alto_schema()
    assert schema.validate(tree), schema.error_log
    pages = tree.findall(f".//{ALTO}Page")
    assert len(pages) == len(body.get("pages", [body]))


def test_alto_strings_carry_position_confidence_and_spaces_only_where_the_text_has_them():
    tree = etree.fromstring(render(IMAGE_BODY, "alto")[0].encode())
    lines = tree.findall(f".//{ALTO}TextLine")
    first = lines[0]
    assert [(el.tag.split("}")[1], el.get("CONTENT")) for el in first] == [
        ("String", "Total"), ("SP", None), ("String", "due:"), ("SP", None), ("String", "42.00")]
    total = first[0]
    assert {k: total.get(k) for k in ("HPOS", "VPOS", "WIDTH", "HEIGHT", "WC")} == {
        "HPOS": "10", "VPOS": "10", "WIDTH": "50", "HEIGHT": "30", "WC": "0.9900"}
    assert first[3].get("HPOS") == "110" and first[3].get("WIDTH") == "40"  # the gap before "42.00"
    cjk = [(el.tag.split("}")[1], el.get("CONTENT")) for el in lines[2]]
    assert cjk == [("String", "正"), ("String", "品"), ("String", "促"), ("String", "销"), ("SP", None),
                   ("String", "PP-OCR")]


def test_characters_xml_cannot_hold_are_dropped_and_blank_lines_skipped():
    body = {"image": {"width": 100, "height": 50},
            "results": [{"text": "a\x0bb c\x1c", "score": 0.9, "box": quad(1, 1, 90, 20)},
                        {"text": "  ", "score": 0.9, "box": quad(1, 25, 90, 45)}]}
    tree = etree.fromstring(render(body, "alto")[0].encode())
    assert alto_schema().validate(tree)
    assert [s.get("CONTENT") for s in tree.iter(f"{ALTO}String")] == ["ab", "c"]
    etree.fromstring(render(body, "hocr")[0].encode())  # well-formed


def test_json_passes_through_and_an_unknown_format_is_refused():
    import json

    assert json.loads(render(IMAGE_BODY, "json")[0]) == IMAGE_BODY
    with pytest.raises(BadRequest, match="format must be one of json, text, hocr, alto, markdown"):
        render(IMAGE_BODY, "pdf")


# -- blocks (serve_app.ocr.layout): a blank line in text, an ocr_carea and a TextBlock each


BLOCK_BODY = {**IMAGE_BODY, "blocks": [
    {"box": quad(10, 10, 210, 90), "lines": [0, 1]},
    {"box": quad(10, 100, 330, 200), "lines": [2, 3]},
]}


def test_text_separates_blocks_by_a_blank_line():
    assert render(BLOCK_BODY, "text")[0] == "Total due: 42.00\nno word boxes here\n\n正品促销 PP-OCR\n竖排\n"
    doc = {**DOC_BODY, "pages": [{**DOC_BODY["pages"][0], "blocks": [{"box": quad(0, 0, 1, 1), "lines": [0]},
                                                                     {"box": quad(0, 0, 1, 1), "lines": [1]}]},
                                 DOC_BODY["pages"][1]]}
    assert render(doc, "text")[0] == "Total due: 42.00\n\nno word boxes here\n\fsecond page\n"


def test_hocr_has_one_carea_and_par_per_block_with_its_lines():
    root = etree.fromstring(render(BLOCK_BODY, "hocr")[0].encode())
    areas = root.findall(f".//{XHTML}div[@class='ocr_carea']")
    assert len(areas) == 2
    assert areas[0].get("title") == "bbox 10 10 210 90" and areas[1].get("title") == "bbox 10 100 330 200"
    lines = [[s.get("id") for s in a.iter(f"{XHTML}span") if s.get("class") == "ocr_line"] for a in areas]
    assert lines == [["line_1_1", "line_1_2"], ["line_1_3", "line_1_4"]]
    assert len(root.findall(f".//{XHTML}p[@class='ocr_par']")) == 2


def test_alto_has_one_textblock_per_block_and_stays_valid():
    xml = render(BLOCK_BODY, "alto")[0]
    root = etree.fromstring(xml.encode())
    blocks = root.findall(f".//{ALTO}TextBlock")
    assert [(b.get("HPOS"), b.get("VPOS"), b.get("WIDTH"), b.get("HEIGHT")) for b in blocks] == [
        ("10", "10", "200", "80"), ("10", "100", "320", "100")]
    assert [len(b.findall(f"{ALTO}TextLine")) for b in blocks] == [2, 2]
    alto_schema().assertValid(root)


def test_a_line_no_block_holds_still_comes_out():
    body = {**IMAGE_BODY, "blocks": [{"box": quad(10, 10, 210, 40), "lines": [0]}]}
    assert render(body, "text")[0].splitlines() == ["Total due: 42.00", "", "no word boxes here", "正品促销 PP-OCR",
                                                     "竖排"]
    root = etree.fromstring(render(body, "alto")[0].encode())
    assert len(root.findall(f".//{ALTO}TextLine")) == 4


def test_hocr_says_the_languages_of_the_set_that_read_the_body():
    """ocr-langs and ocr-scripts from the body's "model" (the service and
    the CLI name the set): v4 reads Chinese and English, v6 small also
    Japanese and the Latin-script languages of Europe; a set of the user's
    own says none (its languages are the service's config, not the body's)."""
    def meta(model):
        doc, _ = render({**IMAGE_BODY, "model": model}, "hocr")
        root = etree.fromstring(doc.encode())
        return {m.get("name"): m.get("content") for m in root.iter(f"{XHTML}meta") if m.get("name")}

    v4, v6 = meta("ppocrv4_mobile"), meta("ppocrv6_small")
    assert (v4["ocr-langs"], v4["ocr-scripts"]) == ("zh en", "Hans Latn")
    assert {"ja", "de", "fr"} <= set(v6["ocr-langs"].split()) and v6["ocr-scripts"] == "Hans Hant Latn Jpan"
    own = meta("invoices")
    assert "ocr-langs" not in own and "ocr-scripts" not in own and own["ocr-number-of-pages"] == "1"
