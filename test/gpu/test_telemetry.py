"""Telemetry (issue 15) on the trained tiny pair: the Prometheus series count what the
scheduler log counts, and the per-request counters count speculative steps only.

One server alternating every 7 decode steps (so both modes file step times: an
interval is timed only between two batches of the same mode) with ``--enable-metrics``.
Two counts that reach the client by different roads must agree:
- ``sglang_adaptive_decode_batches_total`` by mode and ``..._mode_switches_total``
  against the controller's statistics line in the log;
- ``..._verify_requests_total`` / ``..._verify_tokens_total`` (from the verify
  callback) against the sums of the requests' ``spec_verify_ct`` and
  ``spec_verify_ct + spec_num_correct_drafts`` (from result processing);
and each request's ``spec_accept_length`` is ``1 + correct drafts / verifies``, never
more than a verify can commit, while its plain tokens stay out of it. Writes the
scrape to ``$OUT/metrics-alternate-7.txt``. On the GPU host:

    ADAPTIVE_GPU_REQUIRED=1 python -m pytest -m gpu test/gpu/test_telemetry.py -v
"""

from __future__ import annotations

import os

import pytest
from suite import ENV32, FP32_ARGS, base_args, configs, require_gpu
from test_tiny_pair import PAIR, text_requests

from sglang_adaptive.telemetry import METRIC_PREFIX, MODES
from sglang_adaptive.testing import Run, Server, generate, metric_value, scrape_metrics

pytestmark = pytest.mark.gpu

LABEL = "alternate-7"
PORT_BASE = int(os.environ.get("ADAPTIVE_GPU_PORT_BASE", "35000"))
NUM_DRAFT_TOKENS = 4  # suite's EAGLE-3 flags: 3 steps, top-k 1
# Under the overlap scheduler a request that finishes at a step is already in the
# next launched batch; that batch's verify reaches the callback (and the series)
# but not the finished request's counters: at most one verify per request more.
EXTRA_VERIFIES_PER_REQUEST = 1


@pytest.fixture(scope="module")
def served():
    require_gpu()
    reqs = text_requests(64, seed=5, prompt=(16, 200), output=(40, 160))
    base = base_args("--model-path", str(PAIR / "target"), "--max-total-tokens", "8000", *FP32_ARGS)
    args, env, concurrency = configs(base, PAIR / "eagle3", labels=(LABEL,), env=ENV32)[LABEL]
    srv = Server(LABEL, args + ["--enable-metrics"], env, port=PORT_BASE)
    results, error, text = None, None, ""
    try:
        srv.start()
        results = generate(srv.url, reqs, concurrency)
        srv.settle()
        text = scrape_metrics(srv.url)
    except Exception as e:  # recorded; every test fails on it
        error = str(e)[-3000:]
    finally:
        srv.stop()
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"metrics-{LABEL}.txt"), "w") as f:
        f.write(text)
    return Run(results, srv.log_text(), error).check(), text


def series(text: str, name: str, **labels) -> float:
    value = metric_value(text, METRIC_PREFIX + name, **labels)
    assert value is not None, f"{METRIC_PREFIX + name} {labels or ''} is not in /metrics"
    return value


def test_mode_series_count_the_batches_the_log_counts(served):
    run, text = served
    stats = run.stats()
    assert stats["plain"] > 0 and stats["spec"] > 0, stats
    assert series(text, "decode_batches_total", mode="plain") == stats["plain"]
    assert series(text, "decode_batches_total", mode="spec") == stats["spec"]
    assert series(text, "mode_switches_total") == stats["switches"]
    assert series(text, "speculative_mode") in (0.0, 1.0)


def test_step_time_series_hold_both_modes(served):
    _, text = served
    for mode in MODES:
        count = series(text, "decode_step_seconds_count", mode=mode)
        total = series(text, "decode_step_seconds_sum", mode=mode)
        assert count > 0 and 0 < total / count < 1.0, (mode, count, total)


def test_verify_series_agree_with_the_requests_counters(served):
    run, text = served
    verifies = sum(r["meta_info"]["spec_verify_ct"] for r in run.results)
    tokens = sum(r["meta_info"]["spec_verify_ct"] + r["meta_info"]["spec_num_correct_drafts"] for r in run.results)
    got_verifies, got_tokens = series(text, "verify_requests_total"), series(text, "verify_tokens_total")
    slack = EXTRA_VERIFIES_PER_REQUEST * len(run.results)
    assert verifies <= got_verifies <= verifies + slack, (got_verifies, verifies)
    assert tokens <= got_tokens <= tokens + NUM_DRAFT_TOKENS * slack, (got_tokens, tokens)
    assert 1.0 < got_tokens / got_verifies <= NUM_DRAFT_TOKENS


def test_per_request_accept_length_counts_speculative_steps_only(served):
    run, _ = served
    plain_tokens = 0
    for r in run.results:
        meta = r["meta_info"]
        verifies, correct = meta["spec_verify_ct"], meta["spec_num_correct_drafts"]
        assert verifies > 0, meta
        assert meta["spec_accept_length"] == pytest.approx(1 + correct / verifies), meta
        assert 1.0 <= meta["spec_accept_length"] <= NUM_DRAFT_TOKENS, meta
        # The prefill's token, the speculative steps' tokens, the rest plain.
        plain_tokens += meta["completion_tokens"] - 1 - (verifies + correct)
    assert plain_tokens > 0, "no request decoded a plain token: the counters were not put to the test"
