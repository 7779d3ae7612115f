"""decode_image and its helpers: formats, modes, alpha, EXIF, and refusals."""

from __future__ import annotations

import io
import resource
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from serve_app.core.engine_config import ImageLimits
from serve_app.core.errors import BadImage, TooLarge
from serve_app.ocr.decode import array_to_bgr, decode_image, flatten_alpha, frame_count, to_bgr


def encode(img: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height RGB pixels, with a tiny IDAT."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + png_chunk(b"IEND", b"")
    )


# --- formats -------------------------------------------------------------------------

RED = Image.new("RGB", (7, 5), (255, 0, 0))


@pytest.mark.parametrize(
    "fmt, kwargs",
    [
        ("PNG", {}),
        ("BMP", {}),
        ("TIFF", {}),
        ("WEBP", {"lossless": True}),
        ("GIF", {}),
    ],
)
def test_lossless_formats_decode_to_bgr(fmt, kwargs):
    out = decode_image(encode(RED, fmt, **kwargs))
    assert out.shape == (5, 7, 3)
    assert out.dtype == np.uint8
    assert np.all(out == [0, 0, 255])


def test_jpeg_decodes_to_bgr():
    out = decode_image(encode(RED, "JPEG", quality=95))
    assert out.shape == (5, 7, 3)
    assert out.dtype == np.uint8
    # Lossy: red stays red, blue and green stay near zero.
    assert np.all(out[..., 2] >= 245)
    assert np.all(out[..., :2] <= 10)


def test_colour_channels_keep_their_places():
    arr = np.zeros((2, 3, 3), dtype=np.uint8)
    arr[0, 0] = (10, 20, 30)  # RGB
    arr[1, 2] = (200, 100, 50)
    out = decode_image(encode(Image.fromarray(arr), "PNG"))
    assert out[0, 0].tolist() == [30, 20, 10]
    assert out[1, 2].tolist() == [50, 100, 200]


def test_bytearray_and_memoryview_are_accepted():
    data = encode(Image.new("RGB", (3, 2), (0, 255, 0)), "PNG")
    assert decode_image(bytearray(data))[0, 0].tolist() == [0, 255, 0]
    assert decode_image(memoryview(data))[0, 0].tolist() == [0, 255, 0]


# --- modes ------------------------------------------------------------------------------


def test_grayscale_becomes_three_equal_channels():
    out = decode_image(encode(Image.new("L", (4, 3), 100), "PNG"))
    assert out.shape == (3, 4, 3)
    assert np.all(out == 100)


def test_one_bit_image_is_smoothed_to_gray():
    """Bilevel pages are low-passed (decode.BILEVEL_SIGMA): flat areas keep
    their value, a dot becomes a gray peak, and a bool array is read the same."""
    img = Image.new("1", (40, 30), 0)
    img.paste(1, (20, 0, 40, 30))  # right half white
    img.putpixel((5, 5), 1)
    out = decode_image(encode(img, "PNG"))
    assert out.shape == (30, 40, 3) and (out[..., 0] == out[..., 2]).all()
    assert out[20, 2].tolist() == [0, 0, 0] and out[20, 38].tolist() == [255, 255, 255]
    assert 20 < out[5, 5, 0] < 128 and out[5, 5, 0] == out[2:9, 2:9, 0].max()
    assert 0 < out[20, 19, 0] < out[20, 20, 0] < 255  # the edge is a ramp
    assert np.array_equal(array_to_bgr(np.asarray(img)), out)


def test_palette_image():
    img = Image.new("P", (4, 3), 0)
    img.putpalette([0, 0, 0, 0, 255, 0, 255, 0, 0] + [0] * (256 * 3 - 9))
    img.putpixel((1, 1), 1)
    img.putpixel((2, 2), 2)
    out = decode_image(encode(img, "PNG"))
    assert out.shape == (3, 4, 3)
    assert out[0, 0].tolist() == [0, 0, 0]
    assert out[1, 1].tolist() == [0, 255, 0]
    assert out[2, 2].tolist() == [0, 0, 255]  # red, in BGR


def test_palette_gif_with_transparency_is_flattened_on_white():
    img = Image.new("P", (10, 10), 0)
    img.putpalette([255, 255, 255, 0, 0, 0] + [0] * (256 * 3 - 6))
    for x in range(2, 8):
        img.putpixel((x, 5), 1)
    out = decode_image(encode(img, "GIF", transparency=0))
    assert out[5, 4].tolist() == [0, 0, 0]
    assert out[0, 0].tolist() == [255, 255, 255]


def test_16_bit_grayscale_is_scaled_to_8_bits():
    arr = np.array([[0, 32768, 65535]], dtype=np.uint16)
    img = Image.fromarray(arr)
    data = encode(img, "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    out = decode_image(data)
    assert out.shape == (1, 3, 3)
    # v * 255 / 65535, truncated: 32768 -> 127.5 -> 127
    assert out[0, :, 0].tolist() == [0, 127, 255]
    assert np.all(out[..., 0] == out[..., 1]) and np.all(out[..., 1] == out[..., 2])


def test_cmyk_jpeg_becomes_bgr():
    out = decode_image(encode(Image.new("CMYK", (4, 4), (0, 255, 255, 0)), "JPEG", quality=95))
    assert out.shape == (4, 4, 3)
    assert np.all(out[..., 2] >= 245) and np.all(out[..., :2] <= 10)  # red


def line_image(mode: str, ink, clear) -> Image.Image:
    """A transparent 20x10 image with one opaque horizontal line of `ink`."""
    img = Image.new(mode, (20, 10), clear)
    for x in range(5, 15):
        img.putpixel((x, 5), ink)
    return img


@pytest.mark.parametrize(
    "mode, ink, clear",
    [("LA", (0, 255), (0, 0)), ("RGBA", (0, 0, 0, 255), (0, 0, 0, 0)), ("RGBA", (0, 0, 0, 255), (255, 255, 255, 0))],
)
def test_dark_text_on_transparent_is_put_on_white(mode, ink, clear):
    out = decode_image(encode(line_image(mode, ink, clear), "PNG"))
    assert out.shape == (10, 20, 3)
    assert out[5, 7].tolist() == [0, 0, 0]
    assert out[0, 0].tolist() == [255, 255, 255]
    assert np.count_nonzero(out.min(axis=2) < 128) == 10  # only the line is dark


@pytest.mark.parametrize(
    "mode, ink, clear",
    [("LA", (255, 255), (0, 0)), ("RGBA", (255, 255, 255, 255), (0, 0, 0, 0)), ("RGBA", (255, 255, 255, 255), (255, 255, 255, 0))],
)
def test_light_text_on_transparent_is_put_on_black(mode, ink, clear):
    # Note the last case: transparent pixels that are white underneath still
    # become black, or the text would vanish.
    out = decode_image(encode(line_image(mode, ink, clear), "PNG"))
    assert out[5, 7].tolist() == [255, 255, 255]
    assert out[0, 0].tolist() == [0, 0, 0]
    assert np.count_nonzero(out.max(axis=2) > 127) == 10  # only the line is light


def test_half_transparent_dark_pixel_is_blended_with_white():
    img = Image.new("RGBA", (4, 4), (0, 0, 0, 128))
    out = decode_image(encode(img, "PNG"))
    # 0 * 128/255 + 255 * 127/255 = 127
    assert np.all(np.abs(out.astype(int) - 127) <= 1)


def test_fully_transparent_image_is_white():
    out = decode_image(encode(Image.new("RGBA", (5, 4), (0, 0, 0, 0)), "PNG"))
    assert np.all(out == 255)


def test_flatten_alpha_directly():
    bgr = np.zeros((2, 2, 3), dtype=np.uint8)
    bgr[0, 0] = (10, 20, 30)
    alpha = np.array([[255, 0], [0, 0]], dtype=np.uint8)
    out = flatten_alpha(bgr, alpha)
    assert out[0, 0].tolist() == [10, 20, 30]  # opaque pixel unchanged
    assert out[1, 1].tolist() == [255, 255, 255]  # dark content -> white background


def test_array_to_bgr_shapes_and_dtypes():
    gray = np.array([[0, 255]], dtype=np.uint8)
    assert array_to_bgr(gray).tolist() == [[[0, 0, 0], [255, 255, 255]]]
    assert array_to_bgr(gray[..., None]).shape == (1, 2, 3)
    rgb = np.array([[[1, 2, 3]]], dtype=np.uint8)
    assert array_to_bgr(rgb).tolist() == [[[1, 2, 3]]]
    assert array_to_bgr(rgb, rgb=True).tolist() == [[[3, 2, 1]]]
    floats = np.array([[0.0, 0.5, 1.0]], dtype=np.float32)
    assert array_to_bgr(floats)[0, :, 0].tolist() == [0, 127, 255]
    bits = np.array([[True] * 9 + [False] * 9])  # 1-bit: smoothed, flat parts kept
    assert array_to_bgr(bits)[0, [0, 17], 0].tolist() == [255, 0]
    assert 0 < array_to_bgr(bits)[0, 9, 0] < 255
    assert np.array_equal(array_to_bgr(bits[..., None]), array_to_bgr(bits))
    with pytest.raises(BadImage, match="shape"):
        array_to_bgr(np.zeros((2, 2, 2, 2), dtype=np.uint8))
    with pytest.raises(BadImage, match="channels"):
        array_to_bgr(np.zeros((2, 2, 5), dtype=np.uint8))
    with pytest.raises(BadImage, match="shape"):
        array_to_bgr(np.zeros((0, 4), dtype=np.uint8))


def test_to_bgr_of_a_pil_image():
    assert to_bgr(Image.new("RGB", (2, 1), (255, 0, 0)))[0, 0].tolist() == [0, 0, 255]
    assert to_bgr(Image.new("L", (2, 1), 9))[0, 1].tolist() == [9, 9, 9]


# --- EXIF -------------------------------------------------------------------------------


def marked_image_with_orientation(orientation: int, fmt: str = "PNG") -> bytes:
    """6 wide x 4 high, black but for a white top-left pixel."""
    img = Image.new("RGB", (6, 4), (0, 0, 0))
    img.putpixel((0, 0), (255, 255, 255))
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(img, fmt, exif=exif)


def test_exif_orientation_3_rotates_180_degrees():
    out = decode_image(marked_image_with_orientation(3))
    assert out.shape == (4, 6, 3)
    assert out[-1, -1].tolist() == [255, 255, 255]
    assert out[0, 0].tolist() == [0, 0, 0]


def test_exif_orientation_is_ignored_when_asked():
    out = decode_image(marked_image_with_orientation(3), exif_transpose=False)
    assert out[0, 0].tolist() == [255, 255, 255]
    assert out[-1, -1].tolist() == [0, 0, 0]


def test_exif_orientation_6_in_a_jpeg_swaps_width_and_height():
    data = marked_image_with_orientation(6, "JPEG")
    assert decode_image(data).shape == (6, 4, 3)
    assert decode_image(data, exif_transpose=False).shape == (4, 6, 3)


# --- refusals ------------------------------------------------------------------------------


def test_empty_bytes():
    with pytest.raises(BadImage, match="empty") as err:
        decode_image(b"")
    assert err.value.status == 400


def test_not_bytes():
    with pytest.raises(BadImage, match="bytes"):
        decode_image("image.png")


def test_random_bytes():
    data = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    with pytest.raises(BadImage, match="not a supported image") as err:
        decode_image(data)
    assert err.value.status == 400


def test_text_is_not_an_image():
    with pytest.raises(BadImage, match="not a supported image"):
        decode_image(b"hello, world\n" * 10)


def jpeg_of_noise() -> bytes:
    rng = np.random.default_rng(0)
    return encode(Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)), "JPEG")


def test_truncated_jpeg():
    data = jpeg_of_noise()
    with pytest.raises(BadImage, match="corrupt or truncated") as err:
        decode_image(data[: len(data) // 2])
    assert err.value.status == 400


def test_jpeg_cut_inside_its_header():
    with pytest.raises(BadImage, match="not a supported image"):
        decode_image(jpeg_of_noise()[:300])


def test_truncated_png():
    rng = np.random.default_rng(0)
    data = encode(Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)), "PNG")
    with pytest.raises(BadImage, match="corrupt or truncated"):
        decode_image(data[: len(data) // 2])


def test_one_pixel_image_decodes():
    out = decode_image(encode(Image.new("RGB", (1, 1), (1, 2, 3)), "PNG"))
    assert out.tolist() == [[[3, 2, 1]]]


def test_blank_image_decodes():
    out = decode_image(encode(Image.new("RGB", (30, 20), (255, 255, 255)), "PNG"))
    assert out.shape == (20, 30, 3)
    assert np.all(out == 255)


def test_png_claiming_60000_by_60000_pixels_is_refused_from_its_header():
    data = png_header_only(60000, 60000)
    assert len(data) < 100
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TooLarge, match="pixels") as err:
        decode_image(data)
    growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kib) / 1024
    assert err.value.status == 413
    assert "60000x60000" in err.value.message
    assert str(ImageLimits().max_pixels) in err.value.message
    assert growth_mib < 50  # refused from the header: no 10 GiB of pixels were allocated


def test_the_hand_made_png_header_is_valid():
    # The same construction at a small size is a real (if truncated) PNG:
    # PIL reads its header, so the test above fails for the size, not the format.
    img = Image.open(io.BytesIO(png_header_only(3, 2)))
    assert img.size == (3, 2)
    assert img.format == "PNG"


def test_pixel_limit_boundary():
    data = encode(RED, "PNG")  # 7 x 5 = 35 pixels
    assert decode_image(data, ImageLimits(max_pixels=35)).shape == (5, 7, 3)
    with pytest.raises(TooLarge, match="35 pixels, over the limit of 34") as err:
        decode_image(data, ImageLimits(max_pixels=34))
    assert err.value.status == 413


def test_byte_limit_boundary():
    data = encode(RED, "PNG")
    assert decode_image(data, ImageLimits(max_bytes=len(data))).shape == (5, 7, 3)
    with pytest.raises(TooLarge, match=f"{len(data)} bytes, over the limit of {len(data) - 1}") as err:
        decode_image(data, ImageLimits(max_bytes=len(data) - 1))
    assert err.value.status == 413


def test_byte_limit_is_checked_before_anything_is_parsed():
    # Not an image at all, but too big: the size is what is reported.
    with pytest.raises(TooLarge, match="bytes"):
        decode_image(b"x" * 11, ImageLimits(max_bytes=10))


# -- phone formats: HEIC (pillow-heif) and AVIF (Pillow) ---------------------------


def gradient_photo(w: int = 96, h: int = 64) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w]
    return Image.fromarray(np.stack([x * 255 // w, y * 255 // h, np.full_like(x, 128)], -1).astype(np.uint8))


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_heic_and_avif_decode_to_their_pixels(fmt):
    img = gradient_photo()
    out = decode_image(encode(img, fmt, quality=95))
    want = np.asarray(img)[..., ::-1].astype(int)
    assert out.shape == (64, 96, 3) and np.abs(out.astype(int) - want).mean() < 6  # lossy, close


def test_a_heic_turned_by_its_orientation_comes_upright_once():
    """An iPhone photo held upright is stored turned, with the turn in the
    file: the pixels come back upright, not turned twice."""
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to view
    out = decode_image(encode(gradient_photo(), "HEIF", quality=95, exif=exif.tobytes()))
    assert out.shape == (96, 64, 3)
    # 90 CW to view: the original's left column (x = 0, dark red) is now the top row
    assert out[0, :, 2].mean() < 40 and out[-1, :, 2].mean() > 200


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_heic_and_avif_over_the_pixel_limit_are_refused_from_the_header(fmt):
    from serve_app.ocr.image_header import check_image_header

    data = encode(gradient_photo(), fmt)
    limits = ImageLimits(max_pixels=5000)
    with pytest.raises(TooLarge, match="96x64"):
        check_image_header(data, limits)
    with pytest.raises(TooLarge, match="96x64"):
        decode_image(data, limits)
    assert check_image_header(data, ImageLimits()) == (96, 64)


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_truncated_heic_and_avif_are_400(fmt):
    data = encode(gradient_photo(256, 256), fmt)
    for cut in (len(data) // 2, 40):
        with pytest.raises(BadImage) as err:
            decode_image(data[:cut])
        assert err.value.status == 400


def test_a_heic_of_two_images_reads_the_first_and_counts_both():
    from serve_app.ocr.decode import frame_count

    a, b = gradient_photo(), Image.new("RGB", (96, 64), (0, 0, 0))
    data = encode(a, "HEIF", save_all=True, append_images=[b], quality=95)
    assert frame_count(data) == 2
    assert decode_image(data)[..., 2].mean() > 60  # the gradient, not the black one


def test_without_the_heic_extra_a_heic_is_a_415_naming_it_and_the_rest_still_reads(tmp_path):
    """The default install has no pillow-heif (its wheels bundle GPL-2 x265):
    in a process where it cannot be imported, a HEIC (and junk labelled as
    one) is a 415 naming the extra, at the header check and at decode; AVIF
    (Pillow's own libavif), PNG and other junk read or fail as before."""
    import json
    import subprocess
    import sys

    photo = gradient_photo()
    for name, data in {"heic": encode(photo, "HEIF", quality=95), "avif": encode(photo, "AVIF", quality=95),
                       "png": encode(photo, "PNG"), "heic_junk": b"\x00\x00\x00\x18ftypheic" + b"\x00" * 200,
                       "junk": b"not an image at all"}.items():
        (tmp_path / name).write_bytes(data)
    code = f"""
import json, sys
sys.modules["pillow_heif"] = None  # as if the extra were not installed
from pathlib import Path
from serve_app.core.engine_config import ImageLimits
from serve_app.ocr import decode
from serve_app.ocr.image_header import check_image_header
out = {{"heif_opener": decode.pillow_heif is not None}}
for name in ("heic", "avif", "png", "heic_junk", "junk"):
    data = Path({str(tmp_path)!r}, name).read_bytes()
    for step, call in (("header", lambda: check_image_header(data, ImageLimits())),
                       ("decode", lambda: decode.decode_image(data).shape)):
        try:
            out[name + " " + step] = list(call())
        except Exception as e:
            out[name + " " + step] = [type(e).__name__, getattr(e, "status", None), str(e)]
print(json.dumps(out))
"""
    got = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    assert got.pop("heif_opener") is False
    for step in ("header", "decode"):
        for name in ("heic", "heic_junk"):
            kind, status, message = got[f"{name} {step}"]
            assert (kind, status) == ("UnsupportedMediaType", 415), got
            assert "`heic`" in message and "pip install -e '.[heic]'" in message, message
        assert got[f"junk {step}"][:2] == ["BadImage", 400], got
    assert got["avif decode"] == got["png decode"] == [64, 96, 3]
    assert got["avif header"] == got["png header"] == [96, 64]


def test_a_stereo_mpo_reads_its_first_view_and_counts_both():
    from serve_app.ocr.decode import frame_count

    left, right = Image.new("RGB", (64, 48), (200, 10, 10)), Image.new("RGB", (64, 48), (10, 10, 200))
    data = encode(left, "MPO", save_all=True, append_images=[right])
    assert frame_count(data) == 2 and frame_count(encode(left, "JPEG")) == 1
    assert decode_image(data)[0, 0, 2] > 150  # red (BGR): the first view


# -- every byte walk bounded, at decode and at a job's submit alike (issue 38, item 7) --------


@pytest.mark.parametrize("name, what", [
    ("PNG with 19 MiB of empty chunks after its image data", "chunks besides its image data"),
    ("PNG with 19 MiB of empty IDAT chunks", "image data is cut into over"),
    ("GIF of 1,000,000 one-pixel frames", "over 1000 frames"),
    ("JPEG with 19 MiB of empty comments", "over 256 segments"),
])
def test_floods_of_chunks_frames_and_segments_are_a_400_at_decode_and_at_submit(name, what):
    """Each decoded for 5-11 s before (Pillow walks them one by one; a JPEG's
    comments 4 s more in the submit's header check); the walk stops at its bound."""
    from harness.hostile import CASES
    from serve_app.ocr.image_header import check_image_header

    body = next(c for c in CASES if c.name.startswith(name)).make()
    for check in (decode_image, check_image_header):
        with pytest.raises(BadImage, match=what):
            check(body, ImageLimits())
    assert frame_count(body) == 1  # not walked past its bound either


def _saved(frames, fmt, **kw):
    buf = io.BytesIO()
    frames[0].save(buf, fmt, save_all=len(frames) > 1, append_images=frames[1:], **kw)
    return buf.getvalue()


def test_real_images_pass_the_walks_with_their_frames_counted():
    from serve_app.ocr.image_header import check_structure

    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 256, (600, 800, 3), dtype=np.uint8))
    three = [Image.new("RGB", (40, 30), (80 * k, 255 - 80 * k, 0)) for k in range(3)]
    cases = [
        (_saved([noise], "JPEG", progressive=True, quality=90), 1),  # ~10 scans, tables between them
        (_saved([noise], "JPEG", quality=95, comment=b"scanned"), 1),
        (_saved([noise], "PNG"), 1),  # 1.4 MB: its IDATs 64 KiB each
        (_saved([noise], "PNG", optimize=True), 1),
        (_saved(three, "GIF", duration=100, loop=0), 3),
        (_saved([f.convert("RGB") for f in three], "PNG", duration=100), 3),  # an APNG
    ]
    for data, frames in cases:
        assert check_structure(data) == frames
        assert frame_count(data) == frames
        assert decode_image(data).ndim == 3
