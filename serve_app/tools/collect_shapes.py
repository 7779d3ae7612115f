"""Collect TensorRT dynamic shape ranges for a stage:

    python -m serve_app.tools.collect_shapes det /tmp/ocr_trt_cache/det_shapes.txt

Runs the stage's model, without TensorRT, over the shapes the service warms
(detector inputs up to the configured side, recogniser batches and width
buckets), with Paddle's `collect_shape_range_info`; point the GPU profile's
`tensorrt.shape_range_info_path` at the file it writes. Run it on the GPU
machine with the `gpu` extra (on the CPU build it collects on the CPU, which
gives the same ranges)."""

from __future__ import annotations

import argparse
import sys

import numpy as np


def shapes_for(stage: str, max_side: int, rec_batch: int, max_width: int) -> list[tuple[int, ...]]:
    if stage == "det":
        sides = list(range(32, max_side + 1, 32))
        return [(1, 3, sides[0], sides[0]), (1, 3, max_side, max_side), (1, 3, 32, max_side), (1, 3, max_side, 32)]
    if stage == "cls":
        return [(1, 3, 48, 192), (rec_batch, 3, 48, 192)]
    return [(1, 3, 48, 320), (rec_batch, 3, 48, 320), (1, 3, 48, max_width), (rec_batch, 3, 48, max_width)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=["det", "cls", "rec"])
    p.add_argument("out", help="shape range file to write")
    p.add_argument("--model-dir", help="the stage's model directory (default: the bundled PP-OCRv4 one)")
    p.add_argument("--max-side", type=int, default=1280)
    p.add_argument("--rec-batch", type=int, default=16)
    p.add_argument("--max-width", type=int, default=3200)
    args = p.parse_args(argv)

    from paddle import inference

    from serve_app.config import PredictorOptions
    from serve_app.weights import model_files
    from serve_app.predictor import build_paddle_config, gpu_available

    files = model_files(args.stage, args.model_dir)
    device = "gpu" if gpu_available() else "cpu"
    cfg = build_paddle_config(files, PredictorOptions(device=device, enable_mkldnn=False))
    cfg.collect_shape_range_info(args.out)
    predictor = inference.create_predictor(cfg)
    inp = predictor.get_input_handle(predictor.get_input_names()[0])
    for shape in shapes_for(args.stage, args.max_side, args.rec_batch, args.max_width):
        inp.reshape(list(shape))
        inp.copy_from_cpu(np.zeros(shape, dtype=np.float32))
        predictor.run()
    print(f"wrote {args.out} ({device})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
