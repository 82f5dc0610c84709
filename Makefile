# The two commands of the README do all the set-up: `make demo` and `make test`.
# Each creates .venv and installs what it needs when missing; later runs reuse it
# (a changed pyproject.toml triggers a re-install).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
REF    := $(VENV)/.installed-ref
AOT    := $(VENV)/.installed-aot
DOCS   := $(VENV)/.installed-docs
LIBTPU := $(VENV)/libtpu
CUDA_AOT := $(VENV)/cuda-aot
# --dist loadfile: a test file's tests share one worker, so its module fixtures and compiled programs are made once
PYTEST := $(BIN)/python -m pytest -q -n 2 --dist loadfile

.PHONY: demo test lint format test-ref test-aot test-slow test-multiprocess docs bench numerics clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,hf,control]'
	@touch $@

$(REF): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,hf,control,ref]'
	@touch $@

# triton in the venv; libtpu (the version jax's `tpu` extra pins) and jax's CUDA plugin (jaxlib's own version: it
# compiles whole programs for a GPU that is not here, lrl_jax.kernels.gpu_aot) beside it, on the path of `make
# test-aot` only, so that nothing else in the venv tries to start a TPU or GPU backend.
$(AOT): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,hf,control,aot]'
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(LIBTPU) "$$($(BIN)/python -c 'import importlib.metadata as m; \
	  print(next(r.split(";")[0].replace(" ", "") for r in m.requires("jax") if r.startswith("libtpu")))')"
	v=$$($(BIN)/python -c 'import jaxlib; print(jaxlib.__version__)') && $(BIN)/python -m pip install -q --no-deps \
	  --upgrade --target $(CUDA_AOT) "jax-cuda13-plugin==$$v" "jax-cuda13-pjrt==$$v"
	@touch $@

$(DOCS): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,hf,control,docs]'
	@touch $@

demo: $(STAMP)  ## the main job on the embedded default: the quickstart RL run
	$(BIN)/lrl-jax demo

test: lint  ## the linter, then the default suite (< 15 min on 2 CPU cores)
	$(PYTEST) --durations=15 -m "not slow and not ref and not device and not aot and not multiprocess"

test-multiprocess: $(STAMP)  ## jax.distributed across processes on 127.0.0.1 (each test starts its own; no xdist)
	$(BIN)/python -m pytest -q -m multiprocess

lint: $(STAMP)  ## the formatter and the linter (ruff, configured in pyproject.toml): the tree must be formatted and clean
	$(BIN)/ruff format --check --diff .
	$(BIN)/ruff check .

format: $(STAMP)  ## format the tree and apply the linter's safe fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test-ref: $(REF)  ## parity tests against torch / transformers; a skip here is a failure
	LRL_JAX_REQUIRE_REF=1 $(PYTEST) -m ref

test-aot: $(AOT)  ## the kernels compiled ahead of time for sm_90 (triton + ptxas) and TPU v4-v6e (libtpu), the learner step for a TPU chip and an H100 (XLA:GPU); no accelerator needed, a skip is a failure
	LRL_JAX_REQUIRE_AOT=1 JAX_PLATFORMS=cpu TPU_ACCELERATOR_TYPE=v5litepod-4 ALLOW_MULTIPLE_LIBTPU_LOAD=1 \
	  PYTHONPATH=$(LIBTPU):$(CUDA_AOT) $(PYTEST) -m aot

test-slow: $(REF)  ## checks too slow for the default suite
	$(PYTEST) -m "slow and not ref and not device and not aot"

docs: $(DOCS)  ## the API reference (pdoc) in build/api/; fails on a pdoc warning, an __all__ name shown without its signature, a broken docstring reference
	rm -rf build/api
	JAX_PLATFORMS=cpu $(BIN)/python scripts/check_api_docs.py build/api

bench: $(STAMP)  ## kernel benchmark (quick sizes on CPU)
	$(BIN)/lrl-jax bench kernels --quick

numerics: $(STAMP)
	$(BIN)/lrl-jax numerics

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
