"""Per-decode-batch mode policies: speculate (EAGLE draft + verify) or run plain decode.

Pure Python on purpose: no torch, no SGLang. A policy is asked ``speculate(bs)`` for
a candidate decode batch and told ``on_launch(speculative)`` once the scheduler has
committed to a mode. ``speculate`` must be a pure function of the policy state and
its arguments: the scheduler asks several times per step (memory check, each
retraction candidate, final prepare) and every answer for the same batch size must
agree, or the KV reserve that was checked differs from the one allocated. The
state only moves in ``on_launch``.

Every TP rank runs its own scheduler and policy; the inputs used here (batch size,
number of launched steps) are identical on all ranks, so the ranks agree without
communication. A policy that reads timings must broadcast its decision instead.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICY_OFF = "off"
POLICY_THRESHOLD = "threshold"
POLICY_ALTERNATE = "alternate"
POLICY_CHOICES = (POLICY_OFF, POLICY_THRESHOLD, POLICY_ALTERNATE)


class ModePolicy:
    """Speculate on every batch: the no-op policy (static EAGLE behaviour)."""

    name = "always-speculate"

    def speculate(self, batch_size: int) -> bool:
        return True

    def on_launch(self, speculative: bool) -> None:
        pass

    def describe(self) -> str:
        return self.name


class ThresholdPolicy(ModePolicy):
    """A decode batch of more than ``threshold`` requests runs plain decode."""

    name = POLICY_THRESHOLD

    def __init__(self, threshold: int):
        if threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {threshold}")
        self.threshold = threshold

    def speculate(self, batch_size: int) -> bool:
        return batch_size <= self.threshold

    def describe(self) -> str:
        return f"threshold(speculate while batch size <= {self.threshold})"


class AlternatePolicy(ModePolicy):
    """Testing only: ``period`` speculative decode steps, then ``period`` plain ones.

    Exercises every transition (spec->plain, plain->spec, plain->plain) on a
    deterministic schedule, independent of load.
    """

    name = POLICY_ALTERNATE

    def __init__(self, period: int):
        if period < 1:
            raise ValueError(f"period must be >= 1, got {period}")
        self.period = period
        self._launched = 0

    def speculate(self, batch_size: int) -> bool:
        return (self._launched // self.period) % 2 == 0

    def on_launch(self, speculative: bool) -> None:
        self._launched += 1

    def describe(self) -> str:
        return f"alternate(every {self.period} decode steps, testing only)"


@dataclass(frozen=True)
class PolicyConfig:
    """What the server flags say; validated in ``args.py``."""

    policy: str = POLICY_OFF
    threshold: int | None = None
    alternate_period: int = 1

    @property
    def enabled(self) -> bool:
        return self.policy != POLICY_OFF


def make_policy(config: PolicyConfig) -> ModePolicy:
    """The policy of an enabled config. With 'off' no adaptive worker is built, so
    there is no policy to make."""
    if config.policy == POLICY_THRESHOLD:
        if config.threshold is None:
            raise ValueError("the threshold policy needs a threshold")
        return ThresholdPolicy(config.threshold)
    if config.policy == POLICY_ALTERNATE:
        return AlternatePolicy(config.alternate_period)
    raise ValueError(
        f"no switching policy for {config.policy!r}; "
        f"choose {POLICY_THRESHOLD!r} or {POLICY_ALTERNATE!r}"
    )


def plain_kv_reserve(last_decode_width: int, overlap: bool) -> int:
    """KV slots beyond ``kv_committed_len`` a plain decode step must have allocated.

    Under the overlap scheduler the CPU lags one batch: the in-flight batch may still
    write ``last_decode_width`` positions past what is committed (1 after a plain
    step, num_draft_tokens after a speculative one), and this step writes one more.
    Without overlap the committed length is exact and one slot suffices.
    """
    return (last_decode_width if overlap else 0) + 1
