#!/usr/bin/env bash
# The GPU run: on a machine with an NVIDIA GPU and the `gpu` extra installed
# (paddlepaddle-gpu), print the figures to compare with the CPU profile.
#
#   bash load_tests/gpu_run.sh [OUT_DIR]
#
# 1. checks that paddle sees the GPU (else stops: the GPU profile would refuse
#    to start anyway);
# 2. collects TensorRT dynamic shape ranges for det and rec into the cache
#    directory the profile uses, and points a copy of the profile at them;
# 3. runs the in-process engine on the GPU over the peer images
#    (load_tests/bench_engine.py, engine only);
# 4. deploys the GPU profile and runs the load sweep against it
#    (load_tests/bench.py --config ...), which also measures cold start
#    (TensorRT engine builds land in the first start; run it twice to see the
#    cached start).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-load_tests/out/gpu}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT" /tmp/ocr_trt_cache/det /tmp/ocr_trt_cache/rec

"$PY" - <<'PY'
import sys
import paddle
n = paddle.device.cuda.device_count() if paddle.is_compiled_with_cuda() else 0
print(f"paddle {paddle.__version__}, CUDA build: {paddle.is_compiled_with_cuda()}, GPUs: {n}")
sys.exit(0 if n else 1)
PY

"$PY" -m serve_app.tools.collect_shapes det /tmp/ocr_trt_cache/det_shapes.txt --max-side 1280
"$PY" -m serve_app.tools.collect_shapes rec /tmp/ocr_trt_cache/rec_shapes.txt --rec-batch 16

"$PY" - "$OUT/deployments.gpu.yaml" <<'PY'
import sys, yaml
cfg = yaml.safe_load(open("deployments.gpu.yaml"))
args = cfg["applications"][0]["args"]
args["detector"]["predictor"]["tensorrt"]["shape_range_info_path"] = "/tmp/ocr_trt_cache/det_shapes.txt"
args["recognizer"]["predictor"]["tensorrt"]["shape_range_info_path"] = "/tmp/ocr_trt_cache/rec_shapes.txt"
cfg["http_options"]["host"] = "127.0.0.1"
yaml.safe_dump(cfg, open(sys.argv[1], "w"))
print("profile with shape ranges:", sys.argv[1])
PY

echo "== in-process engine on the GPU"
"$PY" load_tests/bench_engine.py --systems engine --engine-device gpu --repeats 3 --out "$OUT/bench_engine_gpu.md"

echo "== service, GPU profile"
"$PY" load_tests/bench.py --config "$OUT/deployments.gpu.yaml" --targets http,handle,nobatch \
  --clients 1,4,16,64 --out "$OUT" --raw "$OUT/bench_results.json"
echo "figures: $OUT/benchmarks.md"
