# Fresh machine: `make demo` or `make test`. Both set up .venv/ first (idempotent, seconds when up to date).
SHELL := /bin/bash
VENV := .venv
export CONVCHECK_CACHE_DIR ?= $(CURDIR)/.cache
export OMP_NUM_THREADS ?= 1
PYTEST_WORKERS ?= 2

.PHONY: setup demo test lint bench clean env test-release

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

# Older Megatron-Bridge releases (requirements/releases.toml): `make env BRIDGE=0.5.1` makes .venv-bridge-0.5.1/
# (base venv: $$CONVCHECK_BASE_VENV, else .venv); `make test-release BRIDGE=0.5.1` runs, in it, the release checks and
# smoke (tests/test_releases.py: verify of tiny:qwen3 and tiny:qwen3-moe at TP1 and TP2) and every compat shim test.
RELEASE_TESTS := tests/test_releases.py tests/test_compat.py tests/test_compat_shims.py tests/test_compat_device.py \
	tests/test_compat_forward.py tests/test_compat_hybrid.py tests/test_compat_hybrid_forward.py

env:
	@scripts/make-env.sh $(BRIDGE)

test-release: env
	CONVCHECK_RELEASE_SMOKE=1 .venv-bridge-$(BRIDGE)/bin/python -m pytest -q -rs -p no:cacheprovider $(RELEASE_TESTS)

clean:
	rm -rf $(VENV) .cache .venv-bridge-*
