# Fresh machine: `make demo` or `make test`. Both set up .venv/ first (idempotent, seconds when up to date).
SHELL := /bin/bash
VENV := .venv
export CONVCHECK_CACHE_DIR ?= $(CURDIR)/.cache
export OMP_NUM_THREADS ?= 1
PYTEST_WORKERS ?= 2

.PHONY: setup demo test lint bench clean

setup:
	@scripts/setup-venv.sh

demo: setup
	$(VENV)/bin/convcheck verify --model tiny:qwen3-moe --tp 2 --ep 2

test: setup
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -q --durations=15 tests

lint: setup
	$(VENV)/bin/ruff check convcheck tests bench examples scripts --select E,F,W,B,I --ignore B905
	$(VENV)/bin/ruff format --check convcheck tests bench examples scripts

bench: setup
	$(VENV)/bin/python bench/run_all.py

clean:
	rm -rf $(VENV) .cache
