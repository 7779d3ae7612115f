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

# `make test` is the README's test command, `pytest -m "not slow" tests`, run
# in two disjoint parts: the unit tier first (`make test-quick`, seconds, no
# Ray, no models) so a broken build fails fast, then everything else. Each
# test runs once. Exit 5 (no tests selected) is not a failure.
test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -m "unit and not slow" tests/unit || [ $$? -eq 5 ]

test: test-quick
	$(BIN)/python -m pytest -q --durations=15 -m "not slow and not unit" tests || [ $$? -eq 5 ]

bench-engine: $(STAMP)
	$(BIN)/python load_tests/bench_engine.py

clean:
	rm -rf $(VENV) *.egg-info
