"""CPU time the hypervisor took from this host's CPUs while a point ran (steal, from
/proc/stat), for all CPUs and for the scheduler's pinned ones.

Why: a host-bound pair's servers ran 0.66-1.16x each other's speed on one H100 host,
its speed drifting within a server over seconds
(benchmark/results/2026-12-06-h100-tiny-pinned). Steal time says whether the drift
comes from other guests on the machine; zero steal points at the host itself (clock
speed, memory). Pure Python, read from text, so tests feed it a fabricated file.
"""

from __future__ import annotations

from collections.abc import Iterable

PROC_STAT = "/proc/stat"
# /proc/stat "cpu" lines: user nice system idle iowait irq softirq steal guest guest_nice;
# guest time is already counted in user, so the first eight make the total.
STEAL = 7


def cpu_times(text: str | None = None) -> dict[str, tuple[int, int]]:
    """"cpu" (every CPU) and "cpuN" -> (total jiffies, stolen jiffies); empty where the
    file is missing (not Linux)."""
    if text is None:
        try:
            with open(PROC_STAT) as f:
                text = f.read()
        except OSError:
            return {}
    out = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and len(fields) > STEAL:
            values = [int(x) for x in fields[:STEAL + 1]]
            out[name] = (sum(values), values[STEAL])
    return out


def steal_share(before: dict, after: dict, cpus: Iterable[int] | None = None) -> float | None:
    """Stolen share of the CPU time that passed on ``cpus`` (every CPU: None); None
    where nothing passed or the counters are missing."""
    names = ["cpu"] if cpus is None else [f"cpu{c}" for c in cpus]
    total = stolen = 0
    for name in names:
        if name not in before or name not in after:
            return None
        total += after[name][0] - before[name][0]
        stolen += after[name][1] - before[name][1]
    return round(stolen / total, 4) if total > 0 else None
