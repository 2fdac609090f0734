"""stretches.json from judge-threads' server logs (not kept) and threads.jsonl(.xz): per
server, the seconds its batch-1 steps ran slow (median over 1.25x the server's p25), how
many of those had another sampled thread busy on the scheduler's CPU, its steps by the
CPU its scheduler ran on, and each scheduler's main-thread CPU time over the run. Run
beside the unpacked step archive gt-tiny-judge-threads/: python stretches.py > stretches.json"""

import bisect
import collections
import datetime
import json
import re
import statistics as st

D = "gt-tiny-judge-threads"
WINDOW = re.compile(r"\[(\S+ \S+)\] Decode batch, #running-req: (\d+),.*?(?:accept len: ([\d.]+),.*?)?"
                    r"gen throughput \(token/s\): ([\d.]+)")
SERVERS = {"plain": ("server-plain.log", "30000"), "eagle3": ("server-eagle3.log", "30010"),
           "adaptive-goodput": ("server-adaptive-goodput.log", "30020")}


def epoch(stamp):  # the logs' time is the host's UTC
    return datetime.datetime.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def step_windows(name, path):
    """(epoch second, batch size, ms a step) of each decode-log window: speculative
    windows of a speculating server, plain ones of no-spec."""
    out = []
    for line in open(f"{D}/{path}"):
        m = WINDOW.search(line)
        if m and float(m.group(4)) > 0 and (m.group(3) is None) == (name == "plain"):
            bs = int(m.group(2))
            out.append((epoch(m.group(1)), bs, float(m.group(3) or 1) * bs / float(m.group(4)) * 1000))
    return out


samples = collections.defaultdict(list)
port_of = {}
for line in open(f"{D}/threads.jsonl"):
    r = json.loads(line)
    samples[r["pid"]].append((r["t"], r["threads"]))
    port_of[r["pid"]] = r["port"]
# a server's scheduler: the busiest process on its port
sched = {name: max((p for p in samples if port_of[p] == port),
                   key=lambda p: sum(th.get("main", [0, 0])[1] for _, th in samples[p]))
         for name, (_, port) in SERVERS.items()}
everyone = sorted((t, pid, th) for pid, ss in samples.items() for t, th in ss)
times = [t for t, _, _ in everyone]


def sharers(pid, t, cpu):
    """Other sampled threads that ran on ``cpu`` in the sample at ``t``."""
    i = bisect.bisect_left(times, t - 0.26)
    out = []
    while i < len(everyone) and everyone[i][0] < t + 0.26:
        _, p2, th = everyone[i]
        out += [n for n, v in th.items() if p2 != pid and v[3] == cpu and v[1] > 0.02]
        i += 1
    return out


doc = {}
for name, (path, _) in SERVERS.items():
    pid, wins = sched[name], step_windows(name, path)
    ts = [t for t, _ in samples[pid]]
    by_second = collections.defaultdict(list)
    by_cpu = collections.defaultdict(list)
    for t, bs, ms in wins:
        i = min(bisect.bisect_left(ts, t + 0.5), len(ts) - 1)
        main = samples[pid][i][1].get("main")
        if bs == 1:
            by_second[t].append(ms)
        if main and bs in (1, 8, 64):
            by_cpu[(bs, main[3])].append(ms)
    ones = sorted(ms for v in by_second.values() for ms in v)
    p25 = ones[len(ones) // 4]
    slow = [t for t, v in by_second.items() if st.median(v) > 1.25 * p25]
    shared = 0
    for t in slow:
        rows = [(t2, th["main"]) for t2, th in samples[pid] if t - 0.5 <= t2 < t + 1.5 and "main" in th]
        shared += any(sharers(pid, t2, m[3]) for t2, m in rows)
    main_cpu = sum(th["main"][1] for _, th in samples[pid] if "main" in th)
    doc[name] = {
        "batch1_seconds": len(by_second), "batch1_p25_ms": round(p25, 3),
        "slow_seconds": len(slow), "slow_seconds_with_another_thread_on_the_cpu": shared,
        "ms_by_scheduler_cpu": {f"batch {bs} cpu {cpu}": {"n": len(v), "p25": round(sorted(v)[len(v) // 4], 3),
                                                          "median": round(st.median(v), 3)}
                                for (bs, cpu), v in sorted(by_cpu.items()) if len(v) >= 10},
        "scheduler_main_thread_cpu_s": round(main_cpu, 1),
        "sampled_span_s": round(samples[pid][-1][0] - samples[pid][0][0], 1),
    }
print(json.dumps(doc, indent=1))
