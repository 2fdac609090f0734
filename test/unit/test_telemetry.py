"""Per-request counters of a request that ran partly plain, through SGLang's own code."""

from types import SimpleNamespace as NS

import pytest

from sglang_adaptive.args import attach
from sglang_adaptive.policy import PolicyConfig


def recv(completion_tokens, verify_ct, correct_drafts):
    """The scheduler's output for one request, as the tokenizer manager receives it."""
    return NS(spec_verify_ct=[verify_ct], spec_num_correct_drafts=[correct_drafts],
              completion_tokens=[completion_tokens], spec_num_cap_tokens=None,
              spec_num_block_accept_tokens=None, spec_correct_drafts_histogram=None,
              spec_cap_lens_histogram=None)


def manager(policy: str):
    server_args = NS(speculative_num_draft_tokens=4)
    attach(server_args, PolicyConfig(policy=policy, threshold=8 if policy == "threshold" else None))
    return NS(server_args=server_args)


def metrics(policy, completion_tokens, verify_ct, correct_drafts):
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    meta_info = {}
    TokenizerManager._calculate_spec_decoding_metrics(manager(policy), meta_info,
                                                      recv(completion_tokens, verify_ct, correct_drafts), 0)
    return meta_info


def test_partly_plain_request_reports_tokens_per_verify_of_its_speculative_steps(plugins):
    # 10 verifies accepted 12 drafts (22 tokens); 78 more tokens came from plain steps.
    meta = metrics("threshold", completion_tokens=100, verify_ct=10, correct_drafts=12)
    assert meta["spec_accept_length"] == pytest.approx(2.2)
    # Upstream's other counters count verifies only and stay as they are.
    assert meta["spec_verify_ct"] == 10 and meta["spec_accept_rate"] == pytest.approx(12 / 30)


def test_static_eagle_server_keeps_upstreams_definition(plugins):
    meta = metrics("off", completion_tokens=100, verify_ct=10, correct_drafts=12)
    assert meta["spec_accept_length"] == pytest.approx(10.0)


def test_request_that_never_speculated_reports_no_acceptance(plugins):
    assert "spec_accept_length" not in metrics("threshold", completion_tokens=50, verify_ct=0, correct_drafts=0)


def test_prometheus_series_count_batches_switches_steps_and_acceptance():
    from prometheus_client import CollectorRegistry

    from sglang_adaptive import controller as ctl
    from sglang_adaptive.policy import AlternatePolicy
    from sglang_adaptive.telemetry import PrometheusTelemetry

    registry = CollectorRegistry()
    tel = PrometheusTelemetry({"model_name": "m"}, registry=registry)
    t = [0.0]
    c = ctl.AdaptiveModeController(AlternatePolicy(3), spec_width=4, telemetry=tel, clock=lambda: t[0],
                                   sync_every=0)
    for i in range(8):  # S S S P P P S S, one decode batch per forward, 5 ms apart
        t[0] += 0.005
        c.on_prepare(c.speculate(8), 8, 100 + i)
    c.on_verify([0, 3, 2])

    def value(name, **labels):
        return registry.get_sample_value("sglang_adaptive_" + name, {"model_name": "m", **labels})

    assert value("decode_batches_total", mode="spec") == 5 and value("decode_batches_total", mode="plain") == 3
    assert value("mode_switches_total") == 2
    assert value("speculative_mode") == 1
    assert value("verify_requests_total") == 3 and value("verify_tokens_total") == 3 + 5
    # The interval after prepare k is filed two prepares later, and only when batches
    # k - 1 and k ran the same mode: k = 1, 2 (speculative) and 4, 5 (plain); k = 3
    # and 6 follow a switch.
    assert value("decode_step_seconds_count", mode="spec") == 2
    assert value("decode_step_seconds_count", mode="plain") == 2
    assert value("decode_step_seconds_sum", mode="plain") == pytest.approx(0.010)


def test_metrics_off_or_another_rank_report_nothing():
    from types import SimpleNamespace as NS

    from sglang_adaptive.telemetry import NoTelemetry, make_telemetry

    assert type(make_telemetry(NS(enable_metrics=False), 0)) is NoTelemetry
    assert type(make_telemetry(NS(enable_metrics=True), 1)) is NoTelemetry
