"""Scheduler-side state of the adaptive worker: one per scheduler process.

The scheduler hooks reach it through ``current()``. Before an adaptive worker
exists (and on servers that do not use one) ``current()`` is a controller whose
answers reproduce upstream exactly: speculate always, keep the upstream KV
reserve. The hooks therefore have one code path and no ``if enabled:``.

No torch or SGLang import: everything here is bookkeeping on Python ints.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_adaptive.policy import ModePolicy, plain_kv_reserve

logger = logging.getLogger(__name__)

# Attribute names set on upstream objects. The decode ScheduleBatch carries the
# decision from the scheduler to the worker; the GenerationBatchResult carries it
# on to result processing (the result queue holds a ScheduleBatch.copy(), which
# drops attributes it does not list).
BATCH_FLAG = "adaptive_speculative"
RESULT_FLAG = "adaptive_plain"

# ModeStats.summary() as logged ("AdaptiveEAGLE " + summary), for the tools that read
# it back (GPU tests, benchmark): groups total, plain, speculative, switches and the
# optional max plain KV reserve.
STATS_LOG_PATTERN = (
    r"AdaptiveEAGLE decode batches: (\d+) \(plain (\d+), [\d.]+%; speculative (\d+)\), "
    r"switches: (\d+)(?:, max plain KV reserve: (\d+))?"
)


@dataclass
class ModeStats:
    spec_batches: int = 0
    plain_batches: int = 0
    switches: int = 0
    last_speculative: bool | None = None
    # Largest KV reserve (allocated - committed) seen on a plain batch; filled only
    # when the KV audit is on (it loops over requests).
    max_plain_reserve: int = 0

    def record(self, speculative: bool) -> None:
        if speculative:
            self.spec_batches += 1
        else:
            self.plain_batches += 1
        if self.last_speculative is not None and self.last_speculative != speculative:
            self.switches += 1
        self.last_speculative = speculative

    def summary(self) -> str:
        total = self.spec_batches + self.plain_batches
        share = self.plain_batches / total if total else 0.0
        text = (
            f"decode batches: {total} (plain {self.plain_batches}, {share:.1%}; "
            f"speculative {self.spec_batches}), switches: {self.switches}"
        )
        if self.max_plain_reserve:
            text += f", max plain KV reserve: {self.max_plain_reserve}"
        return text


class ModeController:
    """Upstream behaviour: every decode batch speculates with the upstream reserve."""

    active = False

    def __init__(self, policy: ModePolicy | None = None):
        self.policy = policy or ModePolicy()
        self.stats = ModeStats()

    def speculate(self, batch_size: int, has_grammar: bool = False) -> bool:
        return True

    def kv_reserve(self, speculative: bool, overlap: bool) -> int | None:
        """None: keep upstream's reserve (2 x alloc_len)."""
        return None

    def on_prepare(self, speculative: bool) -> None:
        pass

    def audit_kv(self, reqs) -> None:
        pass


class AdaptiveModeController(ModeController):
    active = True

    def __init__(
        self,
        policy: ModePolicy,
        *,
        spec_width: int,
        log_interval: int = 0,
        audit_kv: bool = False,
    ):
        super().__init__(policy)
        self.spec_width = spec_width
        self.log_interval = log_interval
        self.audit_enabled = audit_kv
        # Before the first decode only prefills have run: nothing writes past the
        # committed length, so the narrow width is safe.
        self.last_decode_width = 1

    def speculate(self, batch_size: int, has_grammar: bool = False) -> bool:
        # The plain path does not apply grammar masks: such batches stay speculative.
        return has_grammar or self.policy.speculate(batch_size)

    def kv_reserve(self, speculative: bool, overlap: bool) -> int | None:
        if speculative:
            return None
        return plain_kv_reserve(self.last_decode_width, overlap)

    def on_prepare(self, speculative: bool) -> None:
        self.policy.on_launch(speculative)
        self.last_decode_width = self.spec_width if speculative else 1
        self.stats.record(speculative)
        total = self.stats.spec_batches + self.stats.plain_batches
        if self.log_interval and total % self.log_interval == 0:
            logger.info("AdaptiveEAGLE %s", self.stats.summary())

    def audit_kv(self, reqs) -> None:
        if not self.audit_enabled:
            return
        reserve = max((r.kv.kv_allocated_len - r.kv_committed_len for r in reqs), default=0)
        self.stats.max_plain_reserve = max(self.stats.max_plain_reserve, reserve)


_current: ModeController = ModeController()


def current() -> ModeController:
    return _current


def install(controller: ModeController) -> None:
    global _current
    _current = controller


def reset() -> None:
    install(ModeController())
