from sglang_adaptive import controller as ctl
from sglang_adaptive.policy import AlternatePolicy, ThresholdPolicy


def test_default_controller_is_upstream_behaviour():
    c = ctl.current()
    assert not c.active
    assert c.speculate(512) is True
    assert c.kv_reserve(False, True) is None


def test_grammar_batches_go_plain_unless_plain_grammar_is_off():
    c = ctl.AdaptiveModeController(ThresholdPolicy(0), spec_width=4)
    assert c.speculate(8, has_grammar=True) is False
    c = ctl.AdaptiveModeController(ThresholdPolicy(0), spec_width=4, plain_grammar=False)
    assert c.speculate(8, has_grammar=False) is False
    assert c.speculate(8, has_grammar=True) is True


def test_reserve_follows_the_in_flight_mode():
    c = ctl.AdaptiveModeController(AlternatePolicy(1), spec_width=4)
    assert c.kv_reserve(True, True) is None  # speculative: upstream's 2 x alloc_len
    assert c.kv_reserve(False, True) == 2  # nothing wide in flight yet
    c.on_prepare(True)
    assert c.kv_reserve(False, True) == 5  # a verify of 4 tokens may still be writing
    assert c.kv_reserve(False, False) == 1  # no overlap: committed length is exact
    c.on_prepare(False)
    assert c.kv_reserve(False, True) == 2


def test_stats_count_batches_and_switches():
    c = ctl.AdaptiveModeController(AlternatePolicy(2), spec_width=4)
    for _ in range(6):
        spec = c.speculate(3)
        c.on_prepare(spec)
    s = c.stats
    assert (s.spec_batches, s.plain_batches, s.switches) == (4, 2, 2)
    assert "plain 2" in s.summary() and "switches: 2" in s.summary()


def test_install_and_reset():
    c = ctl.AdaptiveModeController(ThresholdPolicy(1), spec_width=4)
    ctl.install(c)
    assert ctl.current() is c
    ctl.reset()
    assert not ctl.current().active


def test_stats_line_is_what_the_readers_parse():
    import re

    from sglang_adaptive.controller import STATS_LOG_PATTERN, ModeStats

    stats = ModeStats()
    for speculative in (True, False, False, True):
        stats.record(speculative)
    stats.max_plain_reserve = 2
    stats.plain_prefills = 3
    m = re.search(STATS_LOG_PATTERN, "AdaptiveEAGLE " + stats.summary())
    assert m and m.groups() == ("4", "2", "2", "2", "2", "3")
    stats.max_plain_reserve = stats.plain_prefills = 0
    assert re.search(STATS_LOG_PATTERN, "AdaptiveEAGLE " + stats.summary()).groups()[4:] == (None, None)


def _req(allocated, committed):
    from types import SimpleNamespace as NS

    return NS(kv=NS(kv_allocated_len=allocated), kv_committed_len=committed)


def test_kv_audit_keeps_the_largest_reserve_seen():
    c = ctl.AdaptiveModeController(ThresholdPolicy(0), spec_width=4, audit_kv=True)
    c.audit_kv([_req(105, 103), _req(60, 53), _req(10, 10)])  # reserves 2, 7, 0
    assert c.stats.max_plain_reserve == 7
    c.audit_kv([_req(40, 37)])  # a smaller batch later does not lower it
    assert c.stats.max_plain_reserve == 7
    c.audit_kv([])
    assert c.stats.max_plain_reserve == 7
    assert c.stats.summary().endswith(", max plain KV reserve: 7")


def test_kv_audit_off_records_nothing():
    c = ctl.AdaptiveModeController(ThresholdPolicy(0), spec_width=4)
    c.audit_kv([_req(105, 98)])
    assert c.stats.max_plain_reserve == 0
    assert "max plain KV reserve" not in c.stats.summary()
    upstream = ctl.current()  # the upstream controller has no audit at all
    upstream.audit_kv([_req(105, 98)])
    assert upstream.stats.max_plain_reserve == 0


def test_stats_are_logged_every_log_interval(caplog):
    import logging

    c = ctl.AdaptiveModeController(AlternatePolicy(1), spec_width=4, log_interval=2)
    with caplog.at_level(logging.INFO, logger=ctl.__name__):
        for _ in range(5):
            c.on_prepare(c.speculate(3))
    assert [r.getMessage() for r in caplog.records if r.name == ctl.__name__] == [
        "AdaptiveEAGLE decode batches: 2 (plain 1, 50.0%; speculative 1), switches: 1",
        "AdaptiveEAGLE decode batches: 4 (plain 2, 50.0%; speculative 2), switches: 3",
    ]


def test_recovery_profile_files_each_verify_under_its_place_after_a_plain_stretch(caplog):
    import logging
    import re

    from sglang_adaptive.testing import Run

    c = ctl.AdaptiveModeController(AlternatePolicy(3), spec_width=4, log_interval=1)
    c.recovery = ctl.RecoveryProfile(min_stretch=3, depth=2)
    # spec x2 (no stretch before: not profiled), plain x3, spec x4, plain x2 (too short), spec x1, plain x3, spec
    modes = [1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 1]
    with caplog.at_level(logging.INFO):
        for i, m in enumerate(modes):
            c.on_prepare(bool(m), batch_size=2, forward_iter=i)
            if m:  # verify results come back in launch order; tokens = 10 + launch index
                c.on_verify([(10 + i) // 2 - 1, (10 + i + 1) // 2 - 1])
    steps = c.recovery
    assert steps.stretches == 2
    # places 1: launches 5 and 15; 2: launch 6; deeper: 7, 8. Launch 11 follows a 2-step stretch.
    assert steps.verifies == {1: 4, 2: 2, 3: 4}
    assert steps.tokens == {1: 15 + 25, 2: 16, 3: 17 + 18}
    line = [r.getMessage() for r in caplog.records if "after plain stretches" in r.getMessage()][-1]
    assert line == ("AdaptiveEAGLE acceptance after plain stretches of >= 3 steps: "
                    "step 1: 7.500 (2), step 2: 8.000 (2), step >2: 8.750 (4)")
    assert re.search(ctl.RECOVERY_LOG_PATTERN, line)
    assert Run(results=[], log=line).recovery() == {
        "min_stretch": 3, "steps": {1: (7.5, 2), 2: (8.0, 2), "deep": (8.75, 4)}}


def test_prefills_run_the_draft_unless_decode_runs_plain_and_the_worker_can_skip_it():
    assert ctl.ModeController().prefill_drafts() is True, "upstream: every prefill drafts"
    c = ctl.AdaptiveModeController(AlternatePolicy(1), spec_width=4, plain_prefill=True)
    assert c.prefill_drafts() is True, "before any decode batch"
    c.on_prepare(True)
    assert c.prefill_drafts() is True
    c.on_prepare(False)
    assert c.prefill_drafts() is False and c.prefill_drafts() is False
    assert c.stats.plain_prefills == 2
    assert c.stats.summary().endswith(", prefills without the draft: 2")
    c.on_prepare(True)
    assert c.prefill_drafts() is True and c.stats.plain_prefills == 2
    cannot = ctl.AdaptiveModeController(AlternatePolicy(1), spec_width=4)
    cannot.on_prepare(False)
    assert cannot.prefill_drafts() is True and "prefills" not in cannot.stats.summary()
