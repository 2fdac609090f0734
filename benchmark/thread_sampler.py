"""Per-thread CPU time of SGLang's scheduler processes, sampled while a benchmark runs.

Why: with ``--pin-cpus`` every thread of a scheduler process shares one core. On the tiny
pair each server had stretches of seconds in which its decode steps took 1.3-1.6x as long,
while another server's steps in the same seconds did not
(benchmark/results/2026-12-07-h100-tiny-stretch-check). If another thread of that process
ran then, it took the core from the scheduler's main thread; these samples show it, beside
the decode log's timestamps.

Each sample is a JSON line per matching process that ran: its pid, its server's ``--port``, the
wall time, and for every thread that ran since the last sample its name, CPU seconds,
involuntary context switches in that interval and the CPU it last ran on (``main``: the
thread whose id is the pid). A VM need not show which of its CPUs share a physical core:
with the bench's client and the servers' other processes matched too (``--match`` again),
a scheduler's slow seconds can be set beside where the busy threads ran.

usage: python benchmark/thread_sampler.py --out FILE [--every 0.5] [--seconds 900]
       [--match sglang::scheduler [--match TEXT ...]]
       python benchmark/thread_sampler.py --summarize FILE   (per process and second: the
       main thread's CPU seconds, the others', the busiest other thread)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def stat_fields(stat: str) -> tuple[str, list[str]]:
    """A /proc stat line's name and its fields from field 3 (state) on. The name sits in
    parentheses and may hold spaces or parentheses itself."""
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()


def read_thread(task: Path) -> tuple[str, float, int, int] | None:
    """(name, CPU seconds, involuntary context switches, the CPU it last ran on) of one
    /proc/PID/task/TID, or None for a thread that ended meanwhile."""
    try:
        stat = (task / "stat").read_text()
        status = (task / "status").read_text()
    except OSError:
        return None
    name, fields = stat_fields(stat)  # fields[0] is field 3 (state)
    cpu = (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime: fields 14 and 15
    switches = next((int(line.split()[1]) for line in status.splitlines()
                     if line.startswith("nonvoluntary_ctxt_switches")), 0)
    return name, cpu, switches, int(fields[36])  # processor: field 39


def matching_pids(match: tuple[str, ...], proc: Path = Path("/proc")) -> list[int]:
    """Processes whose command line (SGLang sets the process title there) holds one of
    ``match``, this one aside (its own command line holds them too)."""
    pids = []
    for entry in proc.iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(m in cmdline for m in match):
                pids.append(int(entry.name))
    return sorted(pids)


def server_port(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The ``--port`` of the launch_server process that is ``pid`` or its parent (which
    server it belongs to: a scheduler's or detokenizer's title holds no flags)."""
    try:
        parent = stat_fields((proc / str(pid) / "stat").read_text())[1][1]  # field 4: ppid
    except (OSError, IndexError, ValueError):
        return None
    for p in (str(pid), parent):
        try:
            args = (proc / p / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "--port" in args[:-1]:
            return args[args.index("--port") + 1]
    return None


class Sampler:
    def __init__(self, match: tuple[str, ...], proc: Path = Path("/proc"), clock=time.time):
        self.match, self.proc, self.clock = tuple(match), proc, clock
        self.last: dict[tuple[int, int], tuple[float, int]] = {}
        self.seen: dict[int, str | None] = {}  # pid -> its server's port

    def sample(self) -> list[dict]:
        """One line per matching process: each thread's CPU seconds and involuntary
        switches since the previous sample. A process's first sample sets the baseline
        (no line: its threads' totals since start belong to no interval); a thread
        that starts later counts from its start."""
        now, lines = self.clock(), []
        for pid in matching_pids(self.match, self.proc):
            first = pid not in self.seen
            if first:
                self.seen[pid] = server_port(pid, self.proc)
            try:
                tids = sorted(int(t) for t in os.listdir(self.proc / str(pid) / "task"))
            except OSError:
                continue
            threads = {}
            for tid in tids:
                seen = read_thread(self.proc / str(pid) / "task" / str(tid))
                if seen is None:
                    continue
                name, cpu, switches, processor = seen
                cpu0, switches0 = self.last.get((pid, tid), (0.0, 0))
                self.last[(pid, tid)] = (cpu, switches)
                if cpu > cpu0 or switches > switches0:
                    threads["main" if tid == pid else str(tid)] = [
                        name, round(cpu - cpu0, 3), switches - switches0, processor]
            if not first and threads:  # an idle process (or the driving shell, whose text matches) says nothing
                lines.append({"t": round(now, 3), "pid": pid, "port": self.seen[pid], "threads": threads})
        return lines


def summarize(lines: list[dict]) -> dict:
    """Per process (keyed ``port PORT, pid PID``) and second (hh:mm:ss, local time as in
    SGLang's log): the main thread's CPU seconds, the other threads' together, and the
    busiest other thread's name."""
    out: dict = defaultdict(dict)
    for line in lines:
        second = time.strftime("%H:%M:%S", time.localtime(line["t"]))
        process = f"port {line.get('port')}, pid {line['pid']}"
        cell = out[process].setdefault(second, {"main_cpu_s": 0.0, "others_cpu_s": 0.0, "busiest": {}})
        for tid, (name, cpu, *_rest) in line["threads"].items():
            if tid == "main":
                cell["main_cpu_s"] = round(cell["main_cpu_s"] + cpu, 3)
            else:
                cell["others_cpu_s"] = round(cell["others_cpu_s"] + cpu, 3)
                cell["busiest"][name] = round(cell["busiest"].get(name, 0.0) + cpu, 3)
    for by_second in out.values():
        for cell in by_second.values():
            cell["busiest"] = max(cell["busiest"], key=cell["busiest"].get) if cell["busiest"] else None
    return dict(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON lines to append to")
    p.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    p.add_argument("--seconds", type=float, default=900, help="stop after this long")
    p.add_argument("--match", action="append",
                   help="text of the processes' command line (again for more; default sglang::scheduler)")
    p.add_argument("--summarize", metavar="FILE", help="print the per-second summary of a sample file")
    a = p.parse_args(argv)
    if a.summarize:
        lines = [json.loads(x) for x in Path(a.summarize).read_text().splitlines() if x.strip()]
        print(json.dumps(summarize(lines), indent=1))
        return
    if not a.out:
        p.error("--out FILE (or --summarize FILE)")
    sampler, end = Sampler(tuple(a.match or ["sglang::scheduler"])), time.monotonic() + a.seconds
    with open(a.out, "a") as f:
        while time.monotonic() < end:
            for line in sampler.sample():
                f.write(json.dumps(line) + "\n")
            f.flush()
            time.sleep(a.every)


if __name__ == "__main__":
    main()
