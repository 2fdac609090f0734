"""The goodput policy through the controller on a simulated server, with the step
times the 8B sweep logged (benchmark/results/2026-11-30-h200x2-goodput-mla): the
issue's bar (>= 0.98x the better static mode at every concurrency) checked before a
GPU run, exploration, probes and filing included.

The simulated server runs the closed-loop sweep as the bench does: a warm-up at the
peak load, then each concurrency in turn on the same server. Under the overlap
scheduler the wall time between two decode prepares is the GPU time of the batch
launched two prepares back, which is how the clock advances here. Every request of
a speculative step accepts each draft position with the rate that gives the
simulated acceptance, drawn from a seeded generator.
"""

import random

import pytest

from sglang_adaptive import controller as ctl, costs
from sglang_adaptive.policy import GoodputPolicy

K = 3
# Seconds per step as served (plain from the goodput server's table; speculative
# from static EAGLE-3's TPOT x tokens per verify at acceptance 2.5).
PLAIN = {1: 4.78e-3, 4: 4.89e-3, 16: 5.38e-3, 32: 5.87e-3, 64: 6.91e-3, 128: 8.27e-3}
SPEC = {1: 6.8e-3, 2: 6.9e-3, 4: 7.0e-3, 8: 8.2e-3, 16: 10.6e-3, 32: 14.7e-3, 64: 26.2e-3, 128: 50.2e-3}
SWEEP = (1, 2, 4, 8, 16, 32, 64, 128)


def step_time(table: dict, bs: int) -> float:
    return costs.lookup(table, bs, above="linear")


def rate_for(acceptance: float) -> float:
    """The per-position acceptance p with 1 + p + p^2 + p^3 = acceptance."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        p = (lo + hi) / 2
        lo, hi = (p, hi) if 1 + p + p * p + p ** 3 < acceptance else (lo, p)
    return lo


class Server:
    def __init__(self, acceptance: float):
        self.t, self.it = 0.0, 0
        self.p, self.rng = rate_for(acceptance), random.Random(0)
        self.c = ctl.AdaptiveModeController(GoodputPolicy(K), spec_width=K + 1, clock=lambda: self.t,
                                            sync_every=32)
        self.in_flight = []  # GPU times of the batches launched, most recent last

    def run(self, bs: int, steps: int) -> tuple[float, float]:
        """``steps`` decode batches of ``bs`` requests; returns (tokens, seconds)."""
        tokens, t0 = 0.0, self.t
        for _ in range(steps):
            if len(self.in_flight) >= 2:
                self.t += self.in_flight[-2]
            self.it += 1
            spec = self.c.speculate(bs)
            self.c.on_prepare(spec, bs, self.it)
            if spec:
                accepted = []
                for _ in range(bs):
                    n = 0
                    while n < K and self.rng.random() < self.p:
                        n += 1
                    accepted.append(n)
                self.c.on_verify(accepted)
                tokens += bs + sum(accepted)
            else:
                tokens += bs
            self.in_flight.append(step_time(SPEC if spec else PLAIN, bs))
        return tokens, self.t - t0


@pytest.mark.parametrize("acceptance", [1.3, 2.5, 3.5])
def test_goodput_keeps_within_two_percent_of_the_better_static_mode_at_every_concurrency(acceptance):
    server = Server(acceptance)
    server.run(128, 300)  # the bench's warm-up at the peak load
    ratios = {}
    for bs in SWEEP:
        steps = 24 * 256 // bs if bs < 8 else 4 * 256  # the bench's closed-loop lengths, in steps
        tokens, seconds = server.run(bs, steps)
        best = max(bs / step_time(PLAIN, bs), bs * acceptance / step_time(SPEC, bs))
        ratios[bs] = round(tokens / seconds / best, 3)
    assert all(r >= 0.98 for r in ratios.values()), ratios
