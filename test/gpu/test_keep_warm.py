"""Draft keep-warm (issue 14) on the trained tiny pair, fp32: every strategy returns
the no-spec server's tokens under switching, ``kv`` keeps acceptance near static
EAGLE-3's, and its K/V equal what the draft's own extend writes. On the GPU host:

    ADAPTIVE_GPU_PARALLEL=8 python -m pytest -m gpu test/gpu/test_keep_warm.py -v

Writes ``$OUT/keep-warm.jsonl``: one row per configuration with ``label``,
``strategy`` and ``tokens_per_verify`` (speculative batches only), and for the
50-step alternation the acceptance of the 1st, 5th and 20th speculative step after
each plain stretch against the steps past the 32nd (steady state).
"""

from __future__ import annotations

import json
import math
import os
import re

import pytest
from suite import ENV32, FP32_ARGS, base_args, collect, configs
from test_tiny_pair import PAIR, text_requests

from sglang_adaptive.keepwarm import CHECK_ENV, CHECK_LOG_PATTERN, DEFER_ENV, FLUSH_GRAPHS_ENV
from sglang_adaptive.worker import PLAIN_PREFILL_ENV
from sglang_adaptive.testing import STATIC_ARGS, mismatching_requests, without_flags

pytestmark = pytest.mark.gpu

STRATEGIES = ("none", "kv", "full")
# Switching configurations, each served once per strategy: (base label in
# suite.configs or an alternation period, load).
SWITCHING = ("alternate-1", "alternate-7", "threshold-8-ramp", "alternate-50")
# Issue 14's bars for kv (tokens per verify in speculative batches; static EAGLE-3
# gives 2.34 on this pair over all its batches). Under threshold 8's ramp the issue
# asked for 2.3 too, but the ramp speculates only in its batches of at most 8 requests,
# where static EAGLE-3 itself gives 2.23 (benchmark/results/2026-12-01-h200-keep-warm):
# there kv is held to static EAGLE-3 in those batches and to full.
KV_BARS = {"alternate-1": 2.2, "alternate-7": 2.3}
RAMP_REFERENCE = "eagle3-ramp"
RAMP_THRESHOLD = 8
# kv against full (the draft's whole extend at every plain step: the most a keep-warm
# strategy can give) on the same load; none sits 0.03-1.3 below full.
FULL_TOLERANCE = 0.01
# kv against static EAGLE-3 in the same batch sizes: two servers whose small batches
# hold different requests at different times (measured margin: +0.07).
RAMP_TOLERANCE = 0.02


def served(runs, *labels):
    """The runs of ``labels``; skips the test where a label was not served (ADAPTIVE_GPU_ONLY)."""
    missing = [label for label in labels if label not in runs]
    if missing:
        pytest.skip(f"{', '.join(missing)} not served in this run (ADAPTIVE_GPU_ONLY)")
    return [runs[label].check() for label in labels]
RECOVERY_BAR = 0.95  # kv: 1st speculative step after a 50-step plain stretch / steady state
RECOVERY_PLACES = (1, 5, 20)
# fp32 K/V of the writer against the draft's extend: both compute the same products,
# in another order (the writer multiplies by the K/V rows of the fused weight only).
CHECK_RTOL = 1e-4
LONG_LOAD = dict(n=240, seed=3, prompt=(16, 300), output=(150, 300))


UNCHECKED = "alternate-1-unchecked-kv"
# Unchecked kv against checked kv (each write waited for at once) on the same load: the
# same K/V if the waits are right; a speculative step that drafts before the last
# plain write lands falls toward none (1.16 against 2.50 in session 9).
UNCHECKED_TOLERANCE = 0.03
# Deferred writes with the eager flush.
DEFERRED = "alternate-50-deferred-kv"
# The same with each flush replayed as a graph per row count (the default).
FLUSH_GRAPHS = "alternate-50-flush-graphs-kv"
# alternate-50-kv with every prefill running the draft's extend (as upstream): what the
# keep-warm's prefill (the default while decode runs plain) is measured against.
DRAFT_PREFILL = "alternate-50-draft-prefill-kv"
TOKENS_PER_STEP = 4  # --speculative-num-draft-tokens: a verify accepts 1 to 4 tokens


def acceptance_tolerance(n1: int, n2: int) -> float:
    """Two standard errors of the difference of two mean tokens per verify over n1 and
    n2 verifies, at the largest spread such a mean can have (tokens per verify lie in
    1..TOKENS_PER_STEP: standard deviation at most half that range). A per-place mean over
    ~300 verifies moves by ~0.1 between two servers (the 1st step after a stretch read
    2.80 against 2.86 on two equal servers); a draft over stale K/V falls by ~1.3."""
    return 2 * (TOKENS_PER_STEP - 1) / 2 * math.sqrt(1 / n1 + 1 / n2)


def label_of(base: str, strategy: str) -> str:
    return f"{base}-{strategy}"


@pytest.fixture(scope="module")
def runs():
    base = base_args("--model-path", str(PAIR / "target"), "--max-total-tokens", "12000") + FP32_ARGS
    table = configs(base, PAIR / "eagle3", labels=("plain", "eagle3", "alternate-1", "alternate-7",
                                                    "threshold-8-ramp"), env=ENV32)
    spec_args = table["eagle3"][0]  # static: the policy off
    table["alternate-50"] = (without_flags(spec_args, STATIC_ARGS[:1]) + ["--speculative-switch-policy", "alternate",
                                          "--speculative-switch-alternate-period", "50"], ENV32, 16)
    served = {"plain": table["plain"], "eagle3": table["eagle3"],
              # Static EAGLE-3 under threshold-8's ramp: its batches of at most 8 requests
              # are the ones threshold 8 speculates, with the same requests and positions.
              RAMP_REFERENCE: (spec_args, ENV32, table["threshold-8-ramp"][2])}
    long_reqs = text_requests(LONG_LOAD["n"], seed=LONG_LOAD["seed"], prompt=LONG_LOAD["prompt"],
                              output=LONG_LOAD["output"])
    requests_for = {"plain-long": long_reqs}
    served["plain-long"] = table["plain"]
    for name in SWITCHING:
        args, env, load = table[name]
        for strategy in STRATEGIES:
            label = label_of(name, strategy)
            # kv also checks its K/V against the draft's extend at every plain step.
            extra_env = {CHECK_ENV: "1"} if strategy == "kv" else {}
            served[label] = (args + ["--speculative-draft-keep-warm", strategy], {**env, **extra_env}, load)
            if name == "alternate-50":
                requests_for[label] = long_reqs
    # The same on the path without the overlap scheduler.
    args, env, load = table["alternate-1"]
    served["alternate-1-no-overlap-kv"] = (args + ["--disable-overlap-schedule", "--speculative-draft-keep-warm",
                                                   "kv"], env, load)
    # kv as served: no check, so no wait after each write; the writes overlap the next
    # target step on the side stream, and only the waits order them.
    served[UNCHECKED] = (args + ["--speculative-draft-keep-warm", "kv"], {**env, DEFER_ENV: "1"}, load)
    # kv with its writes deferred: 8 plain steps written at once (the 50-step stretches
    # fill whole windows; the speculative step after one flushes the rest).
    args50, env50, load50 = table["alternate-50"]
    served[DEFERRED] = (args50 + ["--speculative-draft-keep-warm", "kv"],
                        {**env50, DEFER_ENV: "8", FLUSH_GRAPHS_ENV: "0"}, load50)
    requests_for[DEFERRED] = long_reqs
    served[FLUSH_GRAPHS] = (args50 + ["--speculative-draft-keep-warm", "kv"],
                            {**env50, DEFER_ENV: "8", FLUSH_GRAPHS_ENV: "1"}, load50)
    requests_for[FLUSH_GRAPHS] = long_reqs
    kv50_args, kv50_env, _ = served[label_of("alternate-50", "kv")]
    served[DRAFT_PREFILL] = (kv50_args, {**kv50_env, PLAIN_PREFILL_ENV: "0"}, load50)
    requests_for[DRAFT_PREFILL] = long_reqs
    out = collect("keep-warm", served, text_requests(200), requests_for=requests_for)
    write_rows(out)
    return out


def reference_of(label: str) -> str:
    return "plain-long" if label.startswith("alternate-50") else "plain"


def check_values(run) -> dict | None:
    found = None
    for line in run.log.splitlines():
        m = re.search(CHECK_LOG_PATTERN, line)
        if m:
            steps, dk, dv, ak, av = m.groups()
            found = dict(steps=int(steps), max_diff_k=float(dk), max_diff_v=float(dv),
                         max_abs_k=float(ak), max_abs_v=float(av))
    return found


def write_rows(out: dict) -> None:
    rows = []
    for label, run in out.items():
        if run.results is None:
            continue
        strategy = next((s for s in STRATEGIES if label.endswith("-" + s)), None)
        row = {"label": label, "strategy": strategy, "shape": "tiny-llama-tp1", "acceptance": "real",
               "dtype": "float32"}
        if label == "eagle3":
            row["tokens_per_verify"] = round(run.accept_length(), 3)
        elif label == RAMP_REFERENCE:
            row["tokens_per_verify"] = round(run.accept_length(), 3)
            row[f"tokens_per_verify_batches_le_{RAMP_THRESHOLD}"] = round(run.spec_accept_length(RAMP_THRESHOLD), 3)
        elif strategy is not None:
            row["tokens_per_verify"] = round(run.spec_accept_length(), 3)
            row.update(run.stats())
            profile = run.recovery()
            if profile:
                steps = profile["steps"]
                row["recovery"] = {str(p): steps[p][0] for p in (*RECOVERY_PLACES, "deep") if p in steps}
                row["recovery_verifies"] = {str(p): steps[p][1] for p in (*RECOVERY_PLACES, "deep") if p in steps}
            check = check_values(run)
            if check:
                row["kv_check"] = check
        rows.append(row)
    path = os.path.join(os.environ.get("OUT", "/tmp"), "keep-warm.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


ALL = [label_of(n, s) for n in SWITCHING for s in STRATEGIES] + ["alternate-1-no-overlap-kv", UNCHECKED, DEFERRED,
                                                                   DRAFT_PREFILL, FLUSH_GRAPHS]


@pytest.mark.parametrize("label", ALL)
def test_greedy_tokens_equal_the_no_spec_server_under_switching(runs, label):
    if label not in runs:
        pytest.skip(f"{label} is not served in this run (ADAPTIVE_GPU_ONLY)")
    ref, got = runs[reference_of(label)].check(), runs[label].check()
    stats = got.stats()
    assert stats["plain"] > 0 and stats["spec"] > 0 and stats["switches"] > 0, stats
    strategy = label.rsplit("-", 1)[1]
    assert f"AdaptiveEAGLE draft keep-warm: {strategy}," in got.log
    mismatching = mismatching_requests(ref.ids, got.ids)
    assert not mismatching, f"{len(mismatching)} of {len(ref.ids)} requests differ, first {mismatching[:5]}"


@pytest.mark.parametrize("name", sorted(KV_BARS))
def test_kv_keeps_tokens_per_verify_near_static_eagle3(runs, name):
    kv = runs[label_of(name, "kv")].check().spec_accept_length()
    assert kv >= KV_BARS[name], f"{name}: kv {kv:.3f} < {KV_BARS[name]}"


def test_kv_under_the_ramp_matches_static_eagle3_in_the_same_batches(runs):
    """The ramp's speculative batches are its small ones: static EAGLE-3 under the same
    ramp, counted in its batches of at most 8 requests, is what kv should reach."""
    kv_run, static_run = served(runs, label_of("threshold-8-ramp", "kv"), RAMP_REFERENCE)
    kv, static = kv_run.spec_accept_length(), static_run.spec_accept_length(RAMP_THRESHOLD)
    assert kv >= static - RAMP_TOLERANCE, \
        f"kv {kv:.3f} < static EAGLE-3 {static:.3f} - {RAMP_TOLERANCE} in batches of <= {RAMP_THRESHOLD}"


@pytest.mark.parametrize("name", SWITCHING)
def test_kv_reaches_what_running_the_whole_draft_gives(runs, name):
    kv, full = (r.spec_accept_length() for r in served(runs, label_of(name, "kv"), label_of(name, "full")))
    assert kv >= full - FULL_TOLERANCE, f"{name}: kv {kv:.3f} < full {full:.3f} - {FULL_TOLERANCE}"


def test_kv_recovers_on_the_first_speculative_step_after_a_plain_stretch(runs):
    profile = runs[label_of("alternate-50", "kv")].check().recovery()
    assert profile and profile["min_stretch"] == 50, profile
    steps = profile["steps"]
    assert 1 in steps and "deep" in steps, steps
    first, steady = steps[1][0], steps["deep"][0]
    assert first >= RECOVERY_BAR * steady, f"1st step {first:.3f} < {RECOVERY_BAR} x steady {steady:.3f}"


@pytest.mark.parametrize("label", [label_of(n, "kv") for n in SWITCHING])
def test_kv_writes_the_k_v_the_draft_extend_writes(runs, label):
    check = check_values(served(runs, label)[0])
    assert check and check["steps"] > 0, "no keep-warm check in the log"
    assert check["max_diff_k"] <= CHECK_RTOL * check["max_abs_k"], check
    assert check["max_diff_v"] <= CHECK_RTOL * check["max_abs_v"], check


def test_kv_on_the_side_stream_drafts_from_every_write(runs):
    unchecked, checked = served(runs, UNCHECKED, label_of("alternate-1", "kv"))
    assert "on the side stream (2 set(s))" in unchecked.log, "the writes did not run on the side stream"
    got, want = unchecked.spec_accept_length(), checked.spec_accept_length()
    assert got >= want - UNCHECKED_TOLERANCE, f"unchecked kv {got:.3f} < checked {want:.3f} - {UNCHECKED_TOLERANCE}"


def test_deferred_kv_drafts_from_every_write(runs):
    """Written 8 steps at a time, the K/V after a 50-step stretch must be what the checked
    per-step writer leaves: the same tokens per verify, the same first step after it."""
    deferred, checked = served(runs, DEFERRED, label_of("alternate-50", "kv"))
    assert "deferred: up to 8 plain steps per write" in deferred.log, "the writes were not deferred"
    got, want = deferred.spec_accept_length(), checked.spec_accept_length()
    assert got >= want - UNCHECKED_TOLERANCE, f"deferred kv {got:.3f} < checked {want:.3f} - {UNCHECKED_TOLERANCE}"
    assert_first_step_matches(deferred, checked)


def test_a_captured_flush_drafts_from_every_write(runs):
    """The deferred writes' flush replayed as a graph over a row count that holds the
    window (padding rows aimed at the padding slot): what the checked per-step writer
    leaves, as the eager flush does."""
    graphs, checked = served(runs, FLUSH_GRAPHS, label_of("alternate-50", "kv"))
    assert "flush graphs for" in graphs.log, "the flush was not captured"
    got, want = graphs.spec_accept_length(), checked.spec_accept_length()
    assert got >= want - UNCHECKED_TOLERANCE, f"captured flush {got:.3f} < checked {want:.3f} - {UNCHECKED_TOLERANCE}"
    assert_first_step_matches(graphs, checked)


def assert_first_step_matches(run, reference):
    (first, n), (first_ref, n_ref) = (r.recovery()["steps"][1] for r in (run, reference))
    tolerance = acceptance_tolerance(n, n_ref)
    assert first >= first_ref - tolerance, \
        f"1st step after a stretch {first:.3f} < {first_ref:.3f} - {tolerance:.3f} ({n} and {n_ref} verifies)"


def test_prefills_while_plain_write_the_draft_k_v_the_draft_extend_would(runs):
    """alternate-50 prefills in its plain stretches too: there the target prefills
    alone and the keep-warm writes the prompt's draft K/V. Against the same server with
    the draft's extend at every prefill: the same tokens (the greedy test), the same
    tokens per verify, the same first speculative step after a stretch (which is where
    requests prefilled in the stretch first draft)."""
    plain, drafted = served(runs, label_of("alternate-50", "kv"), DRAFT_PREFILL)
    assert "prefills while plain write the draft's K/V only" in plain.log
    assert plain.stats()["plain_prefills"] > 0, "no prefill ran without the draft"
    assert drafted.stats()["plain_prefills"] == 0 and "prefills while plain" not in drafted.log
    got, want = plain.spec_accept_length(), drafted.spec_accept_length()
    assert got >= want - UNCHECKED_TOLERANCE, f"kv prefill {got:.3f} < draft extend {want:.3f} - {UNCHECKED_TOLERANCE}"
    assert_first_step_matches(plain, drafted)
