"""Fail unless the CPU suite covers the core modules well enough.

    python test/check_coverage.py build/coverage.json

The worker, its plain graphs, the scheduler hooks and the controller carry the
mode switch; each must stay at or above ``FLOOR`` line coverage.
"""

from __future__ import annotations

import json
import sys

FLOOR = 90.0
CORE = ("worker.py", "plain_graph.py", "scheduler_hooks.py", "controller.py")


def main(path: str) -> int:
    files = json.load(open(path))["files"]
    failed = False
    for name in CORE:
        entry = next((v for k, v in files.items() if k.endswith("sglang_adaptive/" + name)), None)
        if entry is None:
            print(f"coverage: {name} was never imported by the suite")
            failed = True
            continue
        pct = entry["summary"]["percent_covered"]
        ok = pct >= FLOOR
        failed |= not ok
        print(f"coverage: {name:20s} {pct:5.1f}% {'ok' if ok else f'below {FLOOR:.0f}%'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
