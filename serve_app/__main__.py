"""`python -m serve_app FILE [FILE ...]`: one JSON object per image or PDF and line."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from serve_app.flow.upload import upload_of
from serve_app.core.errors import OcrError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serve_app", description="PP-OCR on Paddle Inference, in process.")
    p.add_argument("images", nargs="+", help="image files (JPEG, PNG, BMP, TIFF, WEBP, GIF, HEIC, AVIF) or PDFs")
    p.add_argument("--no-det", action="store_true", help="read each image as a single text line")
    p.add_argument("--no-cls", action="store_true", help="skip the 0/180 direction classifier")
    p.add_argument("--reference", action="store_true",
                   help="RapidOCR 1.4.x parameters (detector short side 736, EXIF ignored)")
    p.add_argument("--model", default="ppocrv6_small", metavar="NAME",
                   help="model set: ppocrv6_small (default), ppocrv6_tiny, ppocrv4_mobile (models/README.md)")
    p.add_argument("--det-model", help="directory of an exported detection model")
    p.add_argument("--cls-model", help="directory of an exported direction-classifier model")
    p.add_argument("--rec-model", help="directory of an exported recognition model")
    p.add_argument("--rec-dict", help="recognition dictionary (one character per line)")
    p.add_argument("--threads", type=int, help="CPU math threads per predictor (default: all cores)")
    p.add_argument("--engine", choices=["openvino", "onednn", "plain"], default="openvino",
                   help="CPU inference engine (default openvino, the fastest here)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="OpenVINO inference precision (auto: bf16 where the CPU has it natively)")
    p.add_argument("--chars", action="store_true", help="add each character's box to every line")
    p.add_argument("--words", action="store_true", help="add each word's box to every line")
    p.add_argument("--options", metavar="JSON", default="{}",
                   help='any per-request options as JSON, e.g. \'{"box_thresh": 0.7, "limit_side_len": 960}\'')
    p.add_argument("--format", choices=["json", "text", "hocr", "alto", "markdown"], default="json",
                   help="json: one object per image and line (default); text, hocr, alto, markdown: each image's "
                   "document (markdown reads the page's structure)")
    p.add_argument("--timings", action="store_true", help="add timings_ms to each line")
    p.add_argument("--pdf-text-layer", action="store_true",
                   help="PDF pages that have a text layer take their lines from it (marked source: text_layer)")
    return p


def engine_config(args):
    from serve_app.core.engine_config import for_model, reference_config
    from serve_app.engine import default_engine_config

    base = default_engine_config()
    popts = base.predictor.model_copy(update={
        "enable_openvino_engine": args.engine == "openvino",
        "enable_mkldnn": args.engine == "onednn",
        "openvino_precision": args.precision,
        **({"cpu_math_library_num_threads": args.threads} if args.threads else {}),
    })
    cfg = reference_config(predictor=popts) if args.reference else base.model_copy(update={"predictor": popts})
    cfg = for_model(cfg, args.model)
    models = {k: getattr(args, k) for k in ("det_model", "cls_model", "rec_model", "rec_dict") if getattr(args, k)}
    if args.no_cls:
        models["cls"] = cfg.cls.model_copy(update={"enabled": False})
    return cfg.model_copy(update=models)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from serve_app.engine import OcrEngine

    try:
        extra = json.loads(args.options)
        if not isinstance(extra, dict):
            raise ValueError("not an object")
    except ValueError as e:
        print(f"error: --options must be a JSON object ({e})", file=sys.stderr)
        return 2
    opts = {"det": not args.no_det, "return_chars": args.chars, **({"return_words": True} if args.words else {}),
            **({"pdf_text_layer": True} if args.pdf_text_layer else {}), **extra}
    if args.format in ("hocr", "alto"):  # they place words
        opts["return_words"] = True
    if args.format == "markdown":  # written from the page's regions
        opts["structure"] = True
    from serve_app.core.request_options import parse_options

    try:
        parse_options(opts)
    except OcrError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    try:
        engine = OcrEngine(engine_config(args))  # an unknown --model: ConfigError, exit 2
    except OcrError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    failures = 0
    with engine:
        for path in args.images:
            try:
                document = upload_of(path).is_document  # decided once per input
                if document:
                    result = engine.read_document(path, **opts)
                else:
                    result = engine.read(path, **opts)
                if args.format != "json":
                    from serve_app.flow.formats import render

                    print(render({**result.to_dict(), "model": engine.config.model}, args.format)[0], end="", flush=True)
                    continue
                body = result.to_dict()
                if document:
                    if not args.timings:
                        for page in body["pages"]:
                            del page["timings_ms"]
                        del body["timings_ms"]
                    out = {"image": path, **body}
                else:
                    out = {"image": path, "results": body["results"]}
                    if args.timings:
                        out["timings_ms"] = body["timings_ms"]
            except OcrError as e:
                failures += 1
                out = {"image": path, "error": {"code": e.code, "message": e.message}}
            print(json.dumps(out, ensure_ascii=False), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
