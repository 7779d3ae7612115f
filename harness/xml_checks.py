"""Readers of the service's hOCR and ALTO output, shared by the unit and
integration tests: the official ALTO 4.4 schema (tests/data/alto, its XLink
import resolved to the local copy: nothing is downloaded) and OCRmyPDF's own
hOCR parser."""

from __future__ import annotations

import functools
from pathlib import Path

ALTO_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "alto"
XHTML = "{http://www.w3.org/1999/xhtml}"
ALTO = "{http://www.loc.gov/standards/alto/ns-v4#}"


@functools.lru_cache(maxsize=1)
def alto_schema():
    from lxml import etree

    class LocalXlink(etree.Resolver):
        def resolve(self, url, pubid, context):
            if url.endswith("/xlink.xsd"):
                return self.resolve_filename(str(ALTO_DIR / "xlink.xsd"), context)
            return None

    parser = etree.XMLParser(no_network=True)
    parser.resolvers.add(LocalXlink())
    return etree.XMLSchema(etree.parse(str(ALTO_DIR / "alto-4-4.xsd"), parser))


def hocr_page(doc: str, tmp_path: Path):
    """The first ocr_page of an hOCR document, as OCRmyPDF parses it."""
    from ocrmypdf.hocrtransform import HocrParser

    path = tmp_path / "page.hocr"
    path.write_text(doc, encoding="utf-8")
    return HocrParser(path).parse()


def hocr_words(element) -> list:
    """The ocrx_word elements under a parsed hOCR element, in order."""
    from ocrmypdf.hocrtransform import OcrClass

    out = []
    for child in element.children:
        if child.ocr_class == OcrClass.WORD:
            out.append(child)
        out.extend(hocr_words(child))
    return out
