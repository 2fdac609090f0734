"""Steal time from /proc/stat text: the share of CPU time the hypervisor took."""

from __future__ import annotations

from sglang_adaptive.bench import hostload

BEFORE = """cpu  100 0 50 800 10 0 5 35 0 0
cpu0 50 0 25 400 5 0 2 18 0 0
cpu1 50 0 25 400 5 0 3 17 0 0
intr 1 2 3
"""
# 200 jiffies pass on each CPU; cpu1 loses 40 of its 200 to steal, cpu0 none.
AFTER = """cpu  300 0 100 895 20 0 10 75 0 0
cpu0 150 0 50 467 10 0 5 18 0 0
cpu1 150 0 50 428 10 0 5 57 0 0
intr 4 5 6
"""


def test_cpu_lines_give_total_and_stolen_jiffies():
    times = hostload.cpu_times(BEFORE)
    assert times == {"cpu": (1000, 35), "cpu0": (500, 18), "cpu1": (500, 17)}


def test_steal_share_over_every_cpu_and_over_chosen_ones():
    before, after = hostload.cpu_times(BEFORE), hostload.cpu_times(AFTER)
    assert hostload.steal_share(before, after) == 0.1  # 40 of 400
    assert hostload.steal_share(before, after, [1]) == 0.2
    assert hostload.steal_share(before, after, [0]) == 0.0
    assert hostload.steal_share(before, after, [7]) is None  # no such CPU
    assert hostload.steal_share(before, before) is None  # no time passed
    assert hostload.steal_share({}, {}) is None  # no /proc/stat
