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

A decode step also grows with the context its batch attends to, and not alike in the
two modes: on the 8B pair with triton attention (in/out 256, decode log windows of
no-spec and static EAGLE-3 at batch 16-128, ``2026-12-05-h200-goodput-misses``) a plain
step gains about 0.05 us per token of context in the batch, a speculative one about
0.5 us (verify over four positions, three draft passes): at batch 64 a speculative
step takes 21.7 ms at 300 tokens a request and 27.6 ms at 500, a plain one 6.2 and 6.8.
So the same speculation that pays at the start of a wave loses by its end, and a time
filed at one context misprices another. Each decode mode therefore fits one slope,
seconds per token of context (``ContextSlope``: it is about the same at every batch
size), and the table keeps each bucket's median step time less the slope times the
context it ran at, i.e. at no context; ``PER_TOKEN`` holds the slopes. A reader adds
the slope times its own batch's context back (``step_time``, the policy's ``_predict``).
With no spread of contexts seen yet the slope is 0 and the table is the plain median.

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
# The table's entry {PLAIN: seconds, SPEC: seconds} per token of context in a batch.
PER_TOKEN = "per_context_token"
WINDOW = 31  # samples kept per (mode, bucket); the median ignores the odd slow one
MIN_SAMPLES = 4
# The largest share of a decode step's time, at the contexts it was measured at, that a
# fitted slope may put on the context (StepCosts.slope): at no context a step keeps at
# least a tenth. The 8B pair's speculative step keeps about half at 300 tokens a request.
CONTEXT_SHARE = 0.9


def bucket(batch_size: int) -> int:
    """Batch sizes 1-8 exactly, then multiples of 8: step time grows smoothly."""
    return batch_size if batch_size <= 8 else -(-batch_size // 8) * 8


class _Size:
    """One batch size's decayed least-squares sums (``ContextSlope``)."""

    __slots__ = ("step", "weight", "mean_x", "mean_y", "cxx", "cxy", "last_x", "settle", "first")

    def __init__(self, step: int, context: float, settle: int):
        self.step, self.weight = step, 0.0  # weight 0: its means not started yet
        self.mean_x = self.mean_y = self.cxx = self.cxy = 0.0
        self.last_x, self.settle, self.first = context, settle, []


class ContextSlope:
    """Seconds a decode step of one mode gains per token of context in its batch.

    Least squares within each batch size (not bucket: a larger batch holds more context
    and more requests, and the requests' own cost would pass for the context's), pooled
    over the sizes, on exponentially decayed sums (half-life ``half_life`` steps of this
    mode). Three guards: a step whose residual from the fit exceeds ``clip`` times the
    typical residual (or a quarter of the step, until that is known) counts as that
    much, so a stall (a log write, a sync) weighs little more than a noisy step; the
    first ``settle`` steps after its context falls (a refill of fresh prompts, whose
    prefill disturbs the steps right after it) do not count; and a new size's means
    start at the middle one of its first three steps after those (a server's first
    steps run slow, and a stall there would set them). Never below 0; 0 until
    ``min_steps`` (decayed) steps have counted.
    """

    def __init__(self, half_life: float = 1024.0, settle: int = 2, min_steps: float = 32.0, clip: float = 3.0):
        self._decay = 0.5 ** (1.0 / half_life)
        self.settle, self.min_steps, self.clip = settle, min_steps, clip
        self._steps = 0  # of this mode, for each size's decay since its last step
        self._sizes: dict[int, _Size] = {}
        self._slope = 0.0  # as of the last slope(): the fit the residuals are taken from
        self._spread = self._spread_weight = 0.0  # decayed sum of |residual|, and its weight

    def add(self, batch_size: int, context: float, seconds: float) -> None:
        self._steps += 1
        g = self._sizes.get(batch_size)
        if g is None:
            g = self._sizes[batch_size] = _Size(self._steps, context, self.settle)
        fell, g.last_x = context < g.last_x, context
        if fell or g.settle:
            g.settle = self.settle if fell else g.settle - 1
            return
        if not g.weight:
            g.first.append((seconds, float(context)))
            if len(g.first) == 3:
                g.mean_y, g.mean_x = sorted(g.first)[1]
                g.step, g.weight = self._steps, 1.0
            return
        # Locals: a goodput server runs this at every decode step it files.
        decay, mean_x, mean_y = self._decay, g.mean_x, g.mean_y
        fit = mean_y + self._slope * (context - mean_x)
        bound = mean_y / 4
        if self._spread_weight >= self.min_steps:
            bound = min(bound, self.clip * self._spread / self._spread_weight)
        residual = min(max(seconds - fit, -bound), bound)
        seconds = fit + residual
        self._spread = self._spread * decay + abs(residual)
        self._spread_weight = self._spread_weight * decay + 1.0
        f = decay ** (self._steps - g.step)
        weight = g.weight * f + 1.0
        g.step, g.weight = self._steps, weight
        dx = context - mean_x
        g.mean_x = mean_x = mean_x + dx / weight
        g.mean_y = mean_y = mean_y + (seconds - mean_y) / weight
        g.cxx = g.cxx * f + dx * (context - mean_x)
        g.cxy = g.cxy * f + dx * (seconds - mean_y)

    def slope(self) -> float:
        cxx = cxy = weight = 0.0
        for g in self._sizes.values():
            f = self._decay ** (self._steps - g.step)
            weight += g.weight * f
            cxx += g.cxx * f
            cxy += g.cxy * f
        if weight < self.min_steps:
            return 0.0
        if cxx > 0.0:
            self._slope = max(0.0, cxy / cxx)
        return self._slope


class StepCosts:
    """Local samples -> {mode: {bucket: median seconds}}; decode modes' at no context,
    with their slopes under ``PER_TOKEN`` (module doc)."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES):
        self.window, self.min_samples = window, min_samples
        self._samples: dict[tuple[str, int], deque] = {}
        # The context (tokens in the batch) of each decode sample, in _samples' order.
        self._contexts: dict[tuple[str, int], deque] = {}
        self.slopes = {PLAIN: ContextSlope(), SPEC: ContextSlope()}
        # What table() worked out per (mode, bucket), kept while that bucket gets no
        # sample: (its median step time, its median context, slope, time at no context).
        # A sync every 32 decode batches re-read every bucket (75 us for 15 buckets a
        # mode here); at steady load one or two take samples, and only a speculating
        # mode's slope moves.
        self._derived: dict[tuple[str, int], list] = {}

    def add(self, speculative: bool, batch_size: int, seconds: float, context: int = 0) -> None:
        mode = SPEC if speculative else PLAIN
        self.slopes[mode].add(batch_size, context, seconds)
        self._add(mode, batch_size, seconds)
        self._window(self._contexts, (mode, bucket(batch_size))).append(context)

    def add_probe(self, batch_size: int, seconds: float) -> None:
        """The three intervals around a lone speculative step (see the module doc)."""
        self._add(PROBE, batch_size, seconds)

    def add_prefill(self, speculative: bool, batch_size: int, seconds: float) -> None:
        """What one prefill batch between decode steps of that mode added (module doc)."""
        self._add(SPEC_PREFILL if speculative else PLAIN_PREFILL, batch_size, seconds)

    def step_time(self, speculative: bool, batch_size: int, context: int = 0) -> float | None:
        """The local median decode step time of a mode at a batch size's bucket and
        ``context`` tokens, None below ``min_samples``."""
        mode = SPEC if speculative else PLAIN
        slope = self.slope(mode)
        at_none = self._at_no_context(mode, bucket(batch_size), slope)
        return None if at_none is None else at_none + slope * context

    def slope(self, mode: str) -> float:
        """The mode's fitted seconds per token of context, at most what leaves every
        bucket ``1 - CONTEXT_SHARE`` of its median step at no context. A slope fitted on
        a few steps over a narrow span of contexts can exceed the steps themselves: on an
        H100 at acceptance 1.3, 2.5 us a token for speculation (0.43-0.49 at 2.5 and
        3.5) put batch 128 at -44.8 ms with no context, which read a step at 128 requests
        of 140 tokens as 0.1 ms (2026-12-06-h100-goodput-full); the tiny pair's plain
        steps held 0.95 us a token against the 8B pair's 0.05, and -1.16 ms at batch 64."""
        slope = self.slopes[mode].slope()
        for key, samples in self._samples.items():
            if key[0] == mode and len(samples) >= self.min_samples:
                d = self._derive(key, samples)
                if d[1] > 0:
                    slope = min(slope, CONTEXT_SHARE * d[0] / d[1])
        return slope

    def _derive(self, key: tuple[str, int], samples: deque) -> list:
        """``_derived[key]``, made afresh after a sample: [median step, median context
        (0 for the modes without one), slope, None (time at no context at that slope)]."""
        d = self._derived.get(key)
        if d is None:
            contexts = self._contexts.get(key)
            d = self._derived[key] = [median(samples), median(contexts) if contexts else 0, None, None]
        return d

    def _at_no_context(self, mode: str, bucket_: int, slope: float) -> float | None:
        key = (mode, bucket_)
        samples = self._samples.get(key)
        if samples is None or len(samples) < self.min_samples:
            return None
        d = self._derive(key, samples)
        if not slope:
            return d[0]
        if d[2] != slope:
            d[2], d[3] = slope, median(t - slope * x for t, x in zip(samples, self._contexts[key]))
        return d[3]

    def _add(self, mode: str, batch_size: int, seconds: float) -> None:
        key = (mode, bucket(batch_size))
        self._window(self._samples, key).append(seconds)
        self._derived.pop(key, None)

    def _window(self, store: dict, key: tuple) -> deque:
        """The deque of the last ``window`` values at ``key``, made on first use (not
        setdefault: that builds a deque every step)."""
        values = store.get(key)
        if values is None:
            values = store[key] = deque(maxlen=self.window)
        return values

    def forget(self, mode: str, bucket_: int) -> None:
        """Drop one bucket's samples (a re-measurement starts afresh)."""
        self._samples.pop((mode, bucket_), None)
        self._contexts.pop((mode, bucket_), None)

    def table(self) -> dict[str, dict]:
        slopes = {mode: self.slope(mode) for mode in self.slopes}
        out: dict[str, dict] = {mode: {} for mode in MODES}
        for mode, b in self._samples:
            t = self._at_no_context(mode, b, slopes.get(mode, 0.0))
            if t is not None:
                out[mode][b] = t
        out[PER_TOKEN] = slopes
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
