"""Multi-page TIFF as a document (serve_app.flow.tiff_pages), and animated images'
frame count (serve_app.ocr.decode.frame_count). No Ray, no models."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

from serve_app.core.engine_config import DocumentLimits
from serve_app.flow.documents import check_document, is_document, open_document
from serve_app.core.errors import BadImage, TooLarge
from serve_app.ocr.decode import frame_count
from serve_app.flow.tiff_pages import TiffPages, tiff_page_count


def fax(pages: int, size=(1728, 1100), compression="group4") -> bytes:
    """A 1-bit CCITT G4 TIFF, page k with a black bar k+1 tenths wide."""
    ims = []
    for k in range(pages):
        im = Image.new("1", size, 1)
        im.paste(0, (0, 0, size[0] * (k + 1) // 10, 20))
        ims.append(im)
    buf = io.BytesIO()
    ims[0].save(buf, format="TIFF", compression=compression, save_all=True, append_images=ims[1:], dpi=(204, 196))
    return buf.getvalue()


def test_a_three_page_fax_is_a_document_of_three_pages_read_in_order():
    data = fax(3)
    assert is_document(data) and tiff_page_count(data, 500) == 3
    with open_document(data, DocumentLimits()) as doc:
        assert doc.kind == "tiff" and doc.pages == 3
        for k in range(3):
            page = doc.render(k)
            assert page.shape == (1100, 1728, 3) and page.dtype == np.uint8
            black = (page[5, :, 0] < 128).sum()  # the bar says which page this is (its edge smoothed: 1-bit)
            assert black == 1728 * (k + 1) // 10
        assert doc.text_lines(0) is None  # no text layer: every page is read by OCR


def test_a_one_page_tiff_stays_an_image_and_other_images_are_not_documents():
    assert not is_document(fax(1))
    png = io.BytesIO()
    Image.new("L", (10, 10)).save(png, "PNG")
    assert not is_document(png.getvalue()) and not is_document(b"II*\x00")


def test_a_tiff_path_is_a_document_too(tmp_path):
    p = tmp_path / "fax.tif"
    p.write_bytes(fax(2))
    assert is_document(p) and is_document(str(p))
    assert not is_document(tmp_path / "missing.tif")


def test_more_pages_than_the_limit_is_413_before_any_page_is_decoded():
    data = fax(6)
    with pytest.raises(TooLarge, match="more than 5 pages"):
        check_document(data, DocumentLimits(max_pages=5))
    assert check_document(data, DocumentLimits(max_pages=6)) == 6


def test_a_page_over_the_pixel_limit_is_413_from_its_directory():
    # 20000 x 20000 1-bit pages (400 MP each): about 25 kB each in G4
    data = fax(2, size=(20000, 20000))
    assert len(data) < 60_000
    with pytest.raises(TooLarge, match="page 1 of the TIFF is 20000x20000"):
        check_document(data, DocumentLimits())
    with TiffPages(data, DocumentLimits()) as doc, pytest.raises(TooLarge):
        doc.render(1)


def looped_tiff(pages_in_loop: int) -> bytes:
    """A classic little-endian TIFF whose directories point at each other in
    a loop: the last one's next offset is the first's."""
    entries = [(256, 3, 1, 8), (257, 3, 1, 8), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1),
               (273, 4, 1, 8), (277, 3, 1, 1), (278, 3, 1, 8), (279, 4, 1, 64)]
    ifd_size = 2 + 12 * len(entries) + 4
    first = 8 + 64  # header, then 8x8 pixels of strip data
    out = bytearray(b"II*\x00" + struct.pack("<I", first) + bytes(64))
    for k in range(pages_in_loop):
        nxt = first + ifd_size * ((k + 1) % pages_in_loop)
        out += struct.pack("<H", len(entries))
        for tag, typ, count, value in entries:
            out += struct.pack("<HHII", tag, typ, count, value)
        out += struct.pack("<I", nxt)
    return bytes(out)


def test_a_directory_chain_that_loops_counts_each_directory_once():
    data = looped_tiff(3)
    assert tiff_page_count(data, 500) == 3
    assert tiff_page_count(looped_tiff(1), 500) == 1
    # cut short, pointing outside the file: stops there
    assert tiff_page_count(data[:8] + b"\xff\xff\xff\x7f", 500) == 0


def test_counting_stops_past_the_limit():
    assert tiff_page_count(fax(8), 3) == 4


def test_not_a_tiff_or_broken_is_400():
    with pytest.raises(BadImage):
        TiffPages(b"II*\x00" + struct.pack("<I", 0), DocumentLimits())


def test_animated_gif_frames_are_counted_and_a_still_image_has_one():
    frames = [Image.new("L", (20, 10), v) for v in (0, 128, 255)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert frame_count(gif.getvalue()) == 3
    webp = io.BytesIO()
    frames[0].convert("RGB").save(webp, "WEBP", save_all=True, append_images=[f.convert("RGB") for f in frames[1:]])
    assert frame_count(webp.getvalue()) == 3
    png = io.BytesIO()
    frames[0].save(png, "PNG")
    assert frame_count(png.getvalue()) == 1
    assert frame_count(b"junk") == 1


# -- pages decoded in the killable children (issue 38, item 4) ---------------------------------


def test_tiff_pages_are_decoded_in_a_worker_child_within_the_page_budget():
    """A multi-page TIFF's page was decoded in the serving process with no
    budget (0.7 s a tile-heavy page); now in the PDF pool's children: one
    over its budget is a 413 naming the page and its child is killed, the
    others read as before."""
    from serve_app.core.errors import PageOverBudget
    from serve_app.flow.pdf_worker import WorkerPool

    rng = np.random.default_rng(0)
    big = [Image.fromarray(rng.integers(0, 256, (3000, 3000, 3), dtype=np.uint8)) for _ in range(2)]
    buf = io.BytesIO()
    big[0].save(buf, format="TIFF", compression="tiff_lzw", save_all=True, append_images=big[1:])
    pool = WorkerPool(1)
    try:
        with TiffPages(buf.getvalue(), DocumentLimits(page_timeout_s=0.01), pool=pool) as doc:
            with pytest.raises(PageOverBudget, match="page 2 of the TIFF took over 0.01 s") as e:
                doc.render(1)
            assert e.value.status == 413 and pool.killed == 1
        with TiffPages(fax(3), DocumentLimits(), pool=pool) as doc:  # the pool serves the next document
            assert [int((doc.render(k)[5, :, 0] < 128).sum()) for k in range(3)] == [172, 345, 518]
    finally:
        pool.close()


@pytest.mark.parametrize("mode", ["P", "CMYK", "L", "RGBA", "I;16"])
def test_a_page_decoded_in_a_child_is_the_page_decoded_here(mode):
    from serve_app.ocr.decode import to_bgr

    rng = np.random.default_rng(1)
    ims = []
    for k in range(2):
        rgb = Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8))
        im = rgb.convert(mode) if mode != "I;16" else Image.fromarray(rng.integers(0, 65535, (40, 60), dtype=np.uint16))
        ims.append(im)
    buf = io.BytesIO()
    ims[0].save(buf, format="TIFF", save_all=True, append_images=ims[1:])
    with TiffPages(buf.getvalue(), DocumentLimits()) as doc:
        got = [doc.render(k) for k in range(2)]
    with Image.open(io.BytesIO(buf.getvalue())) as img:
        want = []
        for k in range(2):
            img.seek(k)
            img.load()
            want.append(to_bgr(img.copy()))
    for g, w in zip(got, want):
        assert g.shape == w.shape and np.array_equal(g, w)


# -- pages stored in many tiles (issue 61) ----------------------------------------------------


def test_a_tiled_tiffs_pages_are_sized_and_counted_from_their_directories_never_by_pil_here(monkeypatch):
    """Pillow's directory set-up loops in Python over every tile (0.2 s a
    16 MP page of 16 x 16 px tiles, holding the interpreter: the door's
    walk of a 199-page TIFF kept /healthz waiting 990 ms). The page sizes
    and tile counts come from the directories' bytes; Pillow opens the
    TIFF only in the child that decodes a page."""
    from PIL import TiffImagePlugin

    from harness.pages import tiled_tiff

    def refused(self):
        raise AssertionError("Pillow set up a TIFF directory in the serving process")

    data = tiled_tiff(3, first=16)
    monkeypatch.setattr(TiffImagePlugin.TiffImageFile, "_setup", refused)
    assert check_document(data, DocumentLimits()) == 3
    with TiffPages(data, DocumentLimits()) as doc:
        assert doc.page_sizes() == [(16, 16), (4000, 4000), (4000, 4000)]
        assert doc.page_chunks() == [1, 62500, 62500]


def test_a_page_of_sixty_thousand_tiles_is_stopped_at_its_budget_in_the_child():
    from serve_app.core.errors import PageOverBudget
    from serve_app.flow.pdf_worker import WorkerPool

    from harness.pages import tiled_tiff

    pool = WorkerPool(1)
    try:
        with TiffPages(tiled_tiff(2, first=16), DocumentLimits(page_timeout_s=0.05), pool=pool) as doc:
            assert doc.render(0).shape == (16, 16, 3)
            with pytest.raises(PageOverBudget, match="page 2 of the TIFF took over 0.05 s"):
                doc.render(1)
        assert pool.killed == 1
    finally:
        pool.close()
