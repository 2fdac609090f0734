"""The core-worker GPU suite, shared by every target/draft pair.

A test module defines a module-scoped ``runs`` fixture with ``collect(...)`` over
``configs(base_args, draft_dir)``, then imports the tests with
``from suite import *``: pytest collects them in that module, against that pair.

What these shared tests check holds on any weights: each batch replays its own
mode's graphs, each configuration ran the modes it claims, always-plain reserves at
most 2 KV slots a request, and the servers' debug checks stay quiet. Token
equality needs trained weights (dummy weights give near-uniform logits, where a
wrong context or position leaves the greedy token unchanged) and lives in
``test_tiny_pair.py``.
"""

from __future__ import annotations

import json
import os

import pytest

from sglang_adaptive.testing import (
    COMMON_ARGS,
    STATIC_ARGS,
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
# fp32 with IEEE arithmetic is where equality is exact. Deterministic inference is
# what lets fp32 start at all (SGLang's CUDA rmsnorm has no fp32 kernel, its
# batch-invariant path does); Triton's dots round fp32 inputs to TF32 unless
# TRITON_F32_DEFAULT=ieee (own kernel cache: the choice is made at compile time).
FP32_ARGS = ["--dtype", "float32", "--enable-deterministic-inference"]
ENV32 = {**DEBUG_ENV, "TRITON_F32_DEFAULT": "ieee", "TRITON_CACHE_DIR": "/tmp/triton-cache-f32-ieee"}
RAMP = [(0, 1), (20, 4), (60, 16), (120, 32)]
ALTERNATE = ("alternate-1", "alternate-1-no-overlap", "alternate-7", "alternate-7-no-overlap")
ALWAYS_PLAIN = ("threshold-0", "threshold-0-no-overlap")
ADAPTIVE = (*ALTERNATE, "threshold-8-ramp", *ALWAYS_PLAIN)
LABELS = ("plain", "eagle3", *ADAPTIVE)
# The goodput policy picks its own modes (it speculates first, to measure): served
# beside the others where a pair lists it, and checked for tokens and modes only.
GOODPUT = "goodput"

# The modes each configuration must show in its mode counters: (plain batches,
# speculative batches, switches), each "some" (> 0) or 0.
EXPECTED_MODES = {
    **{label: ("some", "some", "some") for label in ALTERNATE},
    "threshold-8-ramp": ("some", "some", "some"),
    **{label: ("some", 0, 0) for label in ALWAYS_PLAIN},
    GOODPUT: ("any", "some", "any"),
}

# Serve only these configurations (comma-separated labels), e.g. for a quick check.
ONLY_ENV = "ADAPTIVE_GPU_ONLY"

# A mutant (test/mutants.py) served in a configuration: "CONFIG~MUTANT".
MUTANT_SEP = "~"

__all__ = [
    "test_each_mode_replays_its_own_graphs",
    "test_each_configuration_ran_the_modes_it_claims",
    "test_always_plain_reserves_at_most_two_slots",
    "test_servers_stay_healthy_and_the_kv_audit_ran",
    "test_every_tensor_parallel_rank_takes_the_same_mode",
]


def base_args(*model_args: str) -> list[str]:
    return COMMON_ARGS + [
        *model_args,
        "--max-running-requests", str(MAX_BS), "--cuda-graph-max-bs", str(MAX_BS),
        "--decode-log-interval", "1", "--skip-server-warmup",
    ]


def configs(base: list[str], draft, labels=LABELS, env=None) -> dict:
    """label -> (server args, env, concurrency or ramp)."""
    env = DEBUG_ENV if env is None else env
    spec = base + eagle3_args(draft)
    no_overlap = ["--disable-overlap-schedule"]

    def alternate(period):
        return spec + ["--speculative-switch-policy", "alternate",
                       "--speculative-switch-alternate-period", str(period)]

    # Every configuration runs with the same debug environment (SGLANG_IS_IN_CI also
    # turns on upstream's FutureMap poisoning under overlap), so the references
    # differ from the adaptive runs only in the mode.
    table = {
        "plain": (base, env, 32),
        "eagle3": (spec + list(STATIC_ARGS), env, 16),
        "alternate-1": (alternate(1), env, 16),
        "alternate-1-no-overlap": (alternate(1) + no_overlap, env, 16),
        "alternate-7": (alternate(7), env, 16),
        "alternate-7-no-overlap": (alternate(7) + no_overlap, env, 16),
        "threshold-8-ramp": (spec + ["--speculative-disable-batch-threshold", "8"], env, RAMP),
        "threshold-0": (spec + ["--speculative-disable-batch-threshold", "0"], env, 32),
        # Without the overlap scheduler: separates a defect of the overlapped plain
        # path from one of the plain step itself.
        "threshold-0-no-overlap": (spec + ["--speculative-disable-batch-threshold", "0"] + no_overlap, env, 32),
        GOODPUT: (spec + ["--speculative-switch-policy", "goodput"], env, RAMP),
    }
    return {label: table[label] for label in labels}


def base_label(label: str) -> str:
    """The configuration a label runs: without its mutant suffix."""
    return label.split(MUTANT_SEP)[0]


def collect(pair_label: str, config_table: dict, reqs: list[dict], *, references=None,
            requests_for=None, noise_pairs=()):
    """Run every configuration and write a JSON summary under $OUT.

    ``references``: label -> the no-spec label whose tokens it must equal (and whose
    top logprobs judge a divergence); ``noise_pairs``: pairs of no-spec servers
    whose disagreement measures the numerical noise. Without a usable GPU the tests
    skip, or fail when ``ADAPTIVE_GPU_REQUIRED=1`` (``make gpu-test``).
    """
    require_gpu()
    only = os.environ.get(ONLY_ENV)
    if only:  # a quick run of some configurations (and what they are compared with)
        keep = set(only.split(","))
        config_table = {k: v for k, v in config_table.items() if k in keep}
        references = {k: v for k, v in (references or {}).items() if k in keep}
        noise_pairs = [p for p in noise_pairs if set(p) <= keep]
    references = references or {}
    requests_for = dict(requests_for or {})
    for ref in set(references.values()) | {x for pair in noise_pairs for x in pair}:
        requests_for[ref] = with_top_logprobs(requests_for.get(ref, reqs))
    out = run_configs(config_table, reqs, requests_for=requests_for)
    summary = {}
    for label, run in out.items():
        entry = summary[label] = {"problems": run.problems()}
        if run.results is None:
            continue
        entry["peak_running"] = run.peak_running()
        entry["memory_bound_concurrency"] = round(run.memory_bound_concurrency(), 3)
        ref_label = references.get(label)
        if ref_label and out[ref_label].results is not None:
            ref = out[ref_label]
            div = divergences(ref.results, run.ids)
            entry.update(reference=ref_label,
                         equal_requests=len(run.ids) - len(mismatching_requests(ref.ids, run.ids)),
                         divergences=[[d.request, d.token, round(d.gap, 4)] for d in div],
                         max_divergence_gap=max((d.gap for d in div), default=0.0))
        if base_label(label).startswith("eagle3"):
            entry["accept_length"] = round(run.accept_length(), 3)
        if STATS_RE.search(run.log):  # an adaptive server
            entry.update(run.stats(), spec_accept_length=round(run.spec_accept_length(), 3),
                         decode_replays=run.replays("DECODE"), verify_replays=run.replays("TARGET_VERIFY"))
    for a, b in noise_pairs:
        if out[a].results is not None and out[b].results is not None:
            div = divergences(out[a].results, out[b].ids)
            summary[b]["noise_against"] = a
            summary[b]["noise_divergences"] = [[d.request, d.token, round(d.gap, 4)] for d in div]
    path = os.path.join(os.environ.get("OUT", "/tmp"), f"gpu-suite-{pair_label}.json")
    with open(path, "w") as f:
        json.dump({"pair": pair_label, "num_requests": len(reqs), "configs": summary}, f, indent=1)
    return out


def require_gpu() -> None:
    required = os.environ.get("ADAPTIVE_GPU_REQUIRED") == "1"
    try:
        import torch

        usable = torch.cuda.is_available() and torch.cuda.device_count() > 0
        why = "torch sees no CUDA device"
    except ImportError as e:
        usable, why = False, f"torch does not import ({e})"
    if not usable:
        if required:
            pytest.fail(f"ADAPTIVE_GPU_REQUIRED=1 but no GPU is usable: {why}", pytrace=False)
        pytest.skip(f"needs a CUDA GPU: {why}")


def assert_modes(label: str, run) -> dict:
    """The mode counters show what the configuration claims; returns them."""
    stats = run.check().stats()
    plain, spec, switches = EXPECTED_MODES[base_label(label)]
    for name, want in (("plain", plain), ("spec", spec), ("switches", switches)):
        got = stats[name]
        if want == "any":
            continue
        assert (got > 0) if want == "some" else (got == want), f"{label}: {name} batches {got}, want {want}; {stats}"
    if base_label(label).startswith("alternate-"):
        # K steps of one mode, then K of the other: a switch every K batches.
        period = int(base_label(label).split("-")[1])
        assert abs(stats["switches"] - stats["total"] // period) <= 1, stats
    return stats


@pytest.mark.parametrize("label", ADAPTIVE)
def test_each_mode_replays_its_own_graphs(runs, label):
    if label not in runs:
        pytest.skip(f"{label} is not served for this pair")
    run = runs[label].check()
    stats = run.stats()
    # One target graph replay per decode batch, in the batch's mode: plain batches on
    # DECODE graphs, speculative ones on TARGET_VERIFY graphs, and no eager fallback
    # (every batch size here is captured).
    assert run.replays("DECODE") == stats["plain"]
    assert run.replays("TARGET_VERIFY") == stats["spec"]


@pytest.mark.parametrize("label", ADAPTIVE)
def test_each_configuration_ran_the_modes_it_claims(runs, label):
    if label not in runs:
        pytest.skip(f"{label} is not served for this pair")
    assert_modes(label, runs[label])


@pytest.mark.parametrize("label", ALWAYS_PLAIN)
def test_always_plain_reserves_at_most_two_slots(runs, label):
    if label not in runs:
        pytest.skip(f"{label} is not served for this pair")
    stats = assert_modes(label, runs[label])
    # The audit records the largest allocated - committed over the plain batches.
    # Under overlap the step after a plain one may need 2 (1 in flight + 1); without
    # overlap 1 suffices.
    assert 1 <= stats["max_reserve"] <= (2 if "no-overlap" not in label else 1), stats


@pytest.mark.parametrize("label", ADAPTIVE)
def test_servers_stay_healthy_and_the_kv_audit_ran(runs, label):
    if label not in runs:
        pytest.skip(f"{label} is not served for this pair")
    stats = runs[label].check().stats()
    # Every configuration here runs plain batches with SGLANG_ADAPTIVE_AUDIT_KV=1: the
    # audit logs a reserve of at least 1 whenever it ran.
    assert stats["max_reserve"] >= 1, f"the KV audit did not run: {stats}"


@pytest.mark.parametrize("label", ADAPTIVE)
def test_every_tensor_parallel_rank_takes_the_same_mode(runs, label):
    if label not in runs:
        pytest.skip(f"{label} is not served for this pair")
    run = runs[label].check()
    per_rank = run.stats_per_rank()
    if len(per_rank) < 2:
        pytest.skip("one tensor-parallel rank")
    # Each rank's scheduler decides from the batch size and its own launch count,
    # identical on every rank; a rank that disagreed would hang in NCCL or show here.
    first = per_rank[0]
    for rank, stats in per_rank.items():
        assert {k: stats[k] for k in ("total", "plain", "spec", "switches")} == \
            {k: first[k] for k in ("total", "plain", "spec", "switches")}, (rank, stats, first)
        assert run.replays("DECODE", rank=rank) == stats["plain"]
        assert run.replays("TARGET_VERIFY", rank=rank) == stats["spec"]
