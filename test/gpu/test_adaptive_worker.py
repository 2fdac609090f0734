"""AdaptiveEAGLEWorker on a real GPU, dummy Llama-3-8B-shaped pair.

Only what dummy weights can show (see suite.py): graph replays per mode at 8B
shapes, the modes each configuration claims, KV accounting, healthy servers. No
token equality: SGLang's dummy weights give near-uniform logits, where a wrong KV
slot or position leaves the greedy token unchanged (static EAGLE-3 accepts 1.01
tokens per verify); correctness is shown on the trained tiny pair. On the GPU host:

    source .gpu-bundle/gpu/setup-host.sh && source scripts/install-on-gpu-host.sh
    ADAPTIVE_GPU_PARALLEL=4 python -m pytest -m gpu test/gpu/test_adaptive_worker.py -v   # ~4 min on one H200

``ADAPTIVE_GPU_NUM`` sets the number of requests (default 200).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from suite import *  # noqa: F401,F403  (the shared tests, collected against this pair)
from suite import ADAPTIVE, base_args, collect, configs

from sglang_adaptive.testing import make_requests

pytestmark = pytest.mark.gpu

MODELS = Path(__file__).resolve().parents[2] / "benchmark" / "models"
NUM = int(os.environ.get("ADAPTIVE_GPU_NUM", "200"))
# Small enough that 32 concurrent requests press on it (and may force retraction).
MAX_TOTAL_TOKENS = 10000


@pytest.fixture(scope="module")
def runs():
    base = base_args("--model-path", str(MODELS / "llama3-8b"), "--load-format", "dummy",
                     "--max-total-tokens", str(MAX_TOTAL_TOKENS))
    table = configs(base, MODELS / "llama3-8b-eagle3", labels=ADAPTIVE)
    return collect("dummy-llama3-8b", table, make_requests(NUM))
