"""Document structure through the in-process engine (no cluster), on a page drawn
in code with its truth: a title, a paragraph and a ruled table of known cells.
OcrEngine.read(img, structure=True) must give the regions in reading order with
the right types, every table cell's text at its row and column, the same lines
as a plain read; an engine that never asks never loads the two structure models;
the table recogniser reads a crop alike alone and in a batch; a document's pages
carry their regions; a 1 x 10,000 strip with structure on is refused as without
it (limits.max_aspect), and the thinnest strip allowed answers with no table."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from harness.pdfs import image_pdf, report_pdf

TITLE = "Annual Summary"
PARAGRAPH = ["Revenue grew in each quarter of the year, and margins held.",
             "The table below lists the quarters with their totals."]
ROWS = [["Quarter", "Revenue", "Cost", "Margin"],
        ["First", "410", "300", "110"],
        ["Second", "455", "320", "135"],
        ["Third", "502", "351", "151"],
        ["Fourth", "547", "380", "167"]]


def drawn_page() -> np.ndarray:
    page = np.full((1400, 1000, 3), 255, np.uint8)
    cv2.putText(page, TITLE, (90, 130), cv2.FONT_HERSHEY_DUPLEX, 1.8, (0, 0, 0), 2, cv2.LINE_AA)
    for k, text in enumerate(PARAGRAPH):
        cv2.putText(page, text, (90, 220 + 40 * k), cv2.FONT_HERSHEY_SIMPLEX, 0.85, (0, 0, 0), 1, cv2.LINE_AA)
    x0, y0, cw, rh = 90, 380, 205, 60
    for r, row in enumerate(ROWS):
        for c, text in enumerate(row):
            cv2.putText(page, text, (x0 + c * cw + 18, y0 + r * rh + 40), cv2.FONT_HERSHEY_SIMPLEX, 0.9,
                        (0, 0, 0), 2 if r == 0 else 1, cv2.LINE_AA)
    x1, y1 = x0 + len(ROWS[0]) * cw, y0 + len(ROWS) * rh
    for r in range(len(ROWS) + 1):
        cv2.line(page, (x0, y0 + r * rh), (x1, y0 + r * rh), (0, 0, 0), 2)
    for c in range(len(ROWS[0]) + 1):
        cv2.line(page, (x0 + c * cw, y0), (x0 + c * cw, y1), (0, 0, 0), 2)
    return page


@pytest.fixture(scope="module")
def fresh_engine():
    from serve_app.engine import OcrEngine

    eng = OcrEngine()
    yield eng
    eng.close()


def check_page(regions, lines):
    assert [r.type for r in regions] == ["title", "text", "table"]
    assert [lines[i].text for i in regions[0].lines] == [TITLE]
    assert [lines[i].text for i in regions[1].lines] == PARAGRAPH
    table = regions[2].table
    got = {(c.row, c.col): c.text for c in table.cells}
    want = {(r, c): text for r, row in enumerate(ROWS) for c, text in enumerate(row)}
    assert got == want
    assert all((c.rowspan, c.colspan) == (1, 1) for c in table.cells)
    assert table.html.count("<tr>") == len(ROWS) and table.html.count("<td>") == len(ROWS) * len(ROWS[0])
    assert "<td>Margin</td>" in table.html
    assert sorted(i for r in regions for i in r.lines) == list(range(len(lines)))  # each line in one region


def test_a_drawn_page_reads_as_title_paragraph_and_table_and_structure_loads_only_when_asked(fresh_engine):
    page = drawn_page()
    plain = fresh_engine.read(page)
    assert fresh_engine._structure is None  # a read without structure loaded nothing more
    assert plain.regions is None and "regions" not in plain.to_dict()
    r = fresh_engine.read(page, structure=True)
    assert fresh_engine._structure is not None
    check_page(r.regions, r.lines)
    assert [(x.text, x.box) for x in r.lines] == [(x.text, x.box) for x in plain.lines]
    assert all(x.words is None for x in r.lines)
    d = r.to_dict()
    assert d["regions"][2]["table"]["cells"][5] == {**d["regions"][2]["table"]["cells"][5], "row": 1, "col": 1,
                                                   "text": "410"}


@pytest.mark.parametrize("turn", [cv2.ROTATE_90_CLOCKWISE, cv2.ROTATE_180], ids=["90", "180"])
def test_a_turned_page_is_read_upright_and_its_regions_are_in_its_own_pixels(fresh_engine, turn):
    """A scan fed in sideways or upside down: its lines are read upright
    (page orientation), and so are its layout and table (the models were
    trained on upright pages); the regions' and cells' boxes are in the
    turned page's pixels, around the same lines as upright."""
    page = cv2.rotate(drawn_page(), turn)
    r = fresh_engine.read(page, structure=True)
    assert r.orientation == {cv2.ROTATE_90_CLOCKWISE: 90, cv2.ROTATE_180: 180}[turn]
    check_page(r.regions, r.lines)
    h, w = page.shape[:2]
    for region in r.regions:
        xs, ys = [p[0] for p in region.box], [p[1] for p in region.box]
        assert -2 <= min(xs) and max(xs) <= w + 2 and -2 <= min(ys) and max(ys) <= h + 2, region.box
        for i in region.lines:  # each of its lines' centres inside its box
            cx = sum(p[0] for p in r.lines[i].box) / 4
            cy = sum(p[1] for p in r.lines[i].box) / 4
            assert min(xs) - 5 <= cx <= max(xs) + 5 and min(ys) - 5 <= cy <= max(ys) + 5, (region.type, i)
    cell = next(c for c in r.regions[2].table.cells if c.text == "410")
    cx, cy = sum(p[0] for p in cell.box) / 4, sum(p[1] for p in cell.box) / 4
    line = next(x for x in r.lines if x.text == "410")
    lx, ly = sum(p[0] for p in line.box) / 4, sum(p[1] for p in line.box) / 4
    assert abs(cx - lx) < 60 and abs(cy - ly) < 60  # the cell around its text, in the turned page


def test_the_table_recogniser_reads_a_crop_alike_alone_and_in_a_batch(fresh_engine):
    from serve_app.core.engine_config import StructureOptions
    from serve_app.inference.runners import TableRecognizer

    layout, table = fresh_engine.structure_runners()
    crop = drawn_page()[370:690, 80:920]
    other = np.ascontiguousarray(crop[:, :420])
    batched = TableRecognizer(table.predictor, StructureOptions(table_batch_size=3)).recognize([crop, other, crop])
    alone = table.recognize([crop])[0]
    for s in (batched[0], batched[2]):
        assert s.tokens == alone.tokens
        assert np.abs(s.cells - alone.cells).max() < 1.0
    assert len(alone.cells) == 20
    assert [b.type for b in layout.detect([drawn_page()])[0]].count("table") == 1


def test_a_documents_pages_carry_their_regions(fresh_engine):
    doc = fresh_engine.read_document(image_pdf([drawn_page()]), structure=True)
    page = doc.pages[0]
    check_page(page.regions, page.lines)
    assert "regions" in page.to_dict()


def test_a_born_digital_pdf_read_from_its_text_layer_carries_its_regions(fresh_engine):
    """pdf_text_layer takes the page's own text; with structure the layout
    and table models still read the page's rendering, and the text layer's
    lines are matched into the regions and cells."""
    rows = [["Quarter", "Revenue", "Cost"], ["First", "410", "300"], ["Second", "455", "320"]]
    pdf = report_pdf("Quarterly Report", ["The table below lists the quarters.", "Figures are in thousands."], rows)
    page = fresh_engine.read_document(pdf, structure=True, pdf_text_layer=True).pages[0]
    assert page.source == "text_layer" and "structure" in page.timings_ms
    types = [r.type for r in page.regions]
    assert types[0] == "title" and "table" in types, types
    assert [page.lines[i].text for i in page.regions[0].lines] == ["Quarterly Report"]
    table = next(r for r in page.regions if r.type == "table").table
    assert {(c.row, c.col): c.text for c in table.cells} == {
        (r, c): t for r, row in enumerate(rows) for c, t in enumerate(row)}
    plain = fresh_engine.read_document(pdf, pdf_text_layer=True).pages[0]
    assert plain.regions is None and [x.text for x in plain.lines] == [x.text for x in page.lines]


def test_a_strip_with_structure_on_is_refused_or_answers_without_tables(fresh_engine):
    from serve_app.core.errors import BadImage

    with pytest.raises(BadImage, match="max_aspect"):
        fresh_engine.read(np.full((1, 10_000, 3), 255, np.uint8), structure=True)
    strip = np.full((20, 10_000, 3), 255, np.uint8)  # aspect 500: the most allowed
    cv2.line(strip, (0, 10), (10_000, 10), (0, 0, 0), 1)
    r = fresh_engine.read(strip, structure=True)
    assert r.regions is not None and all(x.type != "table" for x in r.regions)


@pytest.fixture(scope="module")
def layout_copy(tmp_path_factory):
    """A copy of the cached layout conversion (never the cache itself)."""
    import shutil

    from serve_app.inference import weights

    entry = weights.structure_files("layout").program.parent  # "run `make models`" when it is not there
    d = tmp_path_factory.mktemp("layout")
    for f in entry.iterdir():
        shutil.copy(f, d / f.name)
    return d


def test_the_cached_layout_conversion_matches_onnxruntime_and_altered_weights_are_refused(layout_copy, tmp_path):
    import shutil

    from serve_app.tools.conversion_check import PARAMS, ConversionError
    from serve_app.tools.convert_models import SOURCE
    from serve_app.tools.structure_models import verify_layout

    report = verify_layout(layout_copy, layout_copy / SOURCE)
    assert report["fixed_max_abs_diff"] < 1e-3 and report["page_max_abs_diff"] < 1e-3
    assert [r[0] for r in report["page_regions"]] == ["text", "title", "table"]
    bad = tmp_path / "bad"
    shutil.copytree(layout_copy, bad)
    data = bytearray((bad / PARAMS).read_bytes())
    start = (len(data) // 2) & ~3
    w = np.frombuffer(bytes(data[start:start + 400_000]), dtype=np.float32).copy()
    data[start:start + 400_000] = (w * 1.5).astype(np.float32).tobytes()
    (bad / PARAMS).write_bytes(bytes(data))
    with pytest.raises(ConversionError, match=str(bad / PARAMS)):
        verify_layout(bad, bad / SOURCE)
