"""Host time per decode batch of everything this package runs beside upstream at c=1.

Where ``controller_cost.py`` calls the controller directly, this drives the scheduler
hooks a speculative decode batch passes through (the memory check, the prepare, the
FutureMap's extras and relay, the result) and the acceptance feed, with upstream's own
functions replaced by no-ops, for the goodput policy and for a threshold no batch
reaches (``adaptive-never-plain``: the controller still times every step). Then, for
goodput, it replaces one part at a time by a no-op after warm-up: the difference from
the whole is about that part's share (parts also make each other cheaper or dearer: a
skipped verify leaves the answer's estimate unchanged). The loop is the one of
``controller_cost.py --waits``: batch 1, a prefill every ~80 steps after an idle wait.
An H100 host's core ran ``controller_cost.py --waits`` 1.6x slower than this desktop's
(17.8 against 11.4 us); the figures rank parts.

``--evict-mb N`` copies an N MB buffer before each timed batch and times the batches
alone: in a server the scheduler's own work runs between two batches, so this
package's code meets its caches cold. Session 44, this desktop, mean us a batch
(goodput / never-plain): 17.1 / 8.1 with 2 MB, 23.1 / 11.7 with 8 MB. Session 45, goodput
holding its answers to stay (``GoodputPolicy._hold_for``) against the commit before, medians
of 7 alternating runs: 14.1 against 16.3 us warm (never-plain 5.2); with eviction the two
were within this desktop's noise (2 MB 20.6 / 21.0, 8 MB 38.9 / 37.1). Session 46 (the acceptance
fold in one pass, the held answer inline in ``speculate``, the table shared less often while the
policy holds a steady answer) against session 45's code, 7 alternating runs: goodput's excess over
never-plain 4.8 against 6.7 us warm, 7.6 against 8.7 with 2 MB evicted; Python opcodes a batch
beyond never-plain's (``--opcodes``: deterministic where times swing by half here) 378 against
603. With plain stretches held too (``GoodputPolicy._plain_hold_for``): 386, and with no draft
accepted (``--opcodes --plain``, goodput plain) 557 beyond an always-plain server's, against 1,290.

usage: PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH} python benchmark/hook_cost.py [--steps 15000]
       [--repeat 5] [--evict-mb N] [--opcodes [--plain]] [--json OUT]
       (keep the PYTHONPATH a GPU host's setup-host.sh sets: SGLang is there)
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time

from sglang_adaptive import controller as ctl, scheduler_hooks as hooks
from sglang_adaptive.policy import GoodputPolicy, ThresholdPolicy


class _Req:
    __slots__ = ("kv_committed_len", "is_retracted")

    def __init__(self, length: int):
        self.kv_committed_len, self.is_retracted = length, False

    def finished(self) -> bool:
        return False


class _Spec:
    def is_none(self) -> bool:
        return False


class _Batch:
    """What the hooks read of a ScheduleBatch."""

    def __init__(self, reqs):
        self.reqs, self.has_grammar, self.enable_overlap = reqs, False, True
        self.spec_algorithm, self.forward_iter = _Spec(), 0


class _Result:
    next_draft_input = None


class _FutureMap:
    _forward_buf_initialized, need_topk, need_hidden_states = True, True, True


class _Scheduler:
    future_map = _FutureMap()


def _noop(*args, **kwargs):
    """Upstream's functions under the hooks, and each part replaced after warm-up."""
    return None


def run(policy, patch=None, steps: int = 15000, seed: int = 0, evict_mb: int = 0, accepted=(1, 2, 3)):
    """Microseconds per decode batch after 3,000 batches of warm-up (``patch(controller)``
    applied between), and the controller. ``evict_mb``: a buffer of that size copied
    before each timed batch, outside its time."""
    now = [0.0]
    controller = ctl.AdaptiveModeController(policy, spec_width=4, log_interval=10, clock=lambda: now[0])
    previous = ctl.current()
    ctl.install(controller)
    rng = random.Random(seed)
    reqs = [_Req(64)]
    batch, result, scheduler, launches = _Batch(reqs), _Result(), _Scheduler(), [0]

    def step() -> None:
        hooks.around_check_decode_mem(_noop, batch)
        hooks.around_prepare_for_decode(_noop, batch)
        hooks.around_resolve_spec_extras(_noop, scheduler.future_map, batch)
        speculative = getattr(batch, ctl.BATCH_FLAG)
        setattr(result, ctl.RESULT_FLAG, not speculative)
        hooks.around_relay_forward_payload(_noop, scheduler, None, result)
        hooks.around_process_batch_result_decode(_noop, None, batch, result)
        launches[0] += 1
        batch.forward_iter = launches[0]
        now[0] += (0.0031 if speculative else 0.0015) * rng.uniform(0.95, 1.05)
        if speculative:
            controller.on_verify([rng.choice(accepted)])
        reqs[0].kv_committed_len += 3 if speculative else 1
        if reqs[0].kv_committed_len > 300:  # the request ends after an idle wait; its successor prefills
            reqs[0].kv_committed_len = 64
            now[0] += 0.001
            controller.on_idle()
            launches[0] += 1

    silenced = logging.root.manager.disable
    logging.disable(logging.CRITICAL)  # the log lines' cost is the handler's, not measured here
    try:
        for _ in range(3000):
            step()
        if patch is not None:
            patch(controller)
        if evict_mb:
            buffer, total = bytearray(evict_mb << 20), 0
            for _ in range(steps):
                bytes(buffer)
                tic = time.perf_counter_ns()
                step()
                total += time.perf_counter_ns() - tic
            return total / steps / 1000.0, controller
        tic = time.perf_counter_ns()
        for _ in range(steps):
            step()
        return (time.perf_counter_ns() - tic) / steps / 1000.0, controller
    finally:
        logging.disable(silenced)
        ctl.install(previous)


# What each row replaces by a no-op after warm-up.
PARTS = {
    "on_prepare (step timing, policy bookkeeping, sync)": lambda c: setattr(c, "on_prepare", _noop),
    "on_verify (acceptance feed)": lambda c: setattr(c, "on_verify", _noop),
    "_time_step": lambda c: setattr(c, "_time_step", _noop),
    "costs.add": lambda c: setattr(c.costs, "add", _noop),
    "acceptance.update": lambda c: setattr(c.policy.acceptance, "update", _noop),
    "sync": lambda c: setattr(c, "sync", _noop),
    "_count_prefills": lambda c: setattr(c, "_count_prefills", _noop),
    "context": lambda c: setattr(c, "context", lambda reqs: 0),
}


def measure(steps: int = 15000, repeat: int = 5, parts: bool = True, evict_mb: int = 0) -> dict:
    """Best of ``repeat`` runs, in microseconds per batch, and each run's speculative share."""
    def best(policy, patch=None):
        times, shares = [], []
        for _ in range(repeat):
            us, c = run(policy(), patch, steps, evict_mb=evict_mb)
            times.append(us)
            shares.append(c.stats.spec_batches / (c.stats.spec_batches + c.stats.plain_batches))
        return min(times), min(shares)

    goodput, goodput_share = best(lambda: GoodputPolicy(3))
    never_plain, never_plain_share = best(lambda: ThresholdPolicy(100000))
    out = {"steps": steps, "repeat": repeat, "evict_mb": evict_mb,
           "us_per_batch": {"goodput": goodput, "never-plain": never_plain},
           "spec_share": {"goodput": goodput_share, "never-plain": never_plain_share}, "goodput_without": {}}
    if parts:
        for name, patch in PARTS.items():
            out["goodput_without"][name] = best(lambda: GoodputPolicy(3), patch)[0]
    return out


def opcodes(steps: int = 20000, plain: bool = False) -> dict:
    """Python opcodes and calls per batch (``sys.settrace``; the loop's own included), for
    goodput and never-plain: a count, not a time, so two versions compare exactly.
    ``plain``: no draft accepted, so goodput runs plain (probes aside), against a server
    always plain (threshold 0)."""
    if plain:
        return {"goodput": _count(GoodputPolicy(3), steps, (0,)),
                "always-plain": _count(ThresholdPolicy(0), steps, (0,))}
    return {"goodput": _count(GoodputPolicy(3), steps), "never-plain": _count(ThresholdPolicy(100000), steps)}


def _count(policy, steps: int, accepted=(1, 2, 3)) -> dict:
    counts = {"opcodes": 0, "calls": 0}

    def trace(frame, event, arg):
        if event == "call":
            counts["calls"] += 1
            frame.f_trace_opcodes = True
        elif event == "opcode":
            counts["opcodes"] += 1
        return trace
    previous = sys.gettrace()  # a coverage tracer, under the test suite: put back after
    try:
        run(policy, lambda c: sys.settrace(trace), steps, accepted=accepted)
    finally:
        sys.settrace(previous)
    return {k: v / steps for k, v in counts.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=15000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--evict-mb", type=int, default=0,
                   help="copy a buffer of this many MB before each timed batch (caches cold)")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--opcodes", action="store_true", help="count Python opcodes and calls a batch instead")
    p.add_argument("--plain", action="store_true", help="with --opcodes: no draft accepted (goodput plain)")
    args = p.parse_args(argv)
    if args.opcodes:
        out = opcodes(args.steps, args.plain)
        for name, per in out.items():
            print(f"{name:14s} {per['opcodes']:7.1f} opcodes, {per['calls']:5.1f} Python calls a batch")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return
    out = measure(args.steps, args.repeat, evict_mb=args.evict_mb)
    for name, us in out["us_per_batch"].items():
        print(f"{name:14s} {us:6.2f} us a batch ({out['spec_share'][name]:.1%} of the batches speculative, "
              f"the warm-up's included)")
    for name, us in out["goodput_without"].items():
        print(f"  goodput without {name:52s} {us:6.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
