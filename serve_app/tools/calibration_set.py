"""Rebuild the packaged calibration set (serve_app/inference/calibration/set.json and
pages/): TensorRT int8 calibration and the fp16/int8 agreement checks of the
detector and the classifier read these real images (serve_app/inference/int8_calibration.py,
serve_app/inference/precision_check.py).

    python -m serve_app.tools.calibration_set      # from a checkout (reads tests/data/peer)

The pages are byte-for-byte copies of images of tests/data/peer (provenance
from its expected.json); the line crops are not stored as images but as the
boxes the CPU engine found on those pages (crop_quad of page and box gives
the crop again), with what the CPU engine read there: its direction and its
text (OpenVINO fp32). Those are the recorded CPU outputs the unit tests compare perturbed
outputs against. Loads the three models on the CPU (about a minute).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEER = REPO / "tests" / "data" / "peer"
OUT = REPO / "serve_app" / "inference" / "calibration"
# Scenes (ICDAR2015), documents, a receipt, a product label, a German page:
# small files (under 80 kB each) of the kinds the service reads.
PAGES = ("mmocr_icdar15_img_1.jpg", "mmocr_icdar15_img_2.jpg", "paddleocr_00207393.jpg",
         "paddleocr_00059985.jpg", "paddleocr_00018069.jpg", "rapidocr_ch_en_num.jpg",
         "mmocr_wildreceipt_2.jpeg", "paddleocr_ger_1.jpg", "paddleocr_11.jpg")


def build(out: Path = OUT) -> dict:
    import cv2

    from serve_app.engine import OcrEngine, default_engine_config
    from serve_app.ocr.crop import crop_quad

    provenance = {e["image"]: e for e in json.loads((PEER / "expected.json").read_text())}
    (out / "pages").mkdir(parents=True, exist_ok=True)
    pages = []
    # fp32 (the in-process default on a CPU with bf16 is OpenVINO bf16): the
    # reference a low-precision engine is held to.
    predictor = default_engine_config().predictor.model_copy(update={"openvino_precision": "fp32"})
    with OcrEngine(default_engine_config(predictor=predictor)) as engine:
        for name in PAGES:
            src = PEER / name
            shutil.copyfile(src, out / "pages" / name)
            img = cv2.imread(str(src), cv2.IMREAD_COLOR)
            boxes = engine.detector.detect([img])[0]
            crops = [crop_quad(img, b) for b in boxes]
            dirs = engine.classifier.classify(crops) if crops else []
            texts = engine.recognizer.recognize(crops) if crops else []
            e = provenance[name]
            pages.append({
                "file": f"pages/{name}", "copied_from": f"tests/data/peer/{name}", "source": e["source"],
                "commit": e.get("commit"), "licence": e["licence"],
                "sha256": hashlib.sha256(src.read_bytes()).hexdigest(), "size_wh": [img.shape[1], img.shape[0]],
                "cpu": {"boxes": [[[round(float(x), 2), round(float(y), 2)] for x, y in b] for b in boxes],
                        "directions": [d.label for d in dirs], "texts": [t.text for t in texts]},
            })
    doc = {"about": "Real images for TensorRT int8 calibration and the fp16/int8 agreement checks; "
                    "rebuilt by `python -m serve_app.tools.calibration_set`. `cpu`: what the CPU engine "
                    "(default config, OpenVINO fp32) found on each page with TextDetector.detect on the page as is: boxes, "
                    "then per box the classifier's direction and the recogniser's text of crop_quad(page, box).",
           "pages": pages}
    (out / "set.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    return doc


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    doc = build()
    n = sum(len(p["cpu"]["boxes"]) for p in doc["pages"])
    print(f"{len(doc['pages'])} pages, {n} boxes -> {OUT / 'set.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
