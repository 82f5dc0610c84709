# The two commands of the README do all the set-up: `make demo` and `make test`.
# Each creates .venv and installs what it needs when missing; later runs reuse it
# (a changed pyproject.toml triggers a re-install).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
REF    := $(VENV)/.installed-ref
TRITON := $(VENV)/.installed-triton
PYTEST := $(BIN)/python -m pytest -q -n 2

.PHONY: demo test test-ref test-triton test-slow bench numerics clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,hf,control]'
	@touch $@

$(REF): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,hf,control,ref]'
	@touch $@

$(TRITON): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,hf,control,triton]'
	@touch $@

demo: $(STAMP)  ## the main job on the embedded default: the quickstart RL run
	$(BIN)/lrl-jax demo

test: $(STAMP)  ## the default suite (< 15 min on 2 CPU cores)
	$(PYTEST) -m "not slow and not ref and not device and not triton"

test-ref: $(REF)  ## parity tests against torch / transformers; a skip here is a failure
	LRL_JAX_REQUIRE_REF=1 $(PYTEST) -m ref

test-triton: $(TRITON)  ## the GPU kernels compiled for sm_90 by triton + ptxas (no GPU needed); a skip is a failure
	LRL_JAX_REQUIRE_TRITON=1 $(PYTEST) -m triton

test-slow: $(REF)  ## checks too slow for the default suite
	$(PYTEST) -m "slow and not ref and not device and not triton"

bench: $(STAMP)  ## kernel benchmark (quick sizes on CPU)
	$(BIN)/lrl-jax bench kernels --quick

numerics: $(STAMP)
	$(BIN)/lrl-jax numerics

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
