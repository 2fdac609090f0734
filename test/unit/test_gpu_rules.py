"""The GPU suite's verdicts, on fabricated runs: each rule must be able to fail.

The GPU tests only run on the GPU host; what they decide from a run (the modes a
configuration claims, the bf16 noise rule, the GPU requirement) is plain Python
and checked here.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import suite  # noqa: E402
from test_tiny_pair import bf16_noise, bf16_violations  # noqa: E402

from sglang_adaptive.testing import Run  # noqa: E402


def stats_run(total, plain, spec, switches, reserve=2):
    line = (f"[t] AdaptiveEAGLE decode batches: {total} (plain {plain}, 50.0%; speculative {spec}), "
            f"switches: {switches}, max plain KV reserve: {reserve}\n")
    return Run([{"output_ids": [1]}], line)


@pytest.mark.parametrize("label, run, ok", [
    ("threshold-0", stats_run(10, 10, 0, 0), True),
    ("threshold-0", stats_run(10, 9, 1, 1), False),          # claims always plain, speculated once
    ("threshold-8-ramp", stats_run(10, 0, 10, 0), False),    # a ramp that never went plain
    ("alternate-7", stats_run(70, 35, 35, 9), True),         # a switch every 7 batches
    ("alternate-7", stats_run(70, 35, 35, 3), False),        # too few switches for period 7
    ("alternate-1~gpu-stale-kv-slot", stats_run(10, 5, 5, 9), True),  # a mutant keeps its config's claim
])
def test_modes_each_configuration_claims(label, run, ok):
    if ok:
        assert suite.assert_modes(label, run)["total"] == run.stats()["total"]
    else:
        with pytest.raises(AssertionError):
            suite.assert_modes(label, run)


def test_modes_of_a_failed_server_fail_on_its_error():
    with pytest.raises(AssertionError, match="server error"):
        suite.assert_modes("threshold-0", Run(None, "", error="server exited"))


def reference(n=4, gap=0.0625):
    """A no-spec server's answers: tokens 5, 6, 7; token 9 ranked ``gap`` below 6."""
    top = [[(-0.1, 5, None), (-3.0, 1, None)], [(-0.5, 6, None), (-0.5 - gap, 9, None)],
           [(-0.2, 7, None), (-4.0, 2, None)]]
    return Run([{"output_ids": [5, 6, 7], "meta_info": {"output_top_logprobs": top}}] * n, "")


def ids_run(rows):
    return Run([{"output_ids": r} for r in rows], "")


SAME, FLIP = [5, 6, 7], [5, 9, 7]


def test_bf16_noise_bound_is_upstream_noise_plus_one_rounding_step():
    runs = {"plain": reference(gap=0.0625), "plain-2": ids_run([SAME, SAME, SAME, FLIP]),
            "eagle3": ids_run([FLIP, FLIP, SAME, SAME])}
    assert bf16_noise(runs) == (pytest.approx(0.0625 + 0.0625), 2)  # no smaller step seen


def test_bf16_rule_rejects_a_large_gap_and_too_many_divergences():
    ref = reference(n=8, gap=0.0625)
    runs = {"plain": ref, "plain-2": ids_run([SAME] * 7 + [FLIP]), "eagle3": ids_run([SAME] * 8)}
    runs["ok"] = ids_run([SAME] * 7 + [FLIP])
    assert bf16_violations(runs, "ok") == []
    runs["too-many"] = ids_run([SAME] * 5 + [FLIP] * 3)  # 3 > 1.25 x 1
    assert any("requests diverge" in v for v in bf16_violations(runs, "too-many"))
    runs["wrong-token"] = ids_run([SAME] * 7 + [[5, 3, 7]])  # outside the reference's top-k
    assert any("beyond the noise bound" in v for v in bf16_violations(runs, "wrong-token"))
    # The bound follows the noise measured in the same run: wider noise, wider bound.
    wide = {"plain": reference(n=8, gap=0.25), "plain-2": ids_run([SAME] * 7 + [FLIP]),
            "eagle3": ids_run([SAME] * 8), "x": ids_run([SAME] * 7 + [FLIP])}
    assert bf16_violations(wide, "x") == []


def test_gpu_requirement_fails_instead_of_skipping(monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    monkeypatch.setenv("ADAPTIVE_GPU_REQUIRED", "1")
    with pytest.raises(pytest.fail.Exception, match="no GPU is usable"):
        suite.require_gpu()
    monkeypatch.delenv("ADAPTIVE_GPU_REQUIRED")
    with pytest.raises(pytest.skip.Exception, match="needs a CUDA GPU"):
        suite.require_gpu()


@pytest.mark.parametrize("required", [True, False])
def test_gpu_suite_without_a_gpu_fails_when_required_and_skips_otherwise(required):
    """`make gpu-test` sets ADAPTIVE_GPU_REQUIRED=1: on a machine without a usable
    GPU it must exit non-zero instead of passing on skips."""
    import os
    import subprocess

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "ADAPTIVE_GPU_REQUIRED": "1" if required else "0"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "test/gpu/test_tiny_pair.py",
                           "-k", "test_bf16_noise_was_measured"], cwd=repo, env=env,
                          capture_output=True, text=True)
    if required:
        assert proc.returncode != 0 and "no GPU is usable" in proc.stdout, proc.stdout[-2000:]
    else:
        assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout[-2000:]


def test_grammar_verdict_accepts_only_outputs_in_the_requested_language():
    from test_grammar_plain import grammar_requests, matches

    from sglang_adaptive.bench.workloads import JSON_SCHEMA as SCHEMA

    reqs = grammar_requests(8)
    regex_req = next(r for r in reqs if "regex" in r["sampling_params"])
    json_req = next(r for r in reqs if "json_schema" in r["sampling_params"])
    assert sum("regex" in r["sampling_params"] or "json_schema" in r["sampling_params"] for r in reqs) == 4
    assert matches(regex_req, "yes, 42, 7, 0, 999.")
    for text in ("yes, 42, 7, 0, 999", "yes, 42.", "maybe, 1, 2, 3, 4."):
        assert not matches(regex_req, text), text
    tags = '"tags":["alpha","beta","gamma","beta"]'
    assert matches(json_req, '{"ok":true,"n":7,' + tags + '}')
    for text in ('{"ok":true,"n":7}', '{"ok":1,"n":7,' + tags + '}', '{"ok":true,"n":1000,' + tags + '}',
                 '{"ok":true,"n":true,' + tags + '}', '{"ok":true,"n":7,"x":0,' + tags + '}',
                 '{"ok":true,"n":7,"tags":["alpha"]}', '{"ok":true,"n":7,"tags":["a","b","c","d"]}'):
        assert not matches(json_req, text), text
    assert SCHEMA["additionalProperties"] is False


def decode_run(*batches):
    """A run whose scheduler logged one decode line per (batch size, accept len or None)."""
    lines = "".join(f"[t] Decode batch, #running-req: {n}, #token: 9, "
                    + (f"accept len: {a:.2f}, " if a else "") + "#queue-req: 0\n" for n, a in batches)
    return Run([{"output_ids": [1]}], lines)


def gpu_test_module(name):
    """A module of test/gpu by path: test/unit has modules of the same names."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"gpu_{name}", Path(suite.__file__).parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keep_warm_ramp_verdicts_compare_the_same_batch_sizes_and_full():
    kw = gpu_test_module("test_keep_warm")

    # Static EAGLE-3 under the ramp: 3.0 in its small batches, 2.0 in the large ones.
    static = decode_run((1, 3.0), (8, 3.0), (9, 2.0), (32, 2.0))
    assert static.spec_accept_length(kw.RAMP_THRESHOLD) == 3.0
    full = decode_run((4, 3.0), (20, None))
    runs = {kw.RAMP_REFERENCE: static, "threshold-8-ramp-full": full}
    for kv_accept, ok in ((3.0, True), (2.995, True), (2.9, False)):  # within both tolerances, then not
        runs["threshold-8-ramp-kv"] = decode_run((4, kv_accept), (20, None))
        for rule in (kw.test_kv_under_the_ramp_matches_static_eagle3_in_the_same_batches,
                     lambda r: kw.test_kv_reaches_what_running_the_whole_draft_gives(r, "threshold-8-ramp")):
            if ok:
                rule(runs)
            else:
                with pytest.raises(AssertionError):
                    rule(runs)


def test_constrained_grammar_requests_have_room_to_finish_their_document():
    from test_grammar_plain import CONSTRAINED_MAX_TOKENS, grammar_requests

    for r in grammar_requests(8):
        params = r["sampling_params"]
        constrained = "regex" in params or "json_schema" in params
        assert (params["max_new_tokens"] == CONSTRAINED_MAX_TOKENS) == constrained


def test_metric_value_sums_the_matching_samples():
    from sglang_adaptive.testing import metric_value

    text = ('# HELP x_total a counter\n# TYPE x_total counter\n'
            'x_total{model_name="m",mode="plain"} 3.0\n'
            'x_total{model_name="m",mode="spec"} 5.0\n'
            'x_total{model_name="other, \\"quoted\\"",mode="plain"} 1.0\n'
            'x_total_other{mode="plain"} 100.0\n'
            'y 2.5e+01\n')
    assert metric_value(text, "x_total", mode="plain") == 4.0
    assert metric_value(text, "x_total") == 9.0
    assert metric_value(text, "x_total", mode="plain", model_name="m") == 3.0
    assert metric_value(text, "y") == 25.0
    assert metric_value(text, "x_total", mode="off") is None and metric_value("", "y") is None


def telemetry_scrape(plain=5, spec=5, switches=1, verifies=10, tokens=25, step_count=(3, 3)):
    p = "sglang_adaptive_"
    lines = [f'{p}decode_batches_total{{model_name="m",mode="plain"}} {plain}',
             f'{p}decode_batches_total{{model_name="m",mode="spec"}} {spec}',
             f'{p}mode_switches_total{{model_name="m"}} {switches}',
             f'{p}speculative_mode{{model_name="m"}} 0.0',
             f'{p}verify_requests_total{{model_name="m"}} {verifies}',
             f'{p}verify_tokens_total{{model_name="m"}} {tokens}']
    for mode, n in zip(("plain", "spec"), step_count):
        lines += [f'{p}decode_step_seconds_count{{model_name="m",mode="{mode}"}} {n}',
                  f'{p}decode_step_seconds_sum{{model_name="m",mode="{mode}"}} {0.005 * n}']
    return "\n".join(lines) + "\n"


def telemetry_run(verify_ct=(5, 5), correct=(7, 8), completion=(20, 20)):
    line = "[t] AdaptiveEAGLE decode batches: 10 (plain 5, 50.0%; speculative 5), switches: 1\n"
    results = [{"output_ids": [1], "meta_info": {"spec_verify_ct": v, "spec_num_correct_drafts": c,
                                                 "spec_accept_length": 1 + c / v, "completion_tokens": n}}
               for v, c, n in zip(verify_ct, correct, completion)]
    return Run(results, line)


@pytest.mark.parametrize("scrape, run, failing", [
    (telemetry_scrape(), telemetry_run(), None),
    (telemetry_scrape(plain=6), telemetry_run(), "test_mode_series_count_the_batches_the_log_counts"),
    (telemetry_scrape(switches=2), telemetry_run(), "test_mode_series_count_the_batches_the_log_counts"),
    (telemetry_scrape(step_count=(0, 3)), telemetry_run(), "test_step_time_series_hold_both_modes"),
    # The series counted the plain steps as verifies, or missed verifies.
    (telemetry_scrape(verifies=20, tokens=35), telemetry_run(), "test_verify_series_agree_with_the_requests_counters"),
    (telemetry_scrape(verifies=9), telemetry_run(), "test_verify_series_agree_with_the_requests_counters"),
    (telemetry_scrape(tokens=40), telemetry_run(), "test_verify_series_agree_with_the_requests_counters"),
    # Upstream's completion_tokens / spec_verify_ct: plain tokens counted as accepted drafts.
    (telemetry_scrape(), Run([{"output_ids": [1], "meta_info": {
        "spec_verify_ct": 5, "spec_num_correct_drafts": 7, "spec_accept_length": 4.0, "completion_tokens": 20}}] * 2,
        "[t] AdaptiveEAGLE decode batches: 10 (plain 5, 50.0%; speculative 5), switches: 1\n"),
     "test_per_request_accept_length_counts_speculative_steps_only"),
    # Every token came from speculative steps: nothing plain was put to the test.
    (telemetry_scrape(), telemetry_run(completion=(13, 14)),
     "test_per_request_accept_length_counts_speculative_steps_only"),
])
def test_telemetry_verdicts(scrape, run, failing):
    tel = gpu_test_module("test_telemetry")
    tests = [getattr(tel, n) for n in dir(tel) if n.startswith("test_")]
    assert len(tests) == 4
    for test in tests:
        if test.__name__ == failing:
            with pytest.raises(AssertionError):
                test((run, scrape))
        else:
            test((run, scrape))
