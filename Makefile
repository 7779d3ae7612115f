# `make serve` and `make test` do all the set-up on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install serve test test-quick test-system bench-engine rayservice clean install-gpu serve-gpu gpu-run

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[cpu,test,bench]"
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/serve run deployments.yaml

# `make test` is the README's test command, `pytest -m "not slow" tests`, run
# in two disjoint parts: the unit tier first (`make test-quick`, seconds, no
# Ray, no models) so a broken build fails fast, then everything else. Each
# test runs once. Exit 5 (no tests selected) is not a failure.
# The job-book tests of the unit tier drive a real redis-server: test-system first.
test-quick: $(STAMP) test-system
	$(BIN)/python -m pytest -q -m "unit and not slow" tests/unit || [ $$? -eq 5 ]

# Debian packages some integration/e2e tests drive (tests/system/packages.txt).
test-system:
	bash tests/system/install.sh

test: test-quick test-system
	$(BIN)/python -m pytest -q --durations=15 -m "not slow and not unit" tests || [ $$? -eq 5 ]

bench-engine: $(STAMP)
	$(BIN)/python load_tests/bench_engine.py

# deploy/kuberay/rayservice.yaml from its template and deployments.gpu.yaml (a test checks it is current).
rayservice: $(STAMP)
	$(BIN)/python -m serve_app.tools.rayservice

# GPU: a separate environment (.venv-gpu), so that `make serve` / `make test`
# keep the CPU build (both builds provide the `paddle` module; one per env).
# paddlepaddle-gpu 3.x is only on Paddle's own index, one per CUDA version:
# CUDA=cu126 needs an NVIDIA driver >= 550.54.14, CUDA=cu118 >= 450.80.02
# (Paddle's install docs; from Paddle's docs, not yet run on a GPU here).
# The wheel brings its CUDA/cuDNN runtime as pip packages; TensorRT is not in
# it (load_tests/gpu_run.sh checks and says). PyPI stays the index for the rest.
CUDA ?= cu126
PADDLE_GPU_VERSION ?= 3.3.1
PADDLE_INDEX ?= https://www.paddlepaddle.org.cn/packages/stable/$(CUDA)/
GPU_VENV ?= .venv-gpu
GPU_STAMP := $(GPU_VENV)/.installed-$(CUDA)-$(PADDLE_GPU_VERSION)

$(GPU_STAMP): pyproject.toml
	$(PY) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q --upgrade pip
	$(GPU_VENV)/bin/pip install -q "paddlepaddle-gpu==$(PADDLE_GPU_VERSION)" \
	  --index-url $(PADDLE_INDEX) --extra-index-url https://pypi.org/simple
	$(GPU_VENV)/bin/pip install -q -e ".[gpu,test,bench]"
	$(GPU_VENV)/bin/python -c "import paddle; print('paddle', paddle.__version__, 'CUDA build:', paddle.is_compiled_with_cuda(), 'CUDA', paddle.version.cuda())"
	touch $(GPU_STAMP)

install-gpu: $(GPU_STAMP)

serve-gpu: $(GPU_STAMP)
	$(GPU_VENV)/bin/serve run deployments.gpu.yaml

# The one GPU proof run: install, CPU vs GPU text, ms/img, the profile under
# load, per-replica GPU memory and batch sizes, into one report file.
gpu-run:
	bash load_tests/gpu_run.sh

clean:
	rm -rf $(VENV) $(GPU_VENV) *.egg-info
