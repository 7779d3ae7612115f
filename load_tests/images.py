"""The images a load run sends: the peer images kept in the repository."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.peer import PEER

DEFAULT_IMAGES = PEER
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}
CTYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}
# --quick: a 14-line photo (several crops: cls/rec batches), a text line, a short German sign.
QUICK_IMAGES = ("rapidocr_ch_en_num.jpg", "rapidocr_text_rec.jpg", "paddleocr_ger_1.jpg")
# the soak's mix: documents, scenes, receipts, word crops
SOAK_IMAGES = ("rapidocr_ch_en_num.jpg", "rapidocr_issue_170.png", "paddleocr_00006737.jpg",
               "mmocr_wildreceipt_2.jpeg", "mmocr_icdar15_img_8.jpg", "rapidocr_test_without_det.jpg",
               "paddleocr_00111002.jpg", "mmocr_word_1036169.jpg")


@dataclass(frozen=True)
class Img:
    name: str
    data: bytes
    ctype: str


def load(folder: Path, names) -> list[Img]:
    return [Img(x, (folder / x).read_bytes(), CTYPES[Path(x).suffix.lower()]) for x in names]


def pick_images(folder: Path, quick: bool, n: Optional[int], names: Optional[list[str]]) -> list[Img]:
    return load(folder, pick_names(folder, quick, n, names))


def pick_names(folder: Path, quick: bool, n: Optional[int], names: Optional[list[str]],
               quick_names: tuple[str, ...] = QUICK_IMAGES) -> list[str]:
    """`names` if given; `quick_names` (those in the folder) with `quick`;
    else n evenly spaced over the sorted names (every source is
    represented), else all."""
    if not folder.is_dir():
        sys.exit(f"image folder {folder} not found (use --images DIR)")
    avail = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not avail:
        sys.exit(f"no jpg/jpeg/png images in {folder}")
    if names:
        missing = [x for x in names if x not in avail]
        if missing:
            sys.exit(f"images not in {folder}: {missing}")
        return list(names)
    if quick:
        return [x for x in quick_names if x in avail] or avail[:len(quick_names)]
    return [avail[int(i * len(avail) / n)] for i in range(n)] if n and n < len(avail) else avail


def resized_variants(images: list[Img], n: int, seed: int = 11, scale: tuple[float, float] = (0.35, 1.6),
                     max_side: int = 4000) -> list[Img]:
    """n images of many sizes: each a random one of `images`, resized by a
    random factor (and a slight random change of aspect ratio), re-encoded
    in its own format. Seeded: the same list every run. So a soak meets
    images of many sizes, as a service does, not a handful of fixed ones."""
    import io
    import random

    from PIL import Image

    rng = random.Random(seed)
    out = []
    for k in range(n):
        src = images[rng.randrange(len(images))]
        img = Image.open(io.BytesIO(src.data))
        img.load()
        f = rng.uniform(*scale)
        fx, fy = f * rng.uniform(0.85, 1.15), f * rng.uniform(0.85, 1.15)
        w, h = img.size
        fit = min(1.0, max_side / max(w * fx, h * fy))
        size = (max(8, round(w * fx * fit)), max(8, round(h * fy * fit)))
        buf = io.BytesIO()
        fmt = "PNG" if src.ctype == "image/png" else "JPEG"
        img = img.resize(size, Image.BILINEAR)
        (img if fmt == "PNG" else img.convert("RGB")).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        stem = src.name.rsplit(".", 1)[0]
        out.append(Img(f"{stem}@{size[0]}x{size[1]}#{k}", buf.getvalue(), src.ctype))
    return out
