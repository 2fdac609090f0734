"""benchmark/soak.py's pure parts: the oscillating arrivals, the request mix, the
KV reading from /metrics and the verdict table."""

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))
import soak  # noqa: E402


def test_arrivals_follow_the_sine_between_low_and_high():
    times = soak.arrivals(480.0, low=1.0, high=40.0, period=240.0, seed=3)
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 480.0
    trough = sum(1 for t in times if t < 20 or 220 <= t < 260)   # around t = 0 and 240
    peak = sum(1 for t in times if 100 <= t < 140)               # around t = 120
    assert peak > 10 * trough
    # The expected count is the integral of the rate: (low + high) / 2 per second.
    assert len(times) == pytest.approx(480 * 20.5, rel=0.05)


def test_the_mix_draws_every_kind_and_shapes_its_request():
    rng = random.Random(0)
    kinds = [soak.draw_kind(rng) for _ in range(5000)]
    assert set(kinds) == set(soak.KINDS)
    assert kinds.count("greedy") / len(kinds) == pytest.approx(1 - sum(soak.MIX.values()), abs=0.03)
    one = soak.make_request("one-token", rng, vocab=32000)
    assert one["sampling_params"]["max_new_tokens"] == 1 and one["rid"].startswith("soak-one-token-")
    assert soak.make_request("parallel-2", rng, vocab=32000)["sampling_params"]["n"] == 2
    lp = soak.make_request("logprobs", rng, vocab=32000)
    assert lp["return_logprob"] and lp["top_logprobs_num"] == 3 and lp["token_ids_logprob"]
    stop = soak.make_request("stop-ids", rng, vocab=32000)["sampling_params"]
    assert len(stop["stop_token_ids"]) == 8 and stop["ignore_eos"] is False


def test_kv_tokens_come_from_the_metrics_gauge():
    text = ('# HELP sglang:num_used_tokens ...\n'
            'sglang:num_used_tokens{engine_type="unified",model_name="m",tp_rank="0"} 123.0\n'
            'sglang:num_used_tokens_other{x="1"} 9\n')
    assert soak.kv_tokens_in_use(text) == 123
    assert soak.kv_tokens_in_use("") is None


def test_summary_counts_outcomes_and_flags_a_leak():
    outcomes = [("greedy", "ok"), ("disconnect", "disconnected"), ("abort-request", "aborted"),
                ("greedy", "error: HTTP 500: boom")]
    samples = [(5.0, [1000, 1000], 0), (10.0, [1100, 1090], 512)]
    s = soak.summarize(outcomes, samples, kv_start=0, kv_end=4, mode_line="decode batches: 9 (...)")
    assert s["requests"] == 4 and s["errors"] == 1 and s["first_errors"] == ["greedy: error: HTTP 500: boom"]
    assert s["by_outcome"] == {"ok": 1, "disconnected": 1, "aborted": 1, "error": 1}
    assert s["kv_leak"] == 4 and s["gpu_memory_mib_max"] == 1100
    table = soak.markdown(s)
    assert "| KV tokens in use at start / end | 0 / 4 |" in table and "| errors | 1 |" in table
