"""CPU pinning for host-bound benchmarks (``--pin-cpus``): each scheduler process on a
physical core of its own, every other process of the server and the bench's client on
the remaining cores.

Why: on the tiny pair a decode step is 1-4 ms of the scheduler's host work, so where
the OS runs the scheduler's thread (alone on a core, or beside the client's event loop
or the detokenizer on one core's two hardware threads) sets the server's speed. Servers
of one configuration ran 0.81-1.18x each other's speed on one H100 host
(benchmark/results/2026-12-06-h100-goodput-tiny-rules), more than the 2% a bar judges.
A model whose steps wait on the GPU does not need this.

The pinning applies to every thread a process has once the server is ready; threads
started later inherit it from the thread that starts them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

SIBLINGS = "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"
# SGLang names each scheduler process "sglang::scheduler", with "_TP<rank>" etc. at TP > 1.
SCHEDULER_TITLE = "sglang::scheduler"
# Cores left for the server's other processes and the client, at least.
REST_CORES = 2


class PinningError(RuntimeError):
    pass


def parse_cpu_list(text: str) -> set[int]:
    """The kernel's CPU list format: ``0-3,8,10-11``."""
    cpus = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def sysfs_siblings(cpu: int) -> set[int]:
    try:
        with open(SIBLINGS.format(cpu)) as f:
            return parse_cpu_list(f.read())
    except OSError:  # no topology exposed: count each CPU as a core
        return {cpu}


def physical_cores(cpus: Iterable[int],
                   siblings_of: Callable[[int], set[int]] = sysfs_siblings) -> list[frozenset[int]]:
    """The usable CPUs grouped by physical core, in CPU order."""
    usable, cores, seen = set(cpus), [], set()
    for cpu in sorted(usable):
        if cpu not in seen:
            core = frozenset((siblings_of(cpu) & usable) | {cpu})
            seen |= core
            cores.append(core)
    return cores


@dataclass(frozen=True)
class Plan:
    schedulers: tuple[frozenset[int], ...]  # one physical core each, by scheduler title order
    rest: frozenset[int]

    @property
    def scheduler_cpus(self) -> frozenset[int]:
        return frozenset().union(*self.schedulers)

    def slot(self, k: int, schedulers: int) -> Plan:
        """The k-th server's share where several run at once (``--interleave``)."""
        return Plan(self.schedulers[k * schedulers:(k + 1) * schedulers], self.rest)

    def describe(self) -> str:
        cores = "; ".join(",".join(map(str, sorted(c))) for c in self.schedulers)
        return f"scheduler CPUs {cores}; everything else on {len(self.rest)} CPUs"


def make_plan(cores: list[frozenset[int]], schedulers: int) -> Plan:
    """The last cores go to the schedulers (the first usually takes the interrupts)."""
    if schedulers < 1:
        raise PinningError("--pin-cpus found no scheduler process (sglang::scheduler*) in the server")
    if len(cores) < schedulers + REST_CORES:
        raise PinningError(
            f"--pin-cpus needs {schedulers + REST_CORES} physical cores (one per scheduler, "
            f"{REST_CORES} for the rest), but this process may use {len(cores)}")
    return Plan(tuple(cores[len(cores) - schedulers:]),
                frozenset().union(*cores[:len(cores) - schedulers]))


def assign(processes: list[tuple[int, str]], plan: Plan) -> dict[int, frozenset[int]]:
    """pid -> CPUs for a server's processes, given as (pid, command line)."""
    schedulers = sorted((cmd, pid) for pid, cmd in processes if SCHEDULER_TITLE in cmd)
    if len(schedulers) != len(plan.schedulers):
        raise PinningError(f"--pin-cpus planned for {len(plan.schedulers)} scheduler processes, "
                           f"the server runs {len(schedulers)}")
    cpus = {pid: plan.rest for pid, _ in processes}
    cpus.update({pid: core for (_, pid), core in zip(schedulers, plan.schedulers)})
    return cpus


def server_processes(root_pid: int) -> list[tuple[int, str]]:
    import psutil  # an SGLang dependency; imported here, the bench's CPU tests do without it

    root = psutil.Process(root_pid)
    out = []
    for p in [root, *root.children(recursive=True)]:
        try:
            out.append((p.pid, " ".join(p.cmdline())))
        except psutil.NoSuchProcess:
            pass
    return out


def pin_process(pid: int, cpus: frozenset[int], setaffinity=os.sched_setaffinity) -> None:
    """Every thread of ``pid``: sched_setaffinity on a pid moves only that thread."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            setaffinity(tid, cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


class Pinner:
    """Pins each server the bench starts, and the bench itself, by one plan made from
    the CPUs the bench may use when it starts (before it pins itself). ``slots``
    servers run at once (``--interleave``), each with cores of its own."""

    def __init__(self, cpus: Iterable[int] | None = None, siblings_of=sysfs_siblings,
                 processes=server_processes, pin=pin_process, slots: int = 1):
        self.cores = physical_cores(os.sched_getaffinity(0) if cpus is None else cpus, siblings_of)
        self._processes, self._pin, self.slots = processes, pin, slots
        self.plan: Plan | None = None

    def check(self, schedulers: int) -> None:
        """Refuse at the start, before any server, where the host has too few cores."""
        make_plan(self.cores, schedulers * self.slots)

    def pin_server(self, root_pid: int, slot: int = 0) -> Plan:
        procs = self._processes(root_pid)
        schedulers = sum(SCHEDULER_TITLE in cmd for _, cmd in procs)
        if self.plan is None or len(self.plan.schedulers) != schedulers * self.slots:
            self.plan = make_plan(self.cores, schedulers * self.slots)
        mine = self.plan.slot(slot, schedulers)
        for pid, cpus in assign(procs, mine).items():
            self._pin(pid, cpus)
        self._pin(os.getpid(), self.plan.rest)  # the client
        return mine
