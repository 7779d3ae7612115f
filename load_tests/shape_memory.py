"""How a predictor's memory grows with the input shapes it meets (Paddle's
OpenVINO engine keeps memory for every one): one pinned single-thread
predictor, fed input shapes at random, RSS printed as it goes.

    .venv/bin/python -m load_tests shape_memory --stage rec --shapes 200            # widths 320-1600 in 32 px steps
    .venv/bin/python -m load_tests shape_memory --stage rec --ladder --images 400   # the service's closed set, then random crops
    .venv/bin/python -m load_tests shape_memory --stage det --shapes 300            # sides 320-1280, multiples of 32"""

from __future__ import annotations

import argparse
import random
import sys
import time

import numpy as np


from load_tests.procfs import rss_mb  # noqa: E402
from serve_app.core.engine_config import EngineConfig  # noqa: E402
from serve_app.inference.weights import dictionary_path, model_files  # noqa: E402
from serve_app.inference.runners import TextRecognizer  # noqa: E402
from serve_app.inference.predictor import PaddlePredictor  # noqa: E402
from serve_app.ocr.recognition import input_shapes, load_charset  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", choices=("det", "rec"), default="rec")
    ap.add_argument("--shapes", type=int, default=200, help="random input shapes to feed")
    ap.add_argument("--ladder", action="store_true", help="rec: warm the ladder's shapes, then read random crops")
    ap.add_argument("--images", type=int, default=400, help="with --ladder: random images' crops to read")
    ap.add_argument("--core", type=int, default=0)
    args = ap.parse_args(argv)
    eng = EngineConfig()
    opts = eng.predictor.model_copy(update={"enable_openvino_engine": True, "cpu_math_library_num_threads": 1,
                                            "cpu_affinity": [args.core]})
    model = eng.det_model if args.stage == "det" else eng.rec_model
    p = PaddlePredictor(model_files(args.stage, model), opts, args.stage)
    print(f"loaded: {rss_mb():.0f} MB", flush=True)
    rng = random.Random(1)
    seen: set = set()
    t0 = time.perf_counter()
    if args.stage == "det":
        for i in range(args.shapes):
            h, w = rng.choice(range(320, 1281, 32)), rng.choice(range(320, 1281, 32))
            p.run(np.zeros((1, 3, h, w), np.float32))
            seen.add((h, w))
            if (i + 1) % 20 == 0:
                print(f"{i + 1} calls, {len(seen)} shapes: {rss_mb():.0f} MB", flush=True)
        return 0
    rec = TextRecognizer(p, eng.rec, load_charset(dictionary_path(eng.rec_dict), True))

    def on_thread(fn, *a):
        return p._executor.submit(fn, *a).result()  # the predictor's own thread, as in the service

    if args.ladder:
        for n, w in input_shapes(eng.rec):
            on_thread(rec.recognize_batch, [np.full((48, w, 3), 255, np.uint8)] * n)
        print(f"warmed {len(input_shapes(eng.rec))} shapes in {time.perf_counter() - t0:.1f} s: {rss_mb():.0f} MB")
        for i in range(args.images):
            crops = [np.full((rng.randint(20, 60), rng.randint(10, 3000), 3), 200, np.uint8)
                     for _ in range(rng.randint(1, 12))]
            on_thread(rec.recognize, crops)
            if (i + 1) % 100 == 0:
                print(f"{i + 1} images: {rss_mb():.0f} MB", flush=True)
        return 0
    for i in range(args.shapes):
        n, w = rng.randint(1, 6), rng.choice(range(320, 1600, 32))
        on_thread(rec.recognize_batch, [np.full((48, w, 3), 255, np.uint8)] * n)
        seen.add((n, w))
        if (i + 1) % 50 == 0:
            print(f"{i + 1} calls, {len(seen)} shapes: {rss_mb():.0f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
