"""Compare the scheduler host time of servers, per decode iteration at one batch size.

Reads the ``hosttime-<pid>.json`` files that ``SGLANG_ADAPTIVE_HOST_TIMING=DIR``
makes each scheduler process write (``sglang_adaptive.hosttime``), one DIR per
server, and prints per function the milliseconds per decode iteration (its seconds
in the bucket / the bucket's run_batch calls), side by side, rank 0 only (the
lowest pid; ranks run the same code).

usage: python benchmark/hosttime_report.py --bucket decode-128 plain=DIR1 adaptive=DIR2 [--json OUT]
"""

from __future__ import annotations

import argparse
import glob
import json
import os

RUN_BATCH = "sglang.srt.managers.scheduler:Scheduler.run_batch"


def load(directory: str) -> dict:
    files = sorted(glob.glob(os.path.join(directory, "hosttime-*.json")))
    if not files:
        raise SystemExit(f"no hosttime-*.json in {directory}")
    docs = [json.load(open(f)) for f in files]
    return min(docs, key=lambda d: d["pid"])["buckets"]


# A longest call above this is a one-off (a kernel compiled on first use: 8.8 s in one
# ForwardBatch.init_new on a cold host) and is left out of the per-iteration time.
ONE_OFF_S = 0.05


def per_iteration(buckets: dict, bucket: str) -> tuple[int, dict, dict]:
    """(iterations, ms per iteration by function, seconds of each one-off call left out)."""
    cells = buckets.get(bucket, {})
    iterations = cells.get(RUN_BATCH, {}).get("calls", 0)
    if not iterations:
        return 0, {}, {}
    one_offs = {name: c["max_s"] for name, c in cells.items()
                if c.get("max_s", 0.0) > ONE_OFF_S and c["calls"] > 1}
    return iterations, {name: 1e3 * (c["s"] - one_offs.get(name, 0.0)) / iterations
                        for name, c in cells.items()}, one_offs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("servers", nargs="+", metavar="LABEL=DIR")
    p.add_argument("--bucket", action="append", required=True)
    p.add_argument("--json")
    args = p.parse_args()
    servers = dict(s.split("=", 1) for s in args.servers)
    data = {label: load(d) for label, d in servers.items()}
    out = {}
    for bucket in args.bucket:
        rows = {label: per_iteration(b, bucket) for label, b in data.items()}
        names = sorted({n for _, r, _ in rows.values() for n in r},
                       key=lambda n: -max(r.get(n, 0.0) for _, r, _ in rows.values()))
        labels = list(rows)
        print(f"\n## {bucket}: ms per decode iteration (iterations: "
              + ", ".join(f"{k} {rows[k][0]}" for k in labels) + ")\n")
        print("| function | " + " | ".join(labels) + " |")
        print("|---|" + "---:|" * len(labels))
        for n in names:
            short = n.split(":")[-1]
            print(f"| {short} | " + " | ".join(f"{rows[k][1].get(n, 0.0):.3f}" for k in labels) + " |")
        for k in labels:
            for n, seconds in rows[k][2].items():
                print(f"\n{k}: one call of {n.split(':')[-1]} took {seconds:.3f} s, left out (one-off)")
        out[bucket] = {k: {"iterations": rows[k][0], "ms": rows[k][1], "one_off_s": rows[k][2]} for k in labels}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
