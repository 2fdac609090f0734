"""AdaptiveEAGLEWorker on a real GPU: token equality, graph replays, KV accounting.

One module-scoped run starts each server configuration in turn on the dummy
Llama-3-8B-shaped pair (real kernels, no simulated acceptance) and sends the same
greedy requests (mixed prompt and output lengths). Every test then reads what that
run produced. Run on the GPU host:

    source .gpu-bundle/gpu/setup-host.sh && source scripts/install-on-gpu-host.sh
    python -m pytest -m gpu test/gpu/test_adaptive_worker.py -v   # ~9 min on one H200

``ADAPTIVE_GPU_NUM`` sets the number of requests (default 200).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sglang_adaptive.testing import COMMON_ARGS, eagle3_args, first_mismatch, make_requests, run_configs

pytestmark = pytest.mark.gpu

MODELS = Path(__file__).resolve().parents[2] / "benchmark" / "models"
TARGET_8B = MODELS / "llama3-8b"
DRAFT_8B = MODELS / "llama3-8b-eagle3"

NUM = int(os.environ.get("ADAPTIVE_GPU_NUM", "200"))
MAX_BS = 32
# Small enough that 32 concurrent requests press on it (and may force retraction).
MAX_TOTAL_TOKENS = 10000
DEBUG_ENV = {
    "SGLANG_LOG_DECODE_GRAPH_KEY": "1",
    "SGLANG_IS_IN_CI": "1",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_ADAPTIVE_AUDIT_KV": "1",
}
RAMP = [(0, 1), (20, 4), (60, 16), (120, 32)]


def _base():
    return COMMON_ARGS + [
        "--model-path", str(TARGET_8B), "--load-format", "dummy",
        "--max-running-requests", str(MAX_BS), "--cuda-graph-max-bs", str(MAX_BS),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS), "--decode-log-interval", "1",
        "--skip-server-warmup",
    ]


def _spec(*extra):
    return _base() + eagle3_args(DRAFT_8B) + list(extra)


# label -> (server args, env, concurrency or ramp)
CONFIGS = {
    "plain": (_base(), {}, 32),
    "eagle3": (_spec(), {}, 16),
    "alternate-1": (_spec("--speculative-switch-policy", "alternate",
                          "--speculative-switch-alternate-period", "1"), DEBUG_ENV, 16),
    "alternate-7-no-overlap": (_spec("--speculative-switch-policy", "alternate",
                                     "--speculative-switch-alternate-period", "7",
                                     "--disable-overlap-schedule"), DEBUG_ENV, 16),
    "threshold-8-ramp": (_spec("--speculative-disable-batch-threshold", "8"), DEBUG_ENV, RAMP),
    "threshold-0": (_spec("--speculative-disable-batch-threshold", "0"), DEBUG_ENV, 32),
}
ADAPTIVE = [k for k in CONFIGS if k not in ("plain", "eagle3")]

@pytest.fixture(scope="module")
def runs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = run_configs(CONFIGS, make_requests(NUM))
    summary = {}
    for label, run in out.items():
        summary[label] = {"error": run.error}
        if run.error is not None:
            continue
        summary[label]["peak_running"] = run.peak_running()
        summary[label]["equal_requests"] = sum(a == b for a, b in zip(out["plain"].ids or [], run.ids))
        if label in ADAPTIVE:
            summary[label].update(run.stats(), decode_replays=run.replays("DECODE"),
                                  verify_replays=run.replays("TARGET_VERIFY"))
    path = os.path.join(os.environ.get("OUT", "/tmp"), "gpu-equality-summary.json")
    with open(path, "w") as f:
        json.dump({"num_requests": NUM, "configs": summary}, f, indent=1)
    return out


@pytest.mark.parametrize("label", [k for k in CONFIGS if k != "plain"])
def test_greedy_tokens_equal_plain_server(runs, label):
    assert runs["plain"].error is None, runs["plain"].error
    assert runs[label].error is None, runs[label].error
    ref, got = runs["plain"].ids, runs[label].ids
    assert len(got) == len(ref) == NUM
    assert first_mismatch(ref, got) is None, f"first mismatch (request, token, len): {first_mismatch(ref, got)}"


@pytest.mark.parametrize("label", ADAPTIVE)
def test_each_mode_replays_its_own_graphs(runs, label):
    run = runs[label]
    assert run.error is None, run.error
    stats = run.stats()
    # One target graph replay per decode batch, in the batch's mode: plain batches on
    # DECODE graphs, speculative ones on TARGET_VERIFY graphs, and no eager fallback
    # (every batch size here is captured).
    assert run.replays("DECODE") == stats["plain"]
    assert run.replays("TARGET_VERIFY") == stats["spec"]
    if label.startswith("alternate"):
        assert stats["plain"] > 0 and stats["spec"] > 0 and stats["switches"] > 0


def test_always_plain_reserves_at_most_two_slots(runs):
    run = runs["threshold-0"]
    assert run.error is None, run.error
    stats = run.stats()
    assert stats["spec"] == 0 and stats["plain"] > 0
    assert 1 <= stats["max_reserve"] <= 2


def test_always_plain_admits_as_many_requests_as_plain_server(runs):
    assert runs["threshold-0"].error is None and runs["plain"].error is None
    assert runs["threshold-0"].peak_running() >= runs["plain"].peak_running()


@pytest.mark.parametrize("label", ADAPTIVE)
def test_debug_checks_stay_quiet(runs, label):
    log = runs[label].log
    for needle in ("memory leak", "Traceback", "AssertionError"):
        assert needle not in log, f"{needle!r} in the {label} server log"
