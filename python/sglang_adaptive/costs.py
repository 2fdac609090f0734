"""Step-cost table: the wall time of a decode step in each mode, by batch size, as served.

Pure Python (no torch, no SGLang). The controller times each decode iteration on the
host (from one decode prepare to the next) and files it under the mode and batch
size of the step that ran in between; iterations with another batch in between (a
prefill) are not filed. A step's wall time is what a step costs the server, whether
the GPU or the scheduler's host work sets the pace: on a small model at TP 2 the
host does (``benchmark/results/2026-11-30-h200x2-host-time``), and a cost table of
graph replays alone would miss it.

A third entry, ``probe``, holds what a lone speculative step between plain ones (the
goodput policy's probe) costs with its transitions: the wall time of the three
intervals that hold the plain step before it, the probe and the plain step after it
(the keep-warm's draft pass that resumes the draft runs in the probe's, the switch
back in the next). On the 8B pair at batch 32 that came to 1.8 plain steps more than
three plain ones, where the speculative step alone costs 1.1 more.

Two more, ``plain_prefill`` and ``spec_prefill``, hold what a prefill batch between
decode steps of that mode adds to the wall time: the two intervals that hold it, less
two decode steps of the table's median, per prefill batch. Decode steps alone misprice
a server whose requests keep ending: on the 8B pair with output lengths 128-384 at
acceptance 3.5, batch 64, plain decode led by decode steps (6.26 ms against 24.22 ms
for 3.5 tokens) and lost end to end by 6.6%, as it ran a prefill batch (about 19 ms)
after every fifth step for 64 tokens and speculation one after every second for 224
(``policy.PrefillRate``).

Each rank measures its own; the policy only ever sees the table rank 0 shared with
every rank (``AdaptiveModeController.sync``), so all ranks decide alike.
"""

from __future__ import annotations

import bisect
from collections import deque
from statistics import median

PLAIN, SPEC, PROBE = "plain", "spec", "probe"
PLAIN_PREFILL, SPEC_PREFILL = "plain_prefill", "spec_prefill"
MODES = (PLAIN, SPEC, PROBE, PLAIN_PREFILL, SPEC_PREFILL)
WINDOW = 31  # samples kept per (mode, bucket); the median ignores the odd slow one
MIN_SAMPLES = 4


def bucket(batch_size: int) -> int:
    """Batch sizes 1-8 exactly, then multiples of 8: step time grows smoothly."""
    return batch_size if batch_size <= 8 else -(-batch_size // 8) * 8


class StepCosts:
    """Local samples -> {mode: {bucket: median seconds}}."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES):
        self.window, self.min_samples = window, min_samples
        self._samples: dict[tuple[str, int], deque] = {}

    def add(self, speculative: bool, batch_size: int, seconds: float) -> None:
        self._add(SPEC if speculative else PLAIN, batch_size, seconds)

    def add_probe(self, batch_size: int, seconds: float) -> None:
        """The three intervals around a lone speculative step (see the module doc)."""
        self._add(PROBE, batch_size, seconds)

    def add_prefill(self, speculative: bool, batch_size: int, seconds: float) -> None:
        """What one prefill batch between decode steps of that mode added (module doc)."""
        self._add(SPEC_PREFILL if speculative else PLAIN_PREFILL, batch_size, seconds)

    def median(self, speculative: bool, batch_size: int) -> float | None:
        """The local median decode step time of a mode at a batch size's bucket, None
        below ``min_samples``."""
        samples = self._samples.get((SPEC if speculative else PLAIN, bucket(batch_size)))
        return median(samples) if samples is not None and len(samples) >= self.min_samples else None

    def _add(self, mode: str, batch_size: int, seconds: float) -> None:
        self._samples.setdefault((mode, bucket(batch_size)), deque(maxlen=self.window)).append(seconds)

    def forget(self, mode: str, bucket_: int) -> None:
        """Drop one bucket's samples (a re-measurement starts afresh)."""
        self._samples.pop((mode, bucket_), None)

    def table(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {mode: {} for mode in MODES}
        for (mode, b), samples in self._samples.items():
            if len(samples) >= self.min_samples:
                out[mode][b] = median(samples)
        return out


def lookup(by_bucket: dict[int, float], batch_size: int, above: str = "flat") -> float | None:
    """Seconds per step at ``batch_size``: its bucket, else linear between the nearest
    measured buckets, else the smallest bucket's below them; None when the mode has
    no data. Above the largest measured bucket ``above`` says how to extrapolate:
    ``flat`` (its time), ``linear`` (along the slope of the two largest, never below
    the largest's time) or ``proportional`` (its time scaled by the batch size: an
    upper bound for any step time of the form a + c * batch with a >= 0)."""
    if above not in ("flat", "linear", "proportional"):
        raise ValueError(f"unknown extrapolation {above!r}")
    if not by_bucket:
        return None
    b = bucket(batch_size)
    if b in by_bucket:
        return by_bucket[b]
    keys = sorted(by_bucket)
    i = bisect.bisect_left(keys, b)
    if i == 0:
        return by_bucket[keys[0]]
    if i == len(keys):
        top = keys[-1]
        if above == "proportional":
            return by_bucket[top] * batch_size / top
        if above == "linear" and len(keys) > 1:
            below = keys[-2]
            slope = (by_bucket[top] - by_bucket[below]) / (top - below)
            return by_bucket[top] + max(0.0, slope) * (batch_size - top)
        return by_bucket[top]
    lo, hi = keys[i - 1], keys[i]
    return by_bucket[lo] + (by_bucket[hi] - by_bucket[lo]) * (b - lo) / (hi - lo)
