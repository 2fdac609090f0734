"""The core-worker correctness suite, shared by every target/draft pair.

A test module defines ``PAIR_LABEL``, builds ``configs(base_args, draft_dir)`` and
a module-scoped ``runs`` fixture with ``collect(...)``, then imports the tests with
``from suite import *``: pytest collects them in that module, against that pair.
"""

from __future__ import annotations

import json
import os

import pytest

from sglang_adaptive.testing import (
    COMMON_ARGS,
    STATS_RE,
    divergences,
    eagle3_args,
    mismatching_requests,
    run_configs,
    with_top_logprobs,
)

MAX_BS = 32
DEBUG_ENV = {
    "SGLANG_LOG_DECODE_GRAPH_KEY": "1",
    "SGLANG_IS_IN_CI": "1",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
    "SGLANG_ADAPTIVE_AUDIT_KV": "1",
}
RAMP = [(0, 1), (20, 4), (60, 16), (120, 32)]
LABELS = ("plain", "eagle3", "alternate-1", "alternate-7-no-overlap", "threshold-8-ramp", "threshold-0",
          "threshold-0-no-overlap")
ADAPTIVE = LABELS[2:]
# Greedy outputs may leave the plain server's path only at a numerical near-tie: where
# the plain server ranks the other server's token within this many nats of its own.
# Its logits are bf16: at the tiny pair's median top logit (10) their spacing is
# 0.0625, 1.7% of generated positions are exact ties and 9% within 0.125 (CPU, 60 of
# the suite's requests). Verify (extend kernels, 4 tokens a request) and decode
# kernels round differently, so even upstream's static EAGLE-3 flips such ties (on the
# H200 every divergence of every configuration, upstream's included, was at most
# 0.0625); skipped positions or stale KV pick tokens the plain server ranks far lower.
NEAR_TIE_NATS = 0.125
# Requests running while others wait for memory, averaged over those decode batches:
# two plain servers (plain, plain-deterministic) differed by 1% on the tiny pair. An
# always-plain server that kept the speculative reserve (8 slots a request instead of
# 2) would give up about 2% of this KV budget; the reserve itself is checked exactly by
# test_always_plain_reserves_at_most_two_slots.
ADMISSION_TOLERANCE = 0.02

__all__ = [
    "test_greedy_tokens_equal_plain_server_but_at_near_ties",
    "test_each_mode_replays_its_own_graphs",
    "test_always_plain_reserves_at_most_two_slots",
    "test_always_plain_admits_as_many_requests_as_plain_server",
    "test_debug_checks_stay_quiet",
]


def base_args(*model_args: str) -> list[str]:
    return COMMON_ARGS + [
        *model_args,
        "--max-running-requests", str(MAX_BS), "--cuda-graph-max-bs", str(MAX_BS),
        "--decode-log-interval", "1", "--skip-server-warmup",
    ]


def configs(base: list[str], draft) -> dict:
    """label -> (server args, env, concurrency or ramp)."""
    spec = base + eagle3_args(draft)
    # Every configuration runs with the same debug environment (SGLANG_IS_IN_CI also
    # turns on upstream's FutureMap poisoning under overlap), so the references
    # differ from the adaptive runs only in the mode.
    return {
        "plain": (base, DEBUG_ENV, 32),
        "eagle3": (spec, DEBUG_ENV, 16),
        "alternate-1": (spec + ["--speculative-switch-policy", "alternate",
                                "--speculative-switch-alternate-period", "1"], DEBUG_ENV, 16),
        "alternate-7-no-overlap": (spec + ["--speculative-switch-policy", "alternate",
                                           "--speculative-switch-alternate-period", "7",
                                           "--disable-overlap-schedule"], DEBUG_ENV, 16),
        "threshold-8-ramp": (spec + ["--speculative-disable-batch-threshold", "8"], DEBUG_ENV, RAMP),
        "threshold-0": (spec + ["--speculative-disable-batch-threshold", "0"], DEBUG_ENV, 32),
        # Same as threshold-0 without the overlap scheduler: separates a defect of the
        # overlapped plain path from one of the plain step itself.
        "threshold-0-no-overlap": (spec + ["--speculative-disable-batch-threshold", "0",
                                           "--disable-overlap-schedule"], DEBUG_ENV, 32),
    }


# Configurations that change the numerics (kernels, dtype) carry a suffix and are
# compared with the plain server of the same suffix: "eagle3-fp32" with "plain-fp32".
NUMERIC_VARIANTS = ("deterministic", "fp32")


def reference_label(label: str) -> str:
    for variant in NUMERIC_VARIANTS:
        if label.endswith("-" + variant):
            return "plain-" + variant
    return "plain"


def collect(pair_label: str, config_table: dict, reqs: list[dict]):
    """Run every configuration (skips without a GPU) and write a JSON summary under $OUT."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    # Reference servers also return their top logprobs, to tell near-ties from defects.
    refs = {reference_label(label) for label in config_table} & set(config_table)
    out = run_configs(config_table, reqs, requests_for={r: with_top_logprobs(reqs) for r in refs})
    summary = {}
    for label, run in out.items():
        summary[label] = {"error": run.error}
        if run.error is not None:
            continue
        summary[label]["peak_running"] = run.peak_running()
        summary[label]["memory_bound_concurrency"] = round(run.memory_bound_concurrency(), 3)
        ref = out[reference_label(label)]
        summary[label]["reference"] = reference_label(label)
        summary[label]["equal_requests"] = (
            0 if ref.ids is None else len(run.ids) - len(mismatching_requests(ref.ids, run.ids)))
        if ref.results is not None and ref is not run:
            div = divergences(ref.results, run.ids)
            summary[label]["divergences"] = [[d.request, d.token, round(d.gap, 4)] for d in div]
            summary[label]["max_divergence_gap"] = max((d.gap for d in div), default=0.0)
        if label != "plain" and out["plain"].ids is not None:
            summary[label]["equal_to_plain"] = len(run.ids) - len(
                mismatching_requests(out["plain"].ids, run.ids))
        if label.startswith("eagle3"):
            summary[label]["accept_length"] = round(run.accept_length(), 3)
        if STATS_RE.search(run.log):  # an adaptive server
            summary[label].update(run.stats(), decode_replays=run.replays("DECODE"),
                                  verify_replays=run.replays("TARGET_VERIFY"))
    path = os.path.join(os.environ.get("OUT", "/tmp"), f"gpu-suite-{pair_label}.json")
    with open(path, "w") as f:
        json.dump({"pair": pair_label, "num_requests": len(reqs), "configs": summary}, f, indent=1)
    return out


@pytest.mark.parametrize("label", [k for k in LABELS if k != "plain"])
def test_greedy_tokens_equal_plain_server_but_at_near_ties(runs, label):
    assert runs["plain"].error is None, runs["plain"].error
    assert runs[label].error is None, runs[label].error
    ref, got = runs["plain"].results, runs[label].ids
    assert len(got) == len(ref)
    div = divergences(ref, got)
    off = [d for d in div if d.gap > NEAR_TIE_NATS]
    assert not off, (f"{len(off)} of {len(ref)} requests left the plain server's greedy path where it "
                     f"was not near-tied (> {NEAR_TIE_NATS} nats); first {off[:5]}")


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
    ref = runs["plain"].memory_bound_concurrency()
    got = runs["threshold-0"].memory_bound_concurrency()
    assert ref > 0, "the load never queued on the plain server: nothing measured"
    assert got >= ref * (1 - ADMISSION_TOLERANCE), f"{got:.2f} running requests under memory pressure, plain {ref:.2f}"


@pytest.mark.parametrize("label", ADAPTIVE)
def test_debug_checks_stay_quiet(runs, label):
    log = runs[label].log
    for needle in ("memory leak", "Traceback", "AssertionError"):
        assert needle not in log, f"{needle!r} in the {label} server log"
