# `make serve` and `make test` do all the set-up on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install serve test test-quick bench-engine clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[cpu,test,bench]"
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/serve run deployments.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

bench-engine: $(STAMP)
	$(BIN)/python load_tests/bench_engine.py

clean:
	rm -rf $(VENV) *.egg-info
