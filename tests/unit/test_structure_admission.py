"""Admission prices document structure (serve_app.http.policies.cost, admission):
per page its layout, per table region its recognition (tables_per_page at
the door, the regions the answer had when it is drained); a read without
structure is priced as before. No Ray."""

from __future__ import annotations

import pytest

from serve_app.core.app_args import AdmissionArgs
from serve_app.core.errors import Overloaded
from serve_app.core.request_options import OcrOptions
from serve_app.http.policies.admission import Admission, count_tables
from serve_app.http.policies.cost import Size

ARGS = AdmissionArgs()
PAGE = Size(1_000_000, width=1000, height=1000)


def test_structure_is_priced_per_page_and_per_table_region_and_nothing_without_it():
    adm = Admission(ARGS)
    plain = adm.model.estimate(PAGE.with_options(OcrOptions()))
    asked = adm.model.estimate(PAGE.with_options(OcrOptions(structure=True)))
    assert asked == pytest.approx(plain + ARGS.s_per_structure_page + ARGS.s_per_table * ARGS.tables_per_page)
    assert PAGE.with_options(OcrOptions(format="markdown")).structure  # markdown implies it
    assert not PAGE.with_options(OcrOptions(format="text")).structure
    doc = Size(1_000_000, pages=3)
    assert adm.model.estimate(doc.with_options(OcrOptions(structure=True))) == pytest.approx(
        adm.model.estimate(doc.with_options(OcrOptions())) + 3 * (ARGS.s_per_structure_page + ARGS.s_per_table))


def test_an_answer_is_drained_at_the_table_regions_it_had():
    adm = Admission(ARGS)
    size = PAGE.with_options(OcrOptions(structure=True))
    cost = adm.model.estimate(size)
    lines = round(adm.model.lines_per_mp())  # as many lines as priced: only the tables move it
    assert adm.model.read_cost(size, cost, lines, 10) == pytest.approx(cost + 9 * ARGS.s_per_table, rel=1e-3)
    assert adm.model.read_cost(PAGE, cost, lines, 10) == pytest.approx(cost, rel=1e-3)  # no structure: no tables
    body = {"image": {}, "results": [], "regions": [{"type": "table"}, {"type": "text"}, {"type": "table"}]}
    doc = {"pages": [body, {"results": []}, body]}
    assert count_tables(body) == 2 and count_tables(doc) == 4 and count_tables({"results": []}) == 0


def test_a_300_page_pdf_as_markdown_is_refused_at_once_naming_the_jobs_api():
    adm = Admission(ARGS)
    doc = Size(1_000_000, pages=300).with_options(OcrOptions(format="markdown"))
    with pytest.raises(Overloaded) as e:
        adm.admit(doc, None)
    assert "POST /v1/ocr/jobs" in e.value.message and "300 page(s)" in e.value.message
    assert adm.queued_s == 0 and adm.refused == {"too_big": 1}
