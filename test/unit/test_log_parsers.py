"""The log readers the GPU assertions rely on, on lines recorded from a real server.

``test/fixtures/server-logs/threshold-8-ramp-excerpt.log``: two windows of the tiny
pair's threshold-8-ramp server log (H200, 2026-11-30): the first plain batches
after 1350 speculative ones, then plain batches of 30 requests while 2 wait.
"""

import math
from pathlib import Path

import pytest

from sglang_adaptive.testing import LOG_ERROR_MARKERS, Run

LOG = (Path(__file__).resolve().parents[1] / "fixtures" / "server-logs" / "threshold-8-ramp-excerpt.log").read_text()


def test_stats_reads_the_last_mode_counter_line():
    assert Run([], LOG).stats() == dict(total=1728, plain=333, spec=1395, switches=3, max_reserve=6,
                                        plain_prefills=0)


def test_stats_without_the_reserve_group_and_without_any_line():
    line = "[t] AdaptiveEAGLE decode batches: 1351 (plain 1, 0.1%; speculative 1350), switches: 1\n"
    assert Run([], line).stats() == dict(total=1351, plain=1, spec=1350, switches=1, max_reserve=0,
                                         plain_prefills=0)
    line = line[:-1] + ", prefills without the draft: 29\n"
    assert Run([], line).stats()["plain_prefills"] == 29
    with pytest.raises(AssertionError, match="no AdaptiveEAGLE statistics"):
        Run([], "Decode batch, #running-req: 4, #queue-req: 0\n").stats()


def test_replays_count_target_graphs_per_mode():
    run = Run([], LOG)
    assert run.replays("TARGET_VERIFY") == 3
    assert run.replays("DECODE") == 8
    # Draft-worker replays are not target replays; a mode name is matched whole.
    draft = LOG.replace("worker=target key_size=30", "worker=draft key_size=30", 1)
    assert Run([], draft).replays("DECODE") == 7
    assert run.replays("VERIFY") == 0


def test_peak_running_and_memory_bound_concurrency_read_decode_lines_only():
    run = Run([], LOG)
    assert run.peak_running() == 30
    # Only the three decode batches of 30 logged a queue; the prefill lines with a
    # queue (11 and 23 running) are not decode batches.
    assert run.memory_bound_concurrency() == 30.0
    no_queue = "\n".join(line for line in LOG.splitlines() if "#queue-req: 2" not in line)
    assert Run([], no_queue).memory_bound_concurrency() == 0.0


def test_spec_accept_length_weighs_speculative_batches_by_size():
    # Four speculative batches of 4 requests: accept len 1.75, 2.00, 1.25, 1.75.
    assert Run([], LOG).spec_accept_length() == pytest.approx((1.75 + 2.00 + 1.25 + 1.75) / 4)
    plain_only = "\n".join(line for line in LOG.splitlines() if "accept len" not in line)
    assert math.isnan(Run([], plain_only).spec_accept_length())


def test_accept_length_over_requests_from_their_meta_info():
    results = [{"output_ids": [1] * 7, "meta_info": {"completion_tokens": 7, "spec_verify_ct": 3}},
               {"output_ids": [1] * 5, "meta_info": {"completion_tokens": 5, "spec_verify_ct": 3}}]
    assert Run(results, "").accept_length() == pytest.approx(12 / 6)


@pytest.mark.parametrize("marker", LOG_ERROR_MARKERS)
def test_a_run_with_an_error_line_is_not_healthy(marker):
    run = Run([{"output_ids": [1]}], LOG + f"[t] {marker} something\n")
    assert run.problems() == [f"{marker!r} in the server log"]
    with pytest.raises(AssertionError, match="in the server log"):
        run.check()


def test_a_run_that_did_not_start_or_answer_is_not_healthy():
    assert Run(None, "", error="server exited").problems() == ["server error: server exited"]
    assert Run([{"output_ids": [1]}, None], LOG).problems() == ["not every request was answered"]
    healthy = Run([{"output_ids": [1]}], LOG)
    assert healthy.problems() == [] and healthy.check() is healthy


def test_spec_accept_length_of_batches_of_different_sizes():
    lines = [
        "[t] Decode batch, #running-req: 1, #token: 0, token usage: 0.00, accept len: 4.00, accept rate: 1.00, "
        "cuda graph: True, gen throughput (token/s): 2.81, #queue-req: 0",
        "[t] Decode batch, #running-req: 30, #token: 5825, token usage: 0.73, accept len: 1.50, accept rate: 0.17, "
        "cuda graph: True, gen throughput (token/s): 447.53, #queue-req: 2",
    ]
    assert Run([], "\n".join(lines)).spec_accept_length() == pytest.approx((1 * 4.0 + 30 * 1.5) / 31)


def tp2(log: str) -> str:
    """The excerpt as two tensor-parallel ranks log it: SGLang's " TPn" prefix."""
    ranks = []
    for rank in (0, 1):
        ranks += [line.replace("] ", f" TP{rank}] ", 1) for line in log.splitlines()]
    return "\n".join(ranks)


def test_per_rank_counters_and_replays_at_tensor_parallel_2():
    run = Run([], tp2(LOG))
    per_rank = run.stats_per_rank()
    assert sorted(per_rank) == [0, 1] and per_rank[0] == per_rank[1] == run.stats(rank=1)
    assert run.replays("DECODE", rank=0) == run.replays("DECODE", rank=1) == 8
    # A rank that took another mode shows in its own counters.
    diverged = tp2(LOG).replace("TP1] AdaptiveEAGLE decode batches: 1728 (plain 333",
                                "TP1] AdaptiveEAGLE decode batches: 1728 (plain 334")
    assert Run([], diverged).stats(rank=1)["plain"] == 334 != Run([], diverged).stats(rank=0)["plain"]
    with pytest.raises(AssertionError, match="no AdaptiveEAGLE statistics of TP rank 2"):
        run.stats(rank=2)


def test_lines_without_a_rank_prefix_are_rank_0():
    assert Run([], LOG).stats_per_rank().keys() == {0}
