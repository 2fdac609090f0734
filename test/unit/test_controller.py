from sglang_adaptive import controller as ctl
from sglang_adaptive.policy import AlternatePolicy, ThresholdPolicy


def test_default_controller_is_upstream_behaviour():
    c = ctl.current()
    assert not c.active
    assert c.speculate(512) is True
    assert c.kv_reserve(False, True) is None


def test_grammar_batches_stay_speculative():
    c = ctl.AdaptiveModeController(ThresholdPolicy(0), spec_width=4)
    assert c.speculate(8, has_grammar=False) is False
    assert c.speculate(8, has_grammar=True) is True


def test_reserve_follows_the_in_flight_mode():
    c = ctl.AdaptiveModeController(AlternatePolicy(1), spec_width=4)
    assert c.kv_reserve(True, True) is None  # speculative: upstream's 2 x alloc_len
    assert c.kv_reserve(False, True) == 2  # nothing wide in flight yet
    c.on_prepare(True, 8)
    assert c.kv_reserve(False, True) == 5  # a verify of 4 tokens may still be writing
    assert c.kv_reserve(False, False) == 1  # no overlap: committed length is exact
    c.on_prepare(False, 8)
    assert c.kv_reserve(False, True) == 2


def test_stats_count_batches_and_switches():
    c = ctl.AdaptiveModeController(AlternatePolicy(2), spec_width=4)
    for _ in range(6):
        spec = c.speculate(3)
        c.on_prepare(spec, 3)
    s = c.stats
    assert (s.spec_batches, s.plain_batches, s.switches, s.plain_tokens) == (4, 2, 2, 6)
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
        stats.record(speculative, 8)
    stats.max_plain_reserve = 2
    m = re.search(STATS_LOG_PATTERN, "AdaptiveEAGLE " + stats.summary())
    assert m and m.groups() == ("4", "2", "2", "2", "2")
    stats.max_plain_reserve = 0
    assert re.search(STATS_LOG_PATTERN, "AdaptiveEAGLE " + stats.summary()).group(5) is None
