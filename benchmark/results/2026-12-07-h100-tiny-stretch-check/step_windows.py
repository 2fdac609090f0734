"""step-windows.json from the server logs (not kept): step windows at batch 1, the long
run's c=1 timeline and the gap split's windows paired by accept length (the slices of
the three judging runs pooled: pooled/report.md). Run in a folder holding the unpacked step archives as
r2/ (first lease: gt-tiny-judge, gt-tiny-gapsplit), r3/ (its second judging run) and
r4/ (gt-tiny-judge-long): python step_windows.py > step-windows.json"""

import glob
import json
import os
import re
import statistics as st
from collections import defaultdict

WINDOW = re.compile(
    r"\[(\S+ \S+)\] Decode batch, #running-req: (\d+),.*?(?:accept len: ([\d.]+),.*?)?"
    r"gen throughput \(token/s\): ([\d.]+)"
)
RUNS = {
    "judge-a": "r2/gt-tiny-judge",
    "judge-b": "r3/gt-tiny-judge",
    "judge-long": "r4/gt-tiny-judge-long",
    "gapsplit": "r2/gt-tiny-gapsplit",
}


def quantile(values, p):
    values = sorted(values)
    return round(values[min(len(values) - 1, int(p * len(values)))], 3)


def windows(path, batch_size="1"):
    """(hh:mm:ss, accept length or None for a plain window, tok/s) of each decode log
    window at the batch size."""
    out = []
    with open(path) as f:
        for line in f:
            m = WINDOW.search(line)
            if m and m.group(2) == batch_size and float(m.group(4)) > 0:
                out.append((m.group(1)[-8:], float(m.group(3)) if m.group(3) else None, float(m.group(4))))
    return out


def servers(run):
    for path in sorted(glob.glob(RUNS[run] + "/server-*.log")):
        yield os.path.basename(path)[len("server-"):-len(".log")], path


def spread(ms):
    if not ms:
        return None
    base = quantile(ms, 0.25)
    return {"windows": len(ms), "p10": quantile(ms, 0.1), "p25": base, "p50": quantile(ms, 0.5),
            "share_over_1.25x_p25": round(sum(x > 1.25 * base for x in ms) / len(ms), 2)}


def main():
    doc = {"batch1_step_windows": {}, "judge_long_c1_timeline_ms_per_step": {},
           "gapsplit_paired_windows": {}}
    for run in RUNS:
        res = {}
        for name, path in servers(run):
            w = windows(path)
            # ms a step: a speculative window's accept length over its tok/s.
            spec = [a * 1000 / t for _, a, t in w if a is not None and a >= 1.5]
            plain = [1000 / t for _, a, t in w if a is None]
            res[name] = {"ms_per_spec_step": spread(spec), "ms_per_plain_step": spread(plain)}
        doc["batch1_step_windows"][run] = res
    for name, path in servers("judge-long"):
        by_second = defaultdict(list)
        for t, a, thr in windows(path):
            by_second[t].append((a or 1.0) * 1000 / thr)
        doc["judge_long_c1_timeline_ms_per_step"][name] = {
            t: round(st.median(v), 2) for t, v in sorted(by_second.items()) if len(v) >= 3}
    eagle3 = windows(RUNS["gapsplit"] + "/server-eagle3.log")
    for name in ("adaptive-never-plain-kv", "adaptive-never-plain-none"):
        other = windows(f"{RUNS['gapsplit']}/server-{name}.log")
        # The same requests and tokens on both servers: a window pairs where accept lengths match.
        ratios = [y[2] / x[2] for x, y in zip(eagle3, other) if x[1] == y[1]]
        doc["gapsplit_paired_windows"][name] = {
            "pairs_same_accept_len": len(ratios), "of": len(eagle3),
            "tok_per_s_ratio_median": round(st.median(ratios), 4),
            "geometric_mean": round(st.geometric_mean(ratios), 4)}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
