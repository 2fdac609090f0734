"""Scheduler-side state of the adaptive worker: one per scheduler process.

The scheduler hooks reach it through ``current()``. Before an adaptive worker
exists (and on servers that do not use one) ``current()`` is a controller whose
answers reproduce upstream exactly: speculate always, keep the upstream KV
reserve. The hooks therefore have one code path and no ``if enabled:``.

No torch or SGLang import: everything here is bookkeeping on Python ints.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from operator import attrgetter
from dataclasses import dataclass, field
from collections.abc import Callable

from sglang_adaptive.costs import PER_TOKEN, PLAIN, PLAIN_PREFILL, PROBE, SPEC, SPEC_PREFILL, StepCosts
from sglang_adaptive.decisions import NoDecisionLog
from sglang_adaptive.policy import ModePolicy, plain_kv_reserve, reason_label
from sglang_adaptive.telemetry import NoTelemetry

logger = logging.getLogger(__name__)

# Attribute names set on upstream objects. The decode ScheduleBatch carries the
# decision from the scheduler to the worker; the GenerationBatchResult carries it
# on to result processing (the result queue holds a ScheduleBatch.copy(), which
# drops attributes it does not list).
BATCH_FLAG = "adaptive_speculative"
RESULT_FLAG = "adaptive_plain"
# On a plain result that carries fresh draft state (keep-warm 'full'): relay all of it.
RESULT_DRAFT_FLAG = "adaptive_draft_state"

# ModeStats.summary() as logged ("AdaptiveEAGLE " + summary), for the tools that read
# it back (GPU tests, benchmark): groups total, plain, speculative, switches, the
# optional max plain KV reserve and the optional count of prefills without the draft.
STATS_LOG_PATTERN = (
    r"AdaptiveEAGLE decode batches: (\d+) \(plain (\d+), [\d.]+%; speculative (\d+)\), "
    r"switches: (\d+)(?:, max plain KV reserve: (\d+))?(?:, prefills without the draft: (\d+))?"
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
    # Prefills that ran the target alone (ModeController.prefill_drafts).
    plain_prefills: int = 0

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
        if self.plain_prefills:
            text += f", prefills without the draft: {self.plain_prefills}"
        return text


# ModeController's reasons line (every log interval, goodput only): "spec goodput 1200,
# plain probe 3, ..." cumulative, for the benchmark to count a load point's batches by
# reason without the decision log.
REASONS_LOG_PATTERN = r"AdaptiveEAGLE decode batches by reason: (.*)"
REASON_PATTERN = r"((?:spec|plain) \w+) (\d+)"  # (reason_label, count)

# The cost table file is rewritten at most this often (and whenever a bucket comes or
# goes): a write (JSON, a rename) costs about 0.45 ms, every 32 decode batches 14 us a
# batch, half a percent of a tiny pair's 3 ms speculative step.
TABLE_WRITE_EVERY_S = 1.0

# A share that finds the policy settled (ModePolicy.settled: goodput holding its answer)
# and the table steady (the same buckets, each value within this share of the last
# share's) doubles the wait for the next, up to SYNC_MAX_FACTOR times ``sync_every``;
# any other share, or a switch of mode, goes back to ``sync_every``. At steady load each
# share costs a table, the policy's derived state, and ends its held answer (a
# worked-out answer after it): at batch 1 on the tiny pair that was a sixth of what
# goodput adds to a batch (benchmark/hook_cost.py), on a host that sets the pace.
SYNC_STEADY = 0.05
SYNC_MAX_FACTOR = 8

# RecoveryProfile.summary() as logged ("AdaptiveEAGLE " + summary): the stretch length,
# then "step I: TOKENS/VERIFY (VERIFIES)" groups, then the steady value.
RECOVERY_LOG_PATTERN = r"AdaptiveEAGLE acceptance after plain stretches of >= (\d+) steps: (.*)"
RECOVERY_STEP_PATTERN = r"step (\d+|>\d+): ([\d.]+) \((\d+)\)"


@dataclass
class RecoveryProfile:
    """Tokens per verify of speculative steps by their place in a speculative run that
    follows a plain stretch of at least ``min_stretch`` steps: how fast the draft
    recovers from plain decoding (the draft keep-warm's measure). Verify results come
    back in launch order, so each takes the place recorded when its batch was prepared."""

    min_stretch: int = 50
    depth: int = 32
    _plain_run: int = 0
    _place: int = 0  # place of the last speculative batch in its run; 0: not after a stretch
    _last_speculative: bool | None = None
    _queue: deque = field(default_factory=lambda: deque(maxlen=16))
    tokens: dict = field(default_factory=dict)  # place (depth + 1: deeper) -> tokens
    verifies: dict = field(default_factory=dict)
    stretches: int = 0

    def on_prepare(self, speculative: bool) -> bool:
        """Returns True when a speculative run after a stretch begins."""
        begins = False
        if not speculative:
            self._plain_run += 1
        else:
            if self._last_speculative is False:
                begins = self._plain_run >= self.min_stretch
                self._place = 1 if begins else 0
                self.stretches += begins
            elif self._place:
                self._place += 1
            self._plain_run = 0
            self._queue.append(min(self._place, self.depth + 1))
        self._last_speculative = speculative
        return begins

    def on_verify(self, verifies: int, tokens: int) -> None:
        place = self._queue.popleft() if self._queue else 0
        if place:
            self.tokens[place] = self.tokens.get(place, 0) + tokens
            self.verifies[place] = self.verifies.get(place, 0) + verifies

    def rate(self, place: int) -> float | None:
        n = self.verifies.get(place, 0)
        return self.tokens[place] / n if n else None

    def summary(self) -> str:
        parts = [f"step {p if p <= self.depth else f'>{self.depth}'}: {self.rate(p):.3f} ({self.verifies[p]})"
                 for p in sorted(self.verifies)]
        return (f"acceptance after plain stretches of >= {self.min_stretch} steps: "
                + (", ".join(parts) or "none yet"))


class ModeController:
    """Upstream behaviour: every decode batch speculates with the upstream reserve."""

    active = False

    def __init__(self, policy: ModePolicy | None = None):
        self.policy = policy or ModePolicy()
        self.stats = ModeStats()

    def speculate(self, batch_size: int, has_grammar: bool = False, context: int = 0) -> bool:
        return True

    def context(self, reqs) -> int:
        """Tokens of context the requests hold, all together; 0 where nothing reads it."""
        return 0

    def kv_reserve(self, speculative: bool, overlap: bool) -> int | None:
        """None: keep upstream's reserve (2 x alloc_len)."""
        return None

    def prefill_drafts(self) -> bool:
        """Whether the next prefill runs the draft's extend over its prompt, as upstream."""
        return True

    def on_prepare(self, speculative: bool, batch_size: int = 0, forward_iter: int | None = None,
                   context: int = 0) -> None:
        pass

    def on_verify(self, num_correct_drafts_per_req: list[int]) -> None:
        pass

    def on_idle(self) -> None:
        """The scheduler found nothing to run (``Scheduler.on_idle``)."""

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
        share: Callable[[dict], dict] | None = None,
        sync_every: int = 32,
        sync_max_every: int | None = None,
        cost_table_path: str | None = None,
        writes_table: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        telemetry: NoTelemetry | None = None,
        decisions: NoDecisionLog | None = None,
        plain_grammar: bool = True,
        plain_prefill: bool = False,
    ):
        super().__init__(policy)
        self.plain_grammar = plain_grammar
        # Whether the worker can prefill with the target alone (its keep-warm writes
        # the draft's K/V of the prompt): known once the keep-warm is built.
        self.plain_prefill = plain_prefill
        self.spec_width = spec_width
        self.log_interval = log_interval
        self.audit_enabled = audit_kv
        # Before the first decode only prefills have run: nothing writes past the
        # committed length, so the narrow width is safe.
        self.last_decode_width = 1
        # Step costs: this rank's samples; the policy sees what ``share`` returns
        # (rank 0's table on every rank), every ``sync_every`` decode batches.
        self.costs = StepCosts()
        self.share = share or (lambda table: table)
        self.sync_every = sync_every
        # The wait grows while the policy is settled and the shared table steady
        # (SYNC_STEADY): decided from the shared tables, the policy and the batch count,
        # so every rank joins the same syncs.
        self.sync_max_every = SYNC_MAX_FACTOR * sync_every if sync_max_every is None else sync_max_every
        self._sync_wait = sync_every
        self._next_sync = sync_every
        self._shared: dict | None = None
        # A TP collective: only where the table is read (goodput) or kept (a path).
        # Every rank must make the same choice, so it depends on the flags only;
        # ``writes_table`` (rank 0) says who writes the file and logs the table.
        self._syncs = bool(sync_every) and (policy.uses_costs or cost_table_path is not None)
        self.cost_table_path = cost_table_path
        self.writes_table = writes_table
        self.clock = clock
        # The last six decode prepares (time, speculative, batch size, forward_iter,
        # context, idle): a step's interval is filed two prepares after it, a probe's
        # window five. idle: the scheduler idled since the prepare before (``on_idle``).
        self._recent: deque = deque(maxlen=6)
        self._idled = False
        self._pending: tuple | None = None  # the last interval, until its neighbour shows it clean
        self._synced_buckets = 0
        self._table_written = float("-inf")
        self._refresh_logged: set[tuple[str, int, str]] = set()
        self.telemetry = telemetry or NoTelemetry()
        self.decisions = decisions or NoDecisionLog()
        self.recovery = RecoveryProfile()

    def speculate(self, batch_size: int, has_grammar: bool = False, context: int = 0) -> bool:
        # The plain step applies grammar masks (worker._sample_constrained); with
        # PLAIN_GRAMMAR_ENV=0 constrained batches speculate.
        return (has_grammar and not self.plain_grammar) or self.policy.speculate(batch_size, context)

    def context(self, reqs) -> int:
        # The step costs grow with it (costs.ContextSlope); only where they are kept.
        # Committed lengths: the same at the memory check and at the prepare of one
        # batch (results are processed outside get_next_batch_to_run), so the answers
        # agree. A C-level sum, not a Python loop: about 3 us at 128 requests.
        return sum(map(_COMMITTED, reqs)) if self._syncs else 0

    def kv_reserve(self, speculative: bool, overlap: bool) -> int | None:
        if speculative:
            return None
        return plain_kv_reserve(self.last_decode_width, overlap)

    def prefill_drafts(self) -> bool:
        """Whether a prefill runs the draft's extend over its prompt. Not while decode
        runs plain: its requests will most likely decode plain first, and the keep-warm
        writes the draft's K/V of the prompt for a fraction of what the extend costs
        (no draft attention, MLP or lm_head); the first speculative step drafts from its
        stash either way. Decided from the last decode batch's mode, the same on every
        rank."""
        drafts = not self.plain_prefill or self.stats.last_speculative is not False
        if not drafts:
            self.stats.plain_prefills += 1
        return drafts

    def on_prepare(self, speculative: bool, batch_size: int = 0, forward_iter: int | None = None,
                   context: int = 0) -> None:
        self._time_step(speculative, batch_size, forward_iter, context)
        switched = self.stats.last_speculative not in (None, speculative)
        self.telemetry.on_batch(speculative, switched)
        self.decisions.record(self.policy, speculative, batch_size, context)
        self.policy.on_launch(speculative, batch_size, context)
        self._count_prefills()
        for mode, b, why in self.policy.stale_buckets():
            self.costs.forget(mode, b)
            # Close calls re-measure at every probe due: logged the first time only.
            if self.writes_table and (mode, b, why) not in self._refresh_logged:
                self._refresh_logged.add((mode, b, why))
                logger.info("AdaptiveEAGLE re-measuring the %s step at batch bucket %d: %s",
                            "speculative" if mode == SPEC else "plain", b, why)
        self.last_decode_width = self.spec_width if speculative else 1
        self.stats.record(speculative)
        total = self.stats.spec_batches + self.stats.plain_batches
        if switched and self._sync_wait > self.sync_every:
            # The mode it switches to files its steps now: a long wait would keep them
            # from the policy while it runs on what it switched on.
            self._sync_wait = self.sync_every
            self._next_sync = min(self._next_sync, total + self.sync_every)
        if self.log_interval and total % self.log_interval == 0:
            logger.info("AdaptiveEAGLE %s", self.stats.summary())
            reasons = self.policy.reason_counts()
            if reasons:
                logger.info("AdaptiveEAGLE decode batches by reason: %s", format_reasons(reasons))
        if self.recovery.on_prepare(speculative) and self.log_interval:
            logger.info("AdaptiveEAGLE %s", self.recovery.summary())
        if self._syncs and (total >= self._next_sync or self.policy.sync_due()):
            self.sync()

    def _time_step(self, speculative: bool, batch_size: int, forward_iter: int | None,
                   context: int = 0) -> None:
        """File the wall time from the previous decode prepare to this one under the
        previous batch's mode and size, once it is known to hold that batch only.

        Under the overlap scheduler the host spends that interval launching the
        previous batch and waiting for the one before it, so the interval counts only
        when the one before it was a decode batch of the same mode, launched right
        before it: a lone probe (or a switch) measures the neighbouring mode's step,
        and filing it would make speculation look as cheap as the plain steps around
        it.

        ``forward_iter`` (the scheduler's forward count at this batch's previous
        launch) moves by 1 between two decode prepares with nothing in between; a
        larger step at prepare C shows that another batch (a prefill) launched between
        the decode batches A and B before it. Then the interval from A's prepare to B's
        holds two decode steps' waits and the one from B's to C's the wait for the
        prefill: the interval ending at a prepare is filed only when the forward count
        moved by 1 at that prepare and at the next one.
        """
        r = self._recent
        r.append((self.clock(), speculative, batch_size, forward_iter, context, self._idled))
        self._idled = False
        pending, self._pending = self._pending, None
        if len(r) < 2:
            return
        last, now = r[-2], r[-1]
        if pending is not None and back_to_back(last, now):
            self.costs.add(*pending)
            self.telemetry.on_step_time(pending[0], pending[2])
        # The batch before the last one launched right before it, in the same mode.
        if len(r) > 2 and back_to_back(last, now) and r[-3][1] == last[1]:
            self._pending = (last[1], last[2], now[0] - last[0], last[4])
        self._time_probe()
        self._time_prefill()

    def _count_prefills(self) -> None:
        """Tell the policy how many other batches (prefills) ran after the decode step
        two prepares back: the forward count seen at a prepare is the running batch's
        at its previous launch, so a gap shows one batch late. After ``on_launch``: the
        scheduler has asked about this batch already, and the answers must not move
        before the policy is told it launched."""
        r = self._recent
        if len(r) >= 3 and r[-1][3] is not None and r[-2][3] is not None:
            # No launch between two prepares (a batch prepared and not run) counts none.
            self.policy.on_prefills(max(0, r[-1][3] - r[-2][3] - 1), r[-3][1], r[-3][2])

    def _time_prefill(self) -> None:
        """File what the prefill batches between two decode steps of one mode added:
        with decode steps A, B, C, D prepared in turn and the prefills launched between
        A and B (seen at C's prepare), the intervals from A's prepare to C's hold the GPU
        steps of the batch before A and of A (one batch late) and the prefills' own;
        the median decode step of A's mode and size stands for the first two. Filed
        once D shows that nothing else ran between B and C, with the two batches before
        A, A and B in one mode: a switch costs time of its own, paid in the first step
        of the new mode, which the interval holds when that step is the batch before A.
        A server plain on 95% of the tiny pair's batches at 64 (spread lengths, H100),
        filing speculation's prices only around its explorations, priced them at 16.6 ms
        where static EAGLE-3's came to about 7.5."""
        r = self._recent
        if len(r) < r.maxlen:
            return
        first, before, a, b, c, d = r
        if b[3] is None or c[3] is None or c[3] - b[3] < 2:  # no prefill between: most steps
            return
        if not (back_to_back(a, b) and back_to_back(c, d)) or c[5]:
            return
        if not first[1] == before[1] == a[1] == b[1]:
            return
        step = self.costs.step_time(a[1], a[2], a[4])
        if step is not None:
            self.costs.add_prefill(a[1], a[2], (c[0] - a[0] - 2 * step) / (c[3] - b[3] - 1))

    def _time_probe(self) -> None:
        """File what a lone speculative step between plain ones cost: the intervals
        from its prepare to the third after it hold (as above, one batch late) the GPU
        steps of the plain batch before it, the probe and the plain batch after it. All
        six prepares back to back (no prefill in between); the batch before the probe
        and the two after it plain."""
        r = self._recent
        if len(r) < r.maxlen or not r[1][1] or r[0][1] or r[2][1] or r[3][1]:
            return
        if all(back_to_back(a, b) for a, b in zip(r, list(r)[1:])):
            self.costs.add_probe(r[1][2], r[4][0] - r[1][0])

    def sync(self) -> None:
        """Share rank 0's step-cost table with every rank and hand it to the policy.
        Called at the same decode batch on every rank (a collective under TP)."""
        table = self.share(self.costs.table())
        steady = self.policy.settled() and self._shared is not None and steady_table(self._shared, table)
        self._shared = table
        self._sync_wait = min(2 * self._sync_wait, self.sync_max_every) if steady else self.sync_every
        self._next_sync = self.stats.spec_batches + self.stats.plain_batches + self._sync_wait
        self.policy.set_costs(table)
        if not self.writes_table:
            return
        buckets = sum(len(v) for v in table.values())
        changed = buckets != self._synced_buckets
        if changed:
            self._synced_buckets = buckets
            logger.info("AdaptiveEAGLE step costs (ms): %s", format_costs(table))
        if self.cost_table_path and (changed or self.clock() - self._table_written >= TABLE_WRITE_EVERY_S):
            self._table_written = self.clock()
            write_cost_table(self.cost_table_path, table, self.policy)

    def on_verify(self, num_correct_drafts_per_req: list[int]) -> None:
        self.policy.on_verify(num_correct_drafts_per_req)
        n = len(num_correct_drafts_per_req)
        tokens = n + sum(num_correct_drafts_per_req)
        self.telemetry.on_verify(n, tokens)
        self.recovery.on_verify(n, tokens)

    def on_idle(self) -> None:
        # No interval that spans it is a step's or a prefill's cost: with nothing to
        # run, the wait is for the next request (else a pause in the load before a
        # prefill is filed as that prefill's price, seconds against milliseconds).
        self._idled = True

    def audit_kv(self, reqs) -> None:
        if not self.audit_enabled:
            return
        reserve = max((r.kv.kv_allocated_len - r.kv_committed_len for r in reqs), default=0)
        self.stats.max_plain_reserve = max(self.stats.max_plain_reserve, reserve)


def back_to_back(first: tuple, second: tuple) -> bool:
    """Whether two decode prepares (time, speculative, batch size, forward_iter, context,
    idle) ran with no other batch (a prefill) between them, the forward count moved by
    one, and no idle wait either."""
    return first[3] is not None and second[3] is not None and second[3] - first[3] == 1 and not second[5]


def steady_table(before: dict, after: dict, share: float = SYNC_STEADY) -> bool:
    """Whether a shared cost table holds the same buckets as the one before, each step
    time (and slope) within ``share`` of its value there."""
    if before.keys() != after.keys():
        return False
    for mode, values in after.items():
        old = before[mode]
        if old.keys() != values.keys():
            return False
        for key, value in values.items():
            if abs(value - old[key]) > share * max(abs(value), abs(old[key])):
                return False
    return True


def format_reasons(counts: dict[tuple[bool, str], int]) -> str:
    return ", ".join(f"{reason_label(spec, why)} {n}" for (spec, why), n in sorted(counts.items()))


def format_costs(table: dict) -> str:
    """Milliseconds per step by bucket (decode modes' at no context); the slopes last,
    in milliseconds per 1,000 tokens of context in the batch."""
    parts = [f"{mode} " + ", ".join(f"{b}:{1e3 * t:.2f}" for b, t in sorted(by.items()))
             for mode, by in table.items() if mode != PER_TOKEN]
    slopes = table.get(PER_TOKEN)
    if slopes:
        parts.append("per 1k context tokens " + ", ".join(f"{m} {1e6 * c:.3f}" for m, c in slopes.items()))
    return "; ".join(parts)


def write_cost_table(path: str, table: dict, policy: ModePolicy) -> None:
    """The table the policy decides with (and its acceptance, if it keeps one) as JSON."""
    def by_bucket(mode):
        return {str(b): t for b, t in sorted(table.get(mode, {}).items())}
    # Decode steps at no context: a batch of C tokens of context adds C times its mode's
    # seconds_per_context_token.
    doc = {"seconds_per_step": {mode: by_bucket(mode) for mode in (PLAIN, SPEC)},
           "seconds_per_context_token": dict(table.get(PER_TOKEN, {})),
           # A lone speculative step with the plain steps before and after it.
           "seconds_per_probe_window": by_bucket(PROBE),
           # What a prefill batch between decode steps of each mode added.
           "seconds_per_prefill_batch": {PLAIN: by_bucket(PLAIN_PREFILL), SPEC: by_bucket(SPEC_PREFILL)},
           "policy": policy.describe()}
    acceptance = getattr(policy, "acceptance", None)
    if acceptance is not None:
        doc["acceptance_per_position"] = acceptance.rates()
        doc["expected_tokens_per_step"] = acceptance.expected_tokens()
    prefills = getattr(policy, "prefills", None)
    if prefills is not None:
        doc["prefill_batches_per_step"] = prefills.describe()
    if os.path.exists(path) and not os.path.isfile(path):  # a pipe or device: write through
        with open(path, "w") as f:
            json.dump(doc, f)
        return
    # A reader never sees a half-written file.
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


_COMMITTED = attrgetter("kv_committed_len")

_current: ModeController = ModeController()


def current() -> ModeController:
    return _current


def install(controller: ModeController) -> None:
    global _current
    _current = controller


def reset() -> None:
    install(ModeController())
