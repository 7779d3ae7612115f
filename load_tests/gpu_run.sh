#!/usr/bin/env bash
# The GPU proof run, from a clean clone on a fresh machine with an NVIDIA GPU
# and its driver (CUDA=cu126 needs driver >= 550.54.14; see the Makefile):
#
#   bash load_tests/gpu_run.sh [OUT_DIR]          # or: make gpu-run
#   CUDA=cu118 PADDLE_GPU_VERSION=3.3.1 bash load_tests/gpu_run.sh
#
# Everything lands in one file, OUT_DIR/report.md (logs beside it):
#  1. the machine (nvidia-smi), then `make install-gpu`: its own environment
#     (.venv-gpu), paddlepaddle-gpu from Paddle's package index, the project;
#  2. paddle's build, the GPUs it sees, TensorRT;
#  3. the in-process engine on the peer images (tests/data/peer, in the repo)
#     on the CPU and on the GPU: text compared, ms/img for each;
#  4. `serve run` of deployments.gpu.yaml (TensorRT dropped from the copy it
#     runs if this paddle has no TensorRT, and the report says so), ready time
#     (first start builds the TensorRT engines), load, the service's text
#     against the CPU engine's, and per model replica: its enforced Paddle
#     memory limit, the GPU memory nvidia-smi sees for it, the batch sizes
#     formed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-load_tests/out/gpu-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPORT="$OUT/report.md"
SECONDS_LOAD=${SECONDS_LOAD:-60}
CLIENTS=${CLIENTS:-16}
PORT=${PORT:-8000}
say() { echo "$*" | tee -a "$REPORT"; }
fail() { say ""; say "**STOPPED: $*** (logs in $OUT)"; exit 1; }

: > "$REPORT"
say "# GPU run $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
say ""
say "## Machine"
say ""
say '```'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$REPORT" \
  || fail "nvidia-smi failed: no NVIDIA driver on this machine"
say '```'

# A Python the package accepts (3.11 or 3.12).
PYBIN=""
for c in python3.12 python3.11 python3; do
  if command -v "$c" >/dev/null && "$c" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 13))'; then
    PYBIN=$(command -v "$c"); break
  fi
done
[ -n "$PYBIN" ] || fail "no Python 3.11 or 3.12 found (the package needs one)"

say ""
say "## Install: make install-gpu PY=$PYBIN CUDA=${CUDA:-cu126} PADDLE_GPU_VERSION=${PADDLE_GPU_VERSION:-3.3.1}"
make install-gpu PY="$PYBIN" ${CUDA:+CUDA=$CUDA} ${PADDLE_GPU_VERSION:+PADDLE_GPU_VERSION=$PADDLE_GPU_VERSION} \
  >"$OUT/install.log" 2>&1 || fail "make install-gpu failed (tail of install.log: $(tail -3 "$OUT/install.log" | tr '\n' ' '))"
PY=.venv-gpu/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
say ""

"$PY" load_tests/gpu_smoke.py probe >"$OUT/probe.md" 2>"$OUT/probe.log"; probe_rc=$?
cat "$OUT/probe.md" >>"$REPORT"; cat "$OUT/probe.md"
[ $probe_rc -eq 0 ] || fail "paddle sees no GPU (probe.log)"
say ""

"$PY" load_tests/gpu_smoke.py engines --json "$OUT/engines.json" >"$OUT/engines.md" 2>"$OUT/engines.log" \
  || say "**engines step failed** (engines.log: $(tail -2 "$OUT/engines.log" | tr '\n' ' '))"
cat "$OUT/engines.md" >>"$REPORT"; cat "$OUT/engines.md"
say ""

# The profile as shipped, on loopback; without TensorRT only if paddle has none.
"$PY" - "$OUT/deployments.gpu.yaml" "$PORT" >"$OUT/profile.txt" 2>&1 <<'PY'
import sys, yaml
from paddle import inference
cfg = yaml.safe_load(open("deployments.gpu.yaml"))
cfg["http_options"]["host"] = "127.0.0.1"
cfg["http_options"]["port"] = int(sys.argv[2])
try:
    has_trt = inference.get_trt_compile_version()[0] > 0 and inference.get_trt_runtime_version()[0] > 0
except Exception:
    has_trt = False
if not has_trt:
    for stage in ("detector", "recognizer"):
        cfg["applications"][0]["args"][stage]["predictor"].pop("tensorrt", None)
    print("TensorRT NOT available to this paddle: the profile runs WITHOUT TensorRT in this run")
else:
    print("TensorRT available: the profile runs as shipped (TensorRT fp16 for det and rec)")
yaml.safe_dump(cfg, open(sys.argv[1], "w"), sort_keys=False)
PY
say "- $(cat "$OUT/profile.txt")"

# The profile needs its token (ingress.auth_token_env); a throwaway one for this run.
export OCR_AUTH_TOKEN=${OCR_AUTH_TOKEN:-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}
say ""
rm -rf /tmp/ocr_trt_cache  # a first start: engines built here, timed below
t0=$(date +%s)
.venv-gpu/bin/serve run "$OUT/deployments.gpu.yaml" >"$OUT/serve.log" 2>&1 &
SERVE=$!
trap 'kill -INT $SERVE 2>/dev/null; wait $SERVE 2>/dev/null' EXIT
ready=""
for _ in $(seq 1 180); do  # up to 30 min: first start collects 168 det + 113 rec shapes, then builds TensorRT engines
  if curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then ready=1; break; fi
  kill -0 $SERVE 2>/dev/null || break
  sleep 10
done
[ -n "$ready" ] || fail "the GPU profile did not become ready (serve.log: $(grep -m3 -E 'Error|error' "$OUT/serve.log" | tr '\n' ' '))"
say "- deploy to ready (first start, empty TensorRT cache): $(( $(date +%s) - t0 )) s"

"$PY" load_tests/gpu_smoke.py service --url "http://127.0.0.1:$PORT" --engines "$OUT/engines.json" \
  --seconds "$SECONDS_LOAD" --clients "$CLIENTS" >"$OUT/service.md" 2>"$OUT/service.log"; svc_rc=$?
cat "$OUT/service.md" >>"$REPORT"; cat "$OUT/service.md"
[ $svc_rc -eq 0 ] || say "**service step: errors under load or none served** (service.log)"
say ""
say "Logs: $OUT (install.log, serve.log, engines.log, service.log). Report: $REPORT"
