#!/usr/bin/env bash
# The GPU check, from a clean clone on one machine with an NVIDIA GPU, its
# driver and the package indexes reachable (Paddle's, NVIDIA's and PyPI):
#
#   make gpu-check                 # = the two parts below, the second bounded to 10 minutes
#   bash load_tests/gpu_run.sh --install-only [OUT_DIR]   # preflight + make install-gpu (unbounded)
#   bash load_tests/gpu_run.sh --installed [OUT_DIR]      # the check on the installed .venv-gpu
#   bash load_tests/gpu_run.sh [OUT_DIR]                  # both in one go
#
# First every missing piece stops it at once with its fix (load_tests/gpu_preflight.py:
# tools, nvidia-smi, a driver and GPU a Paddle build runs on, Python 3.11/3.12
# with venv, disk, the port, the indexes). Then one report, OUT_DIR/report.md
# (OUT_DIR: $GPU_CHECK_OUT, else load_tests/out/gpu-latest), with each step's
# time at its end:
#  1. `make install-gpu` (the build nvidia-smi calls for; TensorRT of paddle's version);
#  2. paddle's build, the GPUs it sees, TensorRT;
#  3. the in-process engine on the peer images on the CPU and on the GPU;
#  4. `serve run` of deployments.gpu.yaml as shipped (tensorrt.enable: auto),
#     ready within READY_TIMEOUT s or stopped with the replicas' errors, then
#     the summary table: text agreement GPU vs CPU, img/s and p50/p99 at 1, 8
#     and 32 clients, ms per stage at batch 1 and the served batch, each
#     replica's GPU memory against its limit, TensorRT on or off and why, and
#     each stage's start-up agreement with fp32 (TRT_PRECISION=fp16|int8 runs
#     every stage's TensorRT at that precision, the classifier's too: int8
#     calibrates on the packaged real images first).
# Never run on a GPU: no GPU machine has been available to this project.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=all
case "${1:-}" in
  --install-only) MODE=install; shift;;
  --installed) MODE=check; shift;;
esac
OUT=${1:-${GPU_CHECK_OUT:-load_tests/out/gpu-latest}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPORT="$OUT/report.md"
STEPS="$OUT/steps.tsv"                # name, seconds, status: one line per step, both parts
SECONDS_LOAD=${SECONDS_LOAD:-15}      # per client level
CLIENTS=${CLIENTS:-1,8,32}
PORT=${PORT:-8000}
READY_TIMEOUT=${READY_TIMEOUT:-300}   # first start: shape collection and TensorRT engine builds
say() { echo "$*" | tee -a "$REPORT"; }
STEP="" STEP_T0=0
begin() { STEP=$1; STEP_T0=$(date +%s); }
end() { if [ -n "$STEP" ]; then printf '%s\t%s\t%s\n' "$STEP" "$(( $(date +%s) - STEP_T0 ))" "${1:-ok}" >>"$STEPS"; fi; STEP=""; }
times() {
  say ""; say "## Time per step"; say ""; say "| step | s | status |"; say "|---|---:|---|"
  while IFS=$'\t' read -r name secs status; do say "| $name | $secs | $status |"; done <"$STEPS"
}
fail() { end "STOPPED"; say ""; say "**STOPPED: $*** (logs in $OUT)"; times; exit 1; }
# `make gpu-check`'s 10 minutes ran out (timeout sends TERM): the step it was in, and the times so far.
trap 'end "over the bound"; times; exit 124' TERM

if [ "$MODE" != check ]; then
  : > "$REPORT"; : > "$STEPS"
  say "# GPU check $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  say ""
  command -v python3 >/dev/null || fail "no python3 on PATH: apt-get install python3 python3-venv"
  begin preflight
  pre=$(python3 -m load_tests.gpu_preflight --port "$PORT" ${CUDA:+--cuda $CUDA} 2>"$OUT/preflight.log") \
    || fail "$(grep -m1 STOPPED "$OUT/preflight.log" | sed 's/^STOPPED: //' || true)$(grep -q STOPPED "$OUT/preflight.log" || tail -3 "$OUT/preflight.log" | tr '\n' ' ')"
  end
  read -r BUILD PYBIN <<<"$pre"
  echo "$BUILD $PYBIN" >"$OUT/build.txt"
  say "## Machine"
  say ""
  say '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1 | tee -a "$REPORT" >/dev/null
  say '```'
  say "- $(cat "$OUT/preflight.log")"
  say ""
  say "## Install: make install-gpu PY=$PYBIN CUDA=$BUILD"
  begin install
  make install-gpu PY="$PYBIN" CUDA="$BUILD" ${PADDLE_GPU_VERSION:+PADDLE_GPU_VERSION=$PADDLE_GPU_VERSION} \
    >"$OUT/install.log" 2>&1 || fail "make install-gpu failed (tail of install.log: $(tail -3 "$OUT/install.log" | tr '\n' ' '))"
  end
  grep -E "^TensorRT|^linked|TensorRT .* NOT|WITHOUT TensorRT" "$OUT/install.log" | sed 's/^/- /' | tee -a "$REPORT"
  say ""
  if [ "$MODE" = install ]; then times; exit 0; fi
fi
[ -x .venv-gpu/bin/python ] || fail "no .venv-gpu: run bash load_tests/gpu_run.sh --install-only (make install-gpu) first"
[ -f "$STEPS" ] || : > "$STEPS"
PY=.venv-gpu/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
say ""

begin probe
"$PY" -m load_tests.gpu_smoke probe >"$OUT/probe.md" 2>"$OUT/probe.log"; probe_rc=$?
cat "$OUT/probe.md" >>"$REPORT"; cat "$OUT/probe.md"
[ $probe_rc -eq 0 ] || fail "paddle sees no GPU (probe.log: $(tail -2 "$OUT/probe.log" | tr '\n' ' '))"
end
say ""

begin engines
"$PY" -m load_tests.gpu_smoke engines --json "$OUT/engines.json" >"$OUT/engines.md" 2>"$OUT/engines.log" \
  || say "**engines step failed** (engines.log: $(tail -2 "$OUT/engines.log" | tr '\n' ' '))"
cat "$OUT/engines.md" >>"$REPORT"; cat "$OUT/engines.md"
end
say ""

# The profile as shipped (TensorRT where it loads: the replicas say), on loopback.
"$PY" - "$OUT/deployments.gpu.yaml" "$PORT" <<'PY' || fail "could not write the profile copy"
import os, sys, yaml
cfg = yaml.safe_load(open("deployments.gpu.yaml"))
cfg["http_options"]["host"] = "127.0.0.1"
cfg["http_options"]["port"] = int(sys.argv[2])
want = os.environ.get("TRT_PRECISION")  # every stage's TensorRT at this precision, checked against fp32 at start
if want:
    args = cfg["applications"][0]["args"]
    for stage in ("detector", "classifier", "recognizer"):
        trt = args.setdefault(stage, {}).setdefault("predictor", {}).setdefault("tensorrt", {})
        trt["precision"] = want
        trt.setdefault("cache_dir", "/tmp/ocr_trt_cache/" + {"detector": "det", "classifier": "cls"}.get(stage, "rec"))
yaml.safe_dump(cfg, open(sys.argv[1], "w"), sort_keys=False)
PY
# The profile needs its token (ingress.auth_token_env); a throwaway one for this run.
export OCR_AUTH_TOKEN=${OCR_AUTH_TOKEN:-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}
rm -rf /tmp/ocr_trt_cache  # a first start: engines built here, timed below
begin "serve run to ready"
t0=$(date +%s)
.venv-gpu/bin/serve run "$OUT/deployments.gpu.yaml" >"$OUT/serve.log" 2>&1 &
SERVE=$!
trap 'kill -INT $SERVE 2>/dev/null; wait $SERVE 2>/dev/null' EXIT
ready=""
while [ $(( $(date +%s) - t0 )) -lt "$READY_TIMEOUT" ]; do
  if curl -sf --max-time 5 "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then ready=1; break; fi
  kill -0 $SERVE 2>/dev/null || fail "serve run exited (serve.log: $(grep -m3 -E 'Error|error' "$OUT/serve.log" | tr '\n' ' '))"
  if grep -q "DEPLOY_FAILED" "$OUT/serve.log"; then
    fail "the app failed to deploy (serve.log: $(grep -m3 -E 'ConfigError|Error' "$OUT/serve.log" | tr '\n' ' '))"
  fi
  sleep 5
done
[ -n "$ready" ] || fail "not ready within ${READY_TIMEOUT}s (READY_TIMEOUT; serve.log: $(grep -m3 -E 'Error|error' "$OUT/serve.log" | tr '\n' ' '))"
say "- deploy to ready (first start, empty TensorRT cache): $(( $(date +%s) - t0 )) s"
end

begin "load (service)"
"$PY" -m load_tests.gpu_smoke service --url "http://127.0.0.1:$PORT" --engines "$OUT/engines.json" \
  --seconds "$SECONDS_LOAD" --clients "$CLIENTS" >"$OUT/service.md" 2>"$OUT/service.log"; svc_rc=$?
cat "$OUT/service.md" >>"$REPORT"; cat "$OUT/service.md"
[ $svc_rc -eq 0 ] || say "**service step: errors under load or none served** (service.log)"
end "$([ $svc_rc -eq 0 ] && echo ok || echo errors)"
times
say ""
say "Logs: $OUT (preflight.log, install.log, serve.log, engines.log, service.log). Report: $REPORT"
