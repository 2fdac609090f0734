# Everything runs from a virtual environment in .venv holding the pinned SGLang
# (sglang==0.5.17, pulled by python/pyproject.toml) and this package.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONCURRENCIES ?= 1 8 32 128

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

# Main job: serve the shipped dummy Llama-3-8B-shaped pair in each mode and compare.
bench: require-gpu install
	PATH="$(abspath $(BIN)):$$PATH" OUT="$${OUT:-benchmark/results/latest}" \
		sh -c 'mkdir -p "$$OUT" && benchmark/compare_adaptive.sh "$(CONCURRENCIES)" \
		&& python benchmark/report.py "$$OUT/compare.jsonl"'

require-gpu:
	@command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || { \
		echo "This needs an NVIDIA GPU and none was found; 'make test' runs the CPU suite."; exit 1; }

lint: install
	$(BIN)/python -m pip install -q ruff
	$(BIN)/ruff check python test benchmark

clean:
	rm -rf $(VENV) python/*.egg-info
