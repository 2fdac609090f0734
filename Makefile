# Everything runs from a virtual environment in .venv holding the pinned SGLang
# (sglang==0.5.17, pulled by python/pyproject.toml) and this package.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONCURRENCIES ?= 1,8,32,128
BENCH_OUT ?= benchmark/results/latest
BENCH_ARGS ?=

.PHONY: install test gpu-test bench require-gpu lint clean

$(STAMP): python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e "python[test]"
	touch $(STAMP)

install: $(STAMP)

# CPU unit suite against the real SGLang classes (what CI runs).
test: install
	$(BIN)/python -m pytest test/unit

# GPU suite: token equality, graph replays, KV accounting (needs one CUDA GPU).
gpu-test: require-gpu install
	$(BIN)/python -m pytest -m gpu test/gpu -v

# Main job: serve the shipped dummy Llama-3-8B-shaped pair in each mode (no speculation,
# static EAGLE-3, upstream adaptive, threshold policy), drive each with a closed-loop
# sweep, an open-loop rate sweep and a time-varying load, write JSON lines, a table and
# plots to BENCH_OUT. BENCH_ARGS passes more options (see --help).
bench: require-gpu install
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m sglang_adaptive.bench \
		--closed "$(CONCURRENCIES)" --out "$(BENCH_OUT)" $(BENCH_ARGS)

require-gpu:
	@command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || { \
		echo "This needs an NVIDIA GPU and none was found; 'make test' runs the CPU suite."; exit 1; }

lint: install
	$(BIN)/python -m pip install -q ruff
	$(BIN)/ruff check python test benchmark

clean:
	rm -rf $(VENV) python/*.egg-info
