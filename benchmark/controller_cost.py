"""Host time of the goodput controller's calls per decode batch, on this machine's CPU.

What a goodput server's scheduler runs beside upstream's at every decode batch: the
memory check's and the prepare's answers (``context``, ``speculate``, ``kv_reserve``),
``on_prepare`` (step timing, the policy's bookkeeping, the table's sync every 32
batches) and the acceptance feed (``on_verify``). The controller runs alone, fed a
steady load (step times with 5% noise, acceptance 1-3 drafts, a prefill every ~70
steps) after warm-up at batch 64, 8 and 1, so the policy speculates with a full table,
as the tiny pair's goodput server does at c=1. ``--waits``: the scheduler idles before
each prefill, as at c=1 in a closed loop, where the next request comes once the last
has ended; no prefill price is then filed (``AdaptiveModeController.on_idle``). A
scheduler core on a GPU host runs this code several times slower than a desktop core
does (compare ``hosttime_report.py``'s ``AdaptiveModeController.*`` rows), so the
figures rank the calls, not the server.

usage: python benchmark/controller_cost.py [--batch 1] [--steps 20000] [--waits] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time

from sglang_adaptive.controller import AdaptiveModeController
from sglang_adaptive.policy import GoodputPolicy


class _Req:
    __slots__ = ("kv_committed_len",)

    def __init__(self, length: int):
        self.kv_committed_len = length


def measure(batch: int = 1, steps: int = 20000, seed: int = 0, waits: bool = False) -> dict:
    """Microseconds per decode batch by call, and the share of batches that speculated."""
    rng = random.Random(seed)
    now = [0.0]
    controller = AdaptiveModeController(GoodputPolicy(3), spec_width=4, log_interval=10,
                                        clock=lambda: now[0])
    launches = [0]
    spent: dict[str, int] = {}
    clock = time.perf_counter_ns

    def timed(name, fn, *args):
        tic = clock()
        out = fn(*args)
        spent[name] = spent.get(name, 0) + clock() - tic
        return out

    def step(reqs) -> bool:
        n = len(reqs)
        for _ in range(2):  # the memory check, then the prepare, ask alike
            context = timed("context", controller.context, reqs)
            speculative = timed("speculate", controller.speculate, n, False, context)
            timed("kv_reserve", controller.kv_reserve, speculative, True)
        launches[0] += 1
        timed("on_prepare", controller.on_prepare, speculative, n, launches[0], context)
        now[0] += (0.0031 if speculative else 0.0015) * rng.uniform(0.95, 1.05) * (1 + 0.01 * n)
        if speculative:
            timed("on_verify", controller.on_verify, [rng.choice((1, 2, 3))] * n)
        for r in reqs:
            r.kv_committed_len += 3 if speculative else 1
        if reqs[0].kv_committed_len > 300:  # the requests end; their successors prefill
            for r in reqs:
                r.kv_committed_len = 64
            if waits:
                now[0] += 0.001
                controller.on_idle()
            launches[0] += 1
        return speculative

    silenced = logging.root.manager.disable
    logging.disable(logging.CRITICAL)  # the log lines' cost is the handler's, not measured here
    try:
        for size in (64, 8, batch):
            reqs = [_Req(64) for _ in range(size)]
            for _ in range(3000):
                step(reqs)
        spent.clear()
        reqs = [_Req(64) for _ in range(batch)]
        speculated = sum(step(reqs) for _ in range(steps))
    finally:
        logging.disable(silenced)
    per_batch = {name: ns / steps / 1000.0 for name, ns in sorted(spent.items(), key=lambda kv: -kv[1])}
    return {"batch": batch, "steps": steps, "waits": waits, "spec_share": speculated / steps,
            "us_per_batch": per_batch, "us_total": sum(per_batch.values())}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--waits", action="store_true", help="idle before each prefill, as at c=1")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    out = measure(args.batch, args.steps, waits=args.waits)
    print(f"batch {out['batch']}, {out['steps']} batches{' with waits' if out['waits'] else ''}, "
          f"{out['spec_share']:.1%} speculative")
    for name, us in out["us_per_batch"].items():
        print(f"  {name:12s} {us:6.2f} us")
    print(f"  {'total':12s} {out['us_total']:6.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
