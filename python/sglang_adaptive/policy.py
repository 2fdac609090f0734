"""Per-decode-batch mode policies: speculate (EAGLE draft + verify) or run plain decode.

Pure Python on purpose: no torch, no SGLang. A policy is asked ``speculate(bs, ctx)``
for a candidate decode batch (ctx: tokens of context its requests hold) and told
``on_launch(speculative, bs, ctx)`` once the scheduler has committed to a mode.
``speculate`` must be a pure function of the policy state and its arguments: the
scheduler asks several times per step (memory check, each retraction candidate, final
prepare) and every answer for the same batch must agree, or the KV reserve that was
checked differs from the one allocated. The state only moves in ``on_launch``.

Every TP rank runs its own scheduler and policy; the inputs used here (batch size,
context, number of launched steps, verify results) are identical on all ranks, so the
ranks agree without communication. Timings are not: the goodput policy only reads the
step-cost table rank 0 shares with every rank (``set_costs``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_adaptive import costs

POLICY_OFF = "off"
POLICY_THRESHOLD = "threshold"
POLICY_ALTERNATE = "alternate"
POLICY_GOODPUT = "goodput"
POLICY_CHOICES = (POLICY_OFF, POLICY_THRESHOLD, POLICY_ALTERNATE, POLICY_GOODPUT)

# What a plain step does for the draft (keepwarm.py): nothing; write the draft K/V
# of the new position (and run one draft pass when speculation resumes); or run the
# draft's whole width-1 extend.
KEEP_WARM_NONE = "none"
KEEP_WARM_KV = "kv"
KEEP_WARM_FULL = "full"
KEEP_WARM_CHOICES = (KEEP_WARM_NONE, KEEP_WARM_KV, KEEP_WARM_FULL)


def batch_reason(speculative: bool, decided: bool, why: str) -> str:
    """Why a launched batch ran in its mode: the policy's reason, or "forced" where it
    ran against the answer (a grammar, an embedding)."""
    return why if speculative == decided else "forced"


def reason_label(speculative: bool, why: str) -> str:
    """How the reason counters, the decision log's counts and the bench's rows name it:
    "spec goodput", "plain probe"..."""
    return f"{'spec' if speculative else 'plain'} {why}"


# Why the goodput policy re-measures a bucket's step time in one mode (the log line says it).
REFRESH_STALE = "it was measured slower than at a larger batch"
REFRESH_CLOSE = "speculation and plain decode predict within the hysteresis there"
REFRESH_STRETCH = "the first check of a plain stretch"


class ModePolicy:
    """Speculate on every batch: the no-op policy (static EAGLE behaviour)."""

    name = "always-speculate"
    # Whether decisions read the shared step-cost table (then the controller shares it
    # across TP ranks on a schedule; other policies need no collective).
    uses_costs = False

    def speculate(self, batch_size: int, context: int = 0) -> bool:
        """``context``: tokens of context the batch's requests hold, all together."""
        return True

    def on_launch(self, speculative: bool, batch_size: int = 1, context: int = 0) -> None:
        pass

    def sync_due(self) -> bool:
        """Whether the step-cost table should be shared now, beside the controller's
        schedule; the answer must be the same on every TP rank."""
        return False

    def settled(self) -> bool:
        """Whether the policy holds a steady answer, so that the controller may share a
        steady table less often (controller.SYNC_MAX_FACTOR); the same on every TP rank."""
        return False

    def on_verify(self, num_correct_drafts_per_req: list[int]) -> None:
        """Accepted draft tokens of each request of a speculative batch (upstream's
        ``on_verify_complete_cpu`` feed); only the goodput policy reads them."""

    def on_prefills(self, batches: int, speculative: bool, batch_size: int) -> None:
        """Other batches (prefills) that ran after a decode step of that mode and size:
        told after ``on_launch`` of a later step (``AdaptiveModeController._count_prefills``),
        so that the answers for the batch just launched did not move; only the goodput
        policy reads them."""

    def set_costs(self, table: dict) -> None:
        """The step-cost table shared by rank 0; only the goodput policy reads it."""

    def stale_buckets(self) -> list[tuple[str, int, str]]:
        """(mode, batch-size bucket, why) for each bucket whose step times in that mode
        (``costs.PLAIN`` or ``costs.SPEC``) the controller should drop now, since the
        last call (the goodput policy's re-measurement); the same on every TP rank."""
        return []

    def reason_counts(self) -> dict[tuple[bool, str], int]:
        """Decode batches launched so far by (speculative, the policy's reason); only the
        goodput policy gives reasons."""
        return {}

    def describe(self) -> str:
        return self.name

    def explain(self, batch_size: int, context: int = 0) -> dict:
        """Why ``speculate`` answers as it does for this batch (the decision log);
        no state moves."""
        return {"decided": self.speculate(batch_size, context)}


class ThresholdPolicy(ModePolicy):
    """A decode batch of more than ``threshold`` requests runs plain decode."""

    name = POLICY_THRESHOLD

    def __init__(self, threshold: int):
        if threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {threshold}")
        self.threshold = threshold

    def speculate(self, batch_size: int, context: int = 0) -> bool:
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

    def speculate(self, batch_size: int, context: int = 0) -> bool:
        return (self._launched // self.period) % 2 == 0

    def on_launch(self, speculative: bool, batch_size: int = 1, context: int = 0) -> None:
        self._launched += 1

    def describe(self) -> str:
        return f"alternate(every {self.period} decode steps, testing only)"


class AcceptanceEstimator:
    """Acceptance of chain drafts (topk 1) per draft position, old evidence decaying.

    Position i (0-based) is reached by a request whose verify accepted at least i
    drafts and accepted when it accepted at least i + 1; the expected tokens of a
    speculative step per request follow as 1 + sum over i of the product of the
    conditional rates up to i. A verify counts as one step whatever its batch size
    (each request 1 / batch), and evidence ages with launched steps (half-life
    ``half_life`` steps), speculative or not, so after a plain stretch a probe's
    fresh verify outweighs what came before it, also where that ran larger batches.
    """

    # The spread of a step's mean tokens per request assumed before any is seen
    # (variance, tokens^2), weighted as one step.
    PRIOR_STEP_VAR = 0.25
    MAX_PENDING = 64

    def __init__(self, num_steps: int, half_life: float = 64.0, prior_rate: float = 0.5):
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.k, self.half_life = num_steps, half_life
        # One pseudo-request at prior_rate per position: defined before any verify.
        self._reached = [1.0] * num_steps
        self._accepted = [prior_rate] * num_steps
        # Verifies not yet folded in, (counts, step) in order: folded when read, so a
        # policy holding its answer (GoodputPolicy._hold_for) folds a hold's verifies in
        # one warm pass instead of one per batch in the scheduler's cold loop.
        self._pending: list[tuple[list[int], int]] = []
        self._aged_at = 0
        # Per step (not per request): the requests of one batch are not independent
        # samples (same positions, same content; upstream's simulated acceptance gives
        # a whole batch one length), so the estimate is only as sure as the number of
        # steps behind it. Decayed sums of weight, step mean and its square.
        self._steps = self._sum = self._sum_sq = 0.0
        # expected_tokens() and standard_error() as of the last update: the policy reads
        # them at every answer and after every launch, and they move only here.
        self._expected: float | None = None
        self._error: float | None = None

    def update(self, num_correct: list[int], step: int) -> None:
        if num_correct:
            # A copy: the caller's list is upstream's, and is read here only later.
            self._pending.append((list(num_correct), step))
            self._expected = self._error = None
            if len(self._pending) >= self.MAX_PENDING:  # bounded whoever reads
                self._fold()

    def _fold(self) -> None:
        """Fold the pending verifies in: each weighs 1 (whatever its batch size) aged
        from its step to the last one's, and what came before ages by as much. One pass
        that sorts each verify's weight by drafts accepted, then sums per position: at
        batch 1 a pass per verify and position was most of the Python a verify cost."""
        pending, self._pending = self._pending, []
        k, half_life = self.k, self.half_life
        last = pending[-1][1]
        # counts[v]: the weight of requests that accepted v drafts, each verify's summing
        # to its weight; single: the one-request verifies' share of it, whose squared
        # step means follow from it; squares: the other verifies' weighed squared means.
        counts, single = [0.0] * (k + 1), [0.0] * (k + 1)
        weights = squares = 0.0
        for num_correct, step in pending:
            w = 0.5 ** ((last - step) / half_life)
            weights += w
            if len(num_correct) == 1:
                single[num_correct[0]] += w
                continue
            # Counted per step as the error is: each step weighs 1 whatever its batch
            # size, or a batch of 64 outweighs 64 later verifies at batch 1 and ages
            # away only after six half-lives (a load that drops to one request went on
            # predicting with the large batches' acceptance for some 600 steps).
            n = len(num_correct)
            weight = w / n
            # k + 1 passes of list.count (C loops), not a Python loop over requests.
            for v in range(k + 1):
                counts[v] += weight * num_correct.count(v)
            mean = 1.0 + sum(num_correct) / n
            squares += w * mean * mean
        drafts = 0.0  # weighed drafts accepted a request: the step means' sum less the weights
        for v in range(k + 1):
            counts[v] += single[v]
            squares += (1 + v) * (1 + v) * single[v]
            drafts += v * counts[v]
        aged = 0.5 ** ((last - self._aged_at) / half_life)
        self._aged_at = last
        self._steps = self._steps * aged + weights
        self._sum = self._sum * aged + weights + drafts
        self._sum_sq = self._sum_sq * aged + squares
        # Position i is reached by the requests that accepted at least i drafts, and
        # accepted by those that accepted more: sums of counts from the top (never a
        # difference, which could leave an accepted weight below 0).
        more, above = 0.0, [0.0] * k
        for i in range(k - 1, -1, -1):
            more += counts[i + 1]
            above[i] = more
        reached, accepted, came = self._reached, self._accepted, weights
        for i in range(k):
            reached[i] = reached[i] * aged + came
            came = above[i]
            accepted[i] = accepted[i] * aged + came

    @property
    def reached(self) -> list[float]:
        """Decayed requests that reached each draft position."""
        if self._pending:
            self._fold()
        return self._reached

    @property
    def accepted(self) -> list[float]:
        """Decayed requests whose draft at each position was accepted."""
        if self._pending:
            self._fold()
        return self._accepted

    def rates(self) -> list[float]:
        return [a / r for a, r in zip(self.accepted, self.reached)]

    def expected_tokens(self) -> float:
        if self._expected is None:
            total, chain = 1.0, 1.0
            for rate in self.rates():
                chain *= rate
                total += chain
            self._expected = total
        return self._expected

    @property
    def aged_at(self) -> int:
        """The step the evidence was last aged to (its last verify's)."""
        if self._pending:
            self._fold()
        return self._aged_at

    def expected_after_misses(self, misses: int, aged_by: int) -> float:
        """``expected_tokens`` at its lowest after ``misses`` more verifies, each with no
        draft accepted, while the evidence so far ages by ``aged_by`` steps: each miss
        reaches position 0 only, so only its rate moves, and by the most where the misses
        came last (their weight the least aged)."""
        expected = self.expected_tokens()
        if misses <= 0 or expected <= 1.0:
            return expected
        reached, accepted = self.reached[0], self.accepted[0]
        aged = 0.5 ** (max(aged_by, 0) / self.half_life)
        step = 0.5 ** (1.0 / self.half_life)
        fresh = (1.0 - step ** misses) / (1.0 - step)  # the misses' weights, the last 1
        rate = accepted * aged / (reached * aged + fresh)
        return 1.0 + (expected - 1.0) * rate * reached / accepted

    def standard_error(self) -> float:
        """Of ``expected_tokens``, from the spread of the step means and the
        (decayed) number of steps: infinite before any verify."""
        if self._error is None:
            self._error = self._standard_error()
        return self._error

    def _standard_error(self) -> float:
        if self._pending:
            self._fold()
        if self._steps == 0.0:
            return math.inf
        spread = max(0.0, self._sum_sq - self._sum * self._sum / self._steps)
        var = (spread + self.PRIOR_STEP_VAR) / (self._steps + 1.0)
        return math.sqrt(var / self._steps)


class PrefillRate:
    """Prefill batches per decode step, from how many tokens a step makes.

    Requests end as they make tokens, and their successors prefill: a step of B
    requests making k tokens each is followed by at least one prefill batch with
    probability 1 - exp(-q B k), as if each token ended its request with probability q
    (1 / the mean output length). Fitted on decayed per-step sums (steps, steps
    followed by a prefill, prefill batches, tokens), so the steps of one mode predict
    the other's: on the 8B pair (output lengths 128-384, acceptance 3.5, batch 64) q
    fitted on plain steps (0.2025 prefill batches per step for 64 tokens) predicts 0.547
    for speculative ones (224 tokens), where 0.546 were measured. A step with several
    batches (a chunked prompt) counts once for q; ``batches per event`` scales the cost.
    Ages with steps (``half_life``), as the acceptance does; zero before any prefill.
    """

    def __init__(self, half_life: float = 256.0):
        self._decay = 0.5 ** (1.0 / half_life)
        self._steps = self._events = self._batches = self._tokens = 0.0

    def update(self, batches: int, tokens: float) -> None:
        f = self._decay
        self._steps = self._steps * f + 1.0
        self._events = self._events * f + (batches > 0)
        self._batches = self._batches * f + batches
        self._tokens = self._tokens * f + tokens

    def rate(self) -> float:
        """q: the chance per token that it ends its request (0 before any prefill)."""
        if not self._events:
            return 0.0
        # A step followed by a prefill 95% of the time or more says little about q
        # beyond "large"; the clamp keeps the log finite.
        share = min(self._events / self._steps, 0.95)
        return -math.log1p(-share) / (self._tokens / self._steps)

    def per_step(self, tokens: float) -> float:
        """Expected prefill batches after a decode step that makes ``tokens`` tokens."""
        q = self.rate()
        return self._batches / self._events * -math.expm1(-q * tokens) if q else 0.0

    def describe(self) -> dict:
        return {"per_token_end_rate": self.rate(),
                "batches_per_event": self._batches / self._events if self._events else 0.0}


class Prediction:
    """What the goodput policy predicts at one batch size: the step times (seconds) and
    output tokens per second and request, plain and speculative (at the expected
    acceptance; ``sure`` at it less one standard error, ``best`` with every draft
    accepted). ``sure`` and ``best`` are read only while plain, so they are worked out
    when read: a speculating server's answer needs neither."""

    __slots__ = ("t_plain", "t_spec", "plain", "spec", "_rate", "_acceptance")

    def __init__(self, t_plain: float, t_spec: float, plain: float, spec: float, rate: Callable[[float], float],
                 acceptance: AcceptanceEstimator):
        self.t_plain, self.t_spec, self.plain, self.spec = t_plain, t_spec, plain, spec
        self._rate, self._acceptance = rate, acceptance

    @property
    def sure(self) -> float:
        a = self._acceptance
        return self._rate(a.expected_tokens() - a.standard_error())

    @property
    def best(self) -> float:
        return self._rate(self._acceptance.k + 1.0)


# A speculating policy's answer to stay (GoodputPolicy), and a plain one's; their
# launches count under the same keys (speculative, reason).
_STAY = (True, "goodput")
_STAY_PLAIN = (False, "goodput")


class GoodputPolicy(ModePolicy):
    """Per batch, the mode with the higher predicted output tokens per second.

    Predicted per request: plain 1 / T_plain(bs, ctx); speculative E / T_spec(bs, ctx),
    with E the expected tokens per speculative step (``AcceptanceEstimator``) and T the
    step times of the shared cost table (``costs``) at the batch's context ctx (tokens
    of all its requests: a speculative step grows about ten times as fast with it as a
    plain one on the 8B pair, so at batch 64 speculation that pays at the start of a
    wave of 256-token prompts loses by its end), each plus the prefill batches
    expected after such a step (``PrefillRate``, more after a step that makes more
    tokens) times what a prefill batch adds in that mode (the table's ``*_prefill``;
    where one has none yet, the other mode's shifted by the step-time difference, as a
    longer step hides more of a prefill:
    ``_prefill_time``). No hand-set number decides:
    - a mode without a measured step time near this batch size (within a factor 2, at
      most ``REACH`` below its smallest measured batch, and for speculation at most
      ``REACH`` above its largest: read flat from batch 128, 50 ms ruled out every probe
      at 64, where a speculative step takes 21.6 ms and led plain by 12% on the 8B pair;
      plain's 6.3 ms there, against 5.2 ms at 64, kept a server whose load fell from 128
      to 64 speculating at 0.95x, simulated) is run, so that it gets one, for
      ``EXPLORE_SYNC`` steps in a row whatever the batch size does meanwhile (a lone
      step files no time: at c=8 on the tiny pair, batches of 5 or 7 explored plain
      alone between speculative batches of 8, 184 switches and 22% plain); the
      controller shares the table after every ``EXPLORE_SYNC`` such steps instead of
      waiting for its regular schedule;
    - where one mode has a prefill price near this batch size and the other has none,
      and the call rests on the one derived for it (free of prefills, that mode would
      win), that mode is run the same way so that it files its own, up to
      ``PRICE_EXPLORATIONS`` times per bucket (``_unpriced``);
    - above the largest measured batch size (up to that reach) a speculative step is
      assumed to grow in proportion to the batch and a plain one along its last
      slope, so an unmeasured large batch leans plain, the mode whose mistake costs
      less there (in the 8B sweep a speculative step at batch 128 took 50 ms, a
      plain one 8.3 ms; read flat from batch 64, 21.5 ms, it looked worth staying in);
    - while plain, one speculative step runs now and then, so the acceptance estimate
      stays fresh: after ``probe_every`` plain steps in a row, or more where a
      speculative step costs more, so that probes cost at most ``probe_budget`` (1%)
      of the time (at batch 128 on the K2.5 shape, about one in 350 steps), its switch
      in and out counted where the table has measured it (``costs.PROBE``); none at a
      batch size where speculation would lose even if every draft were accepted. A probe
      does not change the mode the policy is in, nor does a batch the controller
      made speculate against the policy's answer (grammar, with SGLANG_ADAPTIVE_PLAIN_GRAMMAR=0);
    - where a bucket's speculative time looks stale (``_stale_spec``: measured slower
      than at a larger batch, which a step of fewer requests cannot be in steady
      state), the probe due is a refresh instead: ``REFRESH_STEPS`` speculative steps
      in a row, the bucket's old samples dropped (``stale_buckets``), so that it files
      a fresh step time; a lone probe files none. Such a time came from whatever ran
      then: on the tiny pair at c=1, 5.9 ms a step from the warm-up's last requests
      against 3.2 ms steady kept the policy plain for 70% of the batches where
      speculation paid, and a host stall while it speculated there (H100, 2026-12-06)
      filed 6.17 ms against 3.0, which put plain ahead even of every draft accepted, so
      no probe was due and it stayed plain for 64% of c=1's batches. A stale time
      therefore does not rule out its probe. The first refresh of a bucket comes after
      ``probe_every`` plain steps (the interval that time stretched would let a refresh
      land after the next wait in the load, where steps run slow again); a later one
      only after ``REFRESH_STEPS`` probe intervals, so that
      refreshes too stay within the probe budget; none where the times grow with the
      batch (the 8B pair's);
    - the probe due is a refresh too where the call is close (the estimate as it
      stands puts speculation within the hysteresis of plain, or ahead, but not surely
      ahead), as often as probes come. There a lone probe cannot settle
      it: at batch 1 one verify is one request's, its evidence ages away by the next
      probe a few half-lives later, so the standard error never shrinks enough to leave
      plain; and a speculative time measured once too slow stays in the table. On the
      tiny pair at c=1 (real acceptance 2.8) that kept the policy plain for 84% of the
      batches where speculation paid 12%. A refresh brings ``REFRESH_STEPS`` verifies
      and a fresh step time at once; near the call its steps cost about what plain ones
      would. A refresh does not push the next probe back: the acceptance evidence would
      age away meanwhile. A speculative refresh that leaves speculation ahead by the
      estimate, but not surely, runs another round, up to ``REFRESH_ROUNDS``;
    - while speculating, a plain time that looks stale (``_stale_plain``: slower than at
      a larger batch, and never since by plain steps the policy chose) is measured again
      the same way, with ``REFRESH_STEPS`` plain steps, once per bucket: no probe runs
      plain steps while speculating, so a plain time measured too slow once would keep
      the policy speculating where plain pays, the users' case (plain decode ahead at
      every load) turned round. The tiny pair's table held plain 2.43 ms at batch 16
      against 2.04 at 24.
    - leaving the current mode needs a ``hysteresis`` advantage, so two modes that
      predict alike do not flap; leaving plain also needs it with the acceptance
      estimate less one standard error, counted in speculative steps (a probe or two
      while plain), so one lucky probe does not start speculation;
    - while speculating, an answer to stay holds for up to ``HOLD_MAX`` launches at its
      batch size where no verify meanwhile could change it (``_hold_for``), instead of
      being worked out again at every batch; while plain, an answer to stay holds up to
      the next probe, refresh or check due (``_plain_hold_for``; no verify comes
      meanwhile). In a steady plain stretch that cut the policy's Python a batch beyond
      an always-plain server's from 1,290 to 557 opcodes (``benchmark/hook_cost.py
      --opcodes --plain``).
    """

    name = POLICY_GOODPUT
    uses_costs = True
    # The first step of an exploration follows the other mode and is not filed, and an
    # interval is filed two prepares after it starts: MIN_SAMPLES are in the local
    # table at the exploration's MIN_SAMPLES + 3rd step.
    EXPLORE_SYNC = costs.MIN_SAMPLES + 3
    # How far beyond its measured batch sizes a step time is read rather than measured
    # by running it: above the largest for speculation (proportionally, an upper bound),
    # below the smallest for either mode (flat, an upper bound too).
    REACH = 1.25
    # Speculative steps of a refresh: an exploration's worth, so that the sync after its
    # last step shares MIN_SAMPLES fresh samples.
    REFRESH_STEPS = EXPLORE_SYNC
    # Rounds of REFRESH_STEPS a speculative refresh runs at most while it leaves
    # speculation ahead by the estimate but not surely so.
    REFRESH_ROUNDS = 4
    # Explorations per mode and bucket for a prefill price the call rests on: a prefill
    # is filed only between back-to-back steps of one mode with none right after, about
    # one an exploration at batch 64 on the tiny pair, and MIN_SAMPLES make a price.
    PRICE_EXPLORATIONS = 2 * costs.MIN_SAMPLES
    # The most launches one answer to stay with speculation holds for (_hold_for): a
    # half-life's worth; a share of the table (every 32 to 256 decode batches) ends a hold sooner.
    HOLD_MAX = 64

    def __init__(self, num_steps: int, *, probe_every: int = 100, probe_budget: float = 0.01,
                 hysteresis: float = 0.05, half_life: float = 64.0):
        self.acceptance = AcceptanceEstimator(num_steps, half_life=half_life)
        self.prefills = PrefillRate()
        self.probe_every, self.probe_budget, self.hysteresis = probe_every, probe_budget, hysteresis
        self._launched = 0
        self._plain_run = 0
        self._speculating: bool | None = None  # the mode the policy is in; probes leave it
        self._explored = 0  # exploration steps launched since the last sync they asked for
        # Buckets whose plain time comes from plain steps the policy chose or a refresh.
        self._steady_plain: set[int] = set()
        # Buckets whose speculative time a refresh has re-measured while it looked stale.
        self._refreshed: set[int] = set()
        self._refresh_left = 0  # steps of the refresh under way
        self._refresh_spec = True  # its mode
        self._extensions = 0  # rounds of the speculative refresh under way beyond its first
        # A plain stretch entered from speculation or an exploration that no refresh has
        # checked yet (its first probe due may be a refresh: _answer), whether the last
        # launch in the policy's own mode explored, and the launch of the last check.
        self._stretch_unchecked = False
        self._last_explored = False
        self._checked_at = -math.inf
        self._may_extend = False  # a speculative refresh just ended: another round may follow
        self._explore_left = 0  # steps of the exploration under way (mode: _speculating)
        # Explorations for a prefill price (_unpriced), by (speculative, bucket).
        self._price_explored: dict[tuple[bool, int], int] = {}
        # (mode, bucket, why) for the controller to drop (stale_buckets)
        self._stale: list[tuple[str, int, str]] = []
        # Answers by batch size for the current state: the scheduler asks three or four
        # times per batch, and on a host-bound server (the K2.5 shape at TP 2, 2-3 ms a
        # step) each full answer (~5 us) counts. Emptied wherever the state moves.
        self._answers: dict[tuple[int, int], tuple[bool, str]] = {}
        # Launched batches by (speculative, reason; "forced" against the answer): what the
        # decision log says batch by batch, counted at no cost worth measuring, so runs
        # that judge throughput still tell why a server ran plain.
        self._reasons: dict[tuple[bool, str], int] = {}
        # An answer to stay with speculation held without working it out again
        # (_hold_for): launches left, its batch size and the context it covers; and the
        # hold the last full answer offers, (size, lowest, highest context, launches),
        # taken up when its batch launches as answered.
        self._hold_left = self._hold_size = self._hold_low = self._hold_high = self._hold_verifies = 0
        self._hold_spec = True  # the mode held
        self._offer: tuple[int, int, int, int] | None = None
        self._offering = False  # working out a plain hold's last answers: offer none there
        self._answer_tokens = self.acceptance.expected_tokens()  # E at the last full answer
        self.set_costs({})  # self.costs and what derives from it: no step time yet

    def set_costs(self, table: dict) -> None:
        self._explore_left = 0  # what it explored may be in; if not, the next step explores again
        self.costs = {mode: dict(table.get(mode, {})) for mode in costs.MODES}
        # Seconds a decode step gains per token of context in its batch (costs.ContextSlope).
        self.per_token = dict(table.get(costs.PER_TOKEN, {}))
        # Per table, not per answer: the stale checks run at every speculative step.
        self._slower = {mode: self._slower_than_larger(self.costs[mode]) for mode in (costs.PLAIN, costs.SPEC)}
        self._answers.clear()
        self._hold_left, self._offer = 0, None  # held on the old table's times

    @property
    def costs(self) -> dict:
        return self._costs

    @costs.setter
    def costs(self, table: dict) -> None:
        self._costs = table
        # What the table says at a batch size (measured near it, its step times), kept
        # until the next table: an answer reads it some ten times, and the scheduler
        # asks at a new context every batch (about 40 us an answer on the H100's host).
        self._table_at: dict = {}

    @staticmethod
    def _slower_than_larger(times: dict) -> set:
        """Buckets whose time exceeds some larger bucket's."""
        slower, fastest_above = set(), math.inf
        for b in sorted(times, reverse=True):
            if times[b] > fastest_above:
                slower.add(b)
            fastest_above = min(fastest_above, times[b])
        return slower

    def on_verify(self, num_correct_drafts_per_req: list[int]) -> None:
        self.acceptance.update(num_correct_drafts_per_req, self._launched)
        self._answers.clear()
        if self._hold_left:
            self._hold_verifies -= 1
            if self._hold_verifies < 0:  # more than the hold allowed for (_hold_for)
                self._hold_left = 0

    def on_prefills(self, batches: int, speculative: bool, batch_size: int) -> None:
        # The estimate as of the last full answer: reading it afresh would fold every
        # verify as it comes (AcceptanceEstimator._pending).
        tokens = batch_size * (self._answer_tokens if speculative else 1.0)
        self.prefills.update(batches, tokens)
        self._answers.clear()
        if batches:  # the prefill rate moved, and the batch may hold new requests
            self._hold_left = 0

    def _prefill_time(self, batch_size: int, tokens: float, speculative: bool, t_own: float,
                      t_other: float, derive: bool = True) -> float:
        """Seconds of prefill batches expected after a decode step of ``batch_size``
        requests making ``tokens`` tokens in that mode, whose step takes ``t_own``
        (the other mode's ``t_other``).

        Under the overlap scheduler the host launches a prefill while the GPU runs the
        decode step before it, so a longer step hides more of the prefill: a prefill
        batch adds about L - t to the wall time, L its own latency. Until a mode has a
        measured price it is derived from the other's that way, not borrowed as it
        stands: on the 8B pair (acceptance 3.5, batch 64) a prefill's eager forward took
        about 36 ms of host time for 7.5 ms of GPU time, and added 42.8 ms after a 6.4 ms
        plain step but 13.8 ms after a 24.6 ms speculative one; priced at plain's,
        speculation looked 5% ahead instead of 30%.

        A price counts only where it was measured near ``batch_size`` (as the step
        times must be), else prefills count in neither mode: with fixed output lengths
        a refill's prefills come between decode steps that are seldom back to back, so
        on the 8B pair at acceptance 3.5 the only prices were speculation's at batch 1-2
        (32-38 ms, after a 7 ms step). Read flat at batch 64, with a prefill batch after
        every fifth plain step, they put speculation 36% ahead where no-spec led static
        EAGLE-3 by 6%.

        ``derive=False`` counts a price not measured near ``batch_size`` as 0, its lower
        bound (``_unpriced``)."""
        plain_price, spec_price = self._plan(batch_size)[4]
        own, other = (spec_price, plain_price) if speculative else (plain_price, spec_price)
        # The prices first: per table, where the rate's logarithm moves every step.
        if own is not None:
            return self.prefills.per_step(tokens) * max(0.0, own)
        if derive and other is not None:
            return self.prefills.per_step(tokens) * max(0.0, other + t_other - t_own)
        return 0.0

    def _derived_price_mode(self, batch_size: int) -> bool | None:
        """The mode (True: speculative) whose prefill price near ``batch_size`` is
        derived from the other's measured one (``_prefill_time``), None where both are
        measured or neither. Where one is, calls rest on the estimate and on the context
        (``_unpriced``), so no answer holds."""
        plain_price, spec_price = self._plan(batch_size)[4]
        if (plain_price is None) == (spec_price is None):
            return None
        return plain_price is not None

    def _unpriced(self, batch_size: int, plain: float, spec: float, context: int) -> bool | None:
        """The mode to run (True: speculative) so that it measures its prefill price near
        ``batch_size``, where the call rests on that price derived from the other mode's;
        None where it does not. A derived price is no bound either way: a prefill between
        speculative steps also runs the draft's extend, and its host work hides behind
        the step before it. On the tiny pair at batch 64 (H100) a prefill added 8.4 ms
        after a 4 ms speculative step and, derived from it, 10.5 ms after a 2 ms plain
        one, about three times what plain's prefills cost end to end: the policy
        speculated on 96% of the steps at 0.90x no-spec. On the 8B pair plain's added
        42.8 ms and speculation's 13.8 ms. At most ``PRICE_EXPLORATIONS`` per mode and
        bucket: where prefills seldom fall between back-to-back steps of one mode (fixed
        output lengths, the refill of a wave) an exploration files nothing, and the
        derived price stands. ``plain``, ``spec``: the predictions with the derived price."""
        speculative = self._derived_price_mode(batch_size)
        if speculative is None:
            return None  # both measured, or neither (then prefills count in neither mode)
        if self._price_explored.get((speculative, costs.bucket(batch_size)), 0) >= self.PRICE_EXPLORATIONS:
            return None
        _, _, low_plain, low_spec = self._rates(batch_size, context, self.acceptance.expected_tokens(), False)
        return speculative if (low_spec > low_plain) != (spec > plain) else None

    def on_launch(self, speculative: bool, batch_size: int = 1, context: int = 0) -> None:
        if self._hold_left:
            if speculative == self._hold_spec and self._held(batch_size, context):
                # What the generic path below would do for a stay launch, all of it
                # already done by the launch that took the hold up, but the counts.
                self._hold_left -= 1
                self._launched += 1
                if speculative:
                    self._reasons[_STAY] += 1
                else:
                    self._reasons[_STAY_PLAIN] += 1
                    self._plain_run += 1
                    self._answers.clear()  # no verify clears them while plain
                return
            self._hold_left = 0
        # The scheduler asked speculate(batch_size, context) for this batch just before,
        # with the same state: _decide tells why it answered as it did.
        decided, why = self._decide(batch_size, context)
        key = (speculative, batch_reason(speculative, decided, why))
        self._reasons[key] = self._reasons.get(key, 0) + 1
        self._answers.clear()
        self._launched += 1
        offer, self._offer = self._offer, None
        if offer is not None and speculative == decided and why == "goodput" and offer[0] == batch_size:
            self._hold_size, self._hold_low, self._hold_high, self._hold_left = offer
            self._hold_spec = speculative
            # A plain hold allows for no verify: one (a batch forced to speculate) ends it.
            self._hold_verifies = self._hold_left if speculative else 0
        continuing, self._may_extend = self._may_extend, False
        if why == "refresh" and speculative == decided:
            self._refresh_step(batch_size, speculative, continuing)
            return
        if speculative != decided or why == "probe":
            # Not the policy's mode: a probe, or a batch forced to speculate.
            self._plain_run = 0 if speculative else self._plain_run + 1
            return
        if why == "price":  # an exploration for a prefill price (_unpriced)
            key = (speculative, costs.bucket(batch_size))
            self._price_explored[key] = self._price_explored.get(key, 0) + 1
            why = "explore"
        if why == "goodput":
            # Entering plain from speculation or an exploration starts an unchecked stretch.
            self._stretch_unchecked = not speculative and (
                self._stretch_unchecked or bool(self._speculating) or self._last_explored)
        self._last_explored = why == "explore"
        # Consecutive steps exploring one mode (the count restarts with the other).
        same = why == "explore" and self._explored and speculative == self._speculating
        self._explored = self._explored + 1 if same else int(why == "explore")
        if why == "explore":
            # Lone steps file no time (controller._time_step): an exploration runs on
            # for EXPLORE_SYNC steps whatever the batch size does meanwhile.
            self._explore_left = (self._explore_left or self.EXPLORE_SYNC) - 1
        self._plain_run = 0 if speculative else self._plain_run + 1
        self._speculating = speculative
        if why == "goodput" and not speculative:
            self._steady_plain.add(costs.bucket(batch_size))

    def _refresh_step(self, batch_size: int, speculative: bool, continuing: bool) -> None:
        if not self._refresh_left and continuing:  # the first step of another round
            self._extensions += 1
            self._refresh_left = self.REFRESH_STEPS
        elif not self._refresh_left:  # its first step
            self._extensions = 0
            b = costs.bucket(batch_size)
            why = REFRESH_STALE
            if speculative:
                stale = b in self._slower[costs.SPEC]
                if not stale:
                    why = REFRESH_STRETCH if self._stretch_unchecked else REFRESH_CLOSE
                if self._stretch_unchecked:
                    self._stretch_unchecked, self._checked_at = False, self._launched
                if stale:
                    self._refreshed.add(b)  # the next refresh of a stale time waits longer
                self._plain_run = 0  # the next probe is due an interval after it
            else:
                self._steady_plain.add(b)
            # A stretch's check adds its steps to the bucket's samples: dropped, a refresh
            # that files fewer than MIN_SAMPLES (prefills between its steps) leaves the
            # bucket unmeasured, and its exploration follows (the tiny pair at c=64 in the
            # simulation: 181 more speculative steps, 0.97x no-spec).
            if why != REFRESH_STRETCH:
                self._stale.append((costs.SPEC if speculative else costs.PLAIN, b, why))
            self._refresh_left, self._refresh_spec = self.REFRESH_STEPS, speculative
        self._refresh_left -= 1
        # Sync after the last step, as after an exploration.
        self._explored = self.REFRESH_STEPS - self._refresh_left
        # The next answer, with the fresh time shared, may run another round (_answer).
        self._may_extend = not self._refresh_left and speculative and self._extensions < self.REFRESH_ROUNDS - 1

    def stale_buckets(self) -> list[tuple[str, int, str]]:
        stale, self._stale = self._stale, []
        return stale

    def reason_counts(self) -> dict[tuple[bool, str], int]:
        return self._reasons

    def sync_due(self) -> bool:
        return self._explored > 0 and self._explored % self.EXPLORE_SYNC == 0

    def settled(self) -> bool:
        # Holding an answer to stay in its mode (_hold_for, _plain_hold_for): none while
        # exploring or refreshing, or where one mode's prefill price is derived from the
        # other's. A plain stretch's probes switch, and take the wait back to sync_every.
        return self._hold_left > 0

    @staticmethod
    def _measured_near(by_bucket: dict, batch_size: int) -> bool:
        return any(batch_size / 2 <= b <= 2 * batch_size for b in by_bucket)

    def _near(self, mode: str, batch_size: int) -> bool:
        """``_measured_near`` in the current table, per table."""
        key = ("near", mode, batch_size)
        near = self._table_at.get(key)
        if near is None:
            near = self._table_at[key] = self._measured_near(self.costs[mode], batch_size)
        return near

    def _lookup(self, mode: str, batch_size: int, above: str = "flat") -> float | None:
        """``costs.lookup`` in the current table, per table."""
        key = (mode, batch_size, above)
        if key not in self._table_at:
            self._table_at[key] = costs.lookup(self.costs[mode], batch_size, above=above)
        return self._table_at[key]

    def probe_interval(self, t_plain: float, t_spec: float, t_window: float | None = None) -> int:
        """Plain steps between probes: a probe costs t_spec - t_plain more than the
        plain step it replaces, or what its measured window (``t_window``: the probe
        and a plain step either side) holds beyond three plain steps, if more: the
        switches in and out of speculation cost too. That must stay within
        probe_budget of the time."""
        extra = max(0.0, t_spec / t_plain - 1.0)
        if t_window is not None:
            extra = max(extra, t_window / t_plain - 3.0)
        return max(self.probe_every, math.ceil(extra / self.probe_budget))

    def _spec_measured_for(self, batch_size: int) -> bool:
        key = ("spec_for", batch_size)
        measured = self._table_at.get(key)
        if measured is None:
            spec = self.costs[costs.SPEC]
            measured = self._table_at[key] = bool(
                self._near(costs.SPEC, batch_size) and batch_size <= self.REACH * max(spec)
                and costs.bucket(batch_size) * self.REACH >= min(spec))
        return measured

    def _plain_measured_for(self, batch_size: int) -> bool:
        # Read flat from a larger batch, plain's time is an upper bound (class doc).
        key = ("plain_for", batch_size)
        measured = self._table_at.get(key)
        if measured is None:
            plain = self.costs[costs.PLAIN]
            measured = self._table_at[key] = bool(
                self._near(costs.PLAIN, batch_size) and costs.bucket(batch_size) * self.REACH >= min(plain))
        return measured

    def _held(self, batch_size: int, context: int) -> bool:
        return batch_size == self._hold_size and self._hold_low <= context <= self._hold_high

    def _decide(self, batch_size: int, context: int = 0) -> tuple[bool, str]:
        if self._hold_left and self._held(batch_size, context):
            return _STAY if self._hold_spec else _STAY_PLAIN
        answer = self._answers.get((batch_size, context))
        if answer is None:
            answer = self._answers[batch_size, context] = self._answer(batch_size, context)
        return answer

    def _stale_spec(self, batch_size: int, interval: int) -> bool:
        """Whether this bucket's speculative time needs measuring again: a larger batch's
        speculative step was measured faster, which a step of fewer requests cannot be
        in steady state, whatever ran the steps that filed it (a stall while the policy
        speculated there, the warm-up's tail). Once a refresh has re-measured it, again
        only after ``REFRESH_STEPS`` times ``interval`` plain steps in a row (the probe
        interval): a refresh then costs what that many lone probes would."""
        b = costs.bucket(batch_size)
        if b not in self._slower[costs.SPEC]:
            return False
        return b not in self._refreshed or self._plain_run >= self.REFRESH_STEPS * interval

    def _stale_plain(self, batch_size: int) -> bool:
        """Whether this bucket's plain time needs measuring again while speculating:
        slower than a larger batch's, and never since by plain steps the policy chose
        or a refresh (no probe interval bounds plain refreshes: once per bucket)."""
        b = costs.bucket(batch_size)
        return b not in self._steady_plain and b in self._slower[costs.PLAIN]

    def _answer(self, batch_size: int, context: int) -> tuple[bool, str]:
        self._answer_tokens = self.acceptance.expected_tokens()
        self._offer = None
        if self._refresh_left:
            return self._refresh_spec, "refresh"
        if self._explore_left:
            return bool(self._speculating), "explore"
        if not self._spec_measured_for(batch_size):
            return True, "explore"
        if not self._plain_measured_for(batch_size):
            return False, "explore"
        # A speculating server's answer (most of them) needs no Prediction: only plain's
        # is read beyond the two rates.
        if self._speculating:
            _, _, plain, spec = self._rates(batch_size, context, self.acceptance.expected_tokens())
        else:
            p = self._predict(batch_size, context)
            plain, spec = p.plain, p.spec
        price = self._unpriced(batch_size, plain, spec, context)
        if price is not None:
            return price, "price"
        if self._speculating:  # speculating: stay unless plain is clearly better
            if spec >= plain * (1 - self.hysteresis):
                # Staying rests on the plain time: measure it again if it looks stale.
                if self._stale_plain(batch_size):
                    return False, "refresh"
                self._offer = self._hold_for(batch_size, context, spec / (plain * (1 - self.hysteresis)))
                return _STAY
            return False, "goodput"
        # Leaving plain needs the estimate less one standard error to pay: a lucky
        # probe alone (upstream's simulated acceptance 1.3 gives a whole batch 2
        # tokens in 3 of 10 steps) must not start a speculative stretch, which the
        # hysteresis then prolongs (8% of the steps at batch 1 in the 8B sweep).
        if p.sure > plain * (1 + self.hysteresis):
            return True, "goodput"
        # A refresh that leaves speculation ahead by the estimate, but not surely ahead,
        # runs another round (up to REFRESH_ROUNDS): its steps cost nothing where
        # speculation leads, and one round's verifies, aged away by the next probe, may
        # never settle the call (8B pair at acceptance 3.5, batch 64, simulated: 12%
        # ahead, plain for some 1,100 steps at 7 verifies a round).
        if self._may_extend and spec > plain * (1 + self.hysteresis):
            return True, "refresh"
        t_window = self._lookup(costs.PROBE, batch_size) if self._near(costs.PROBE, batch_size) else None
        interval = self.probe_interval(p.t_plain, p.t_spec, t_window)
        stale = self._stale_spec(batch_size, interval)
        # A probe only pays where its verify could change the answer: not where even
        # every draft accepted (k + 1 tokens a step) would leave plain ahead (8B pair,
        # batch 128: a speculative step costs 5 plain ones, k + 1 = 4), unless that rests
        # on a stale time. The plain run keeps counting, so the first batch small enough
        # probes at once.
        if p.best <= plain * (1 + self.hysteresis) and not stale:
            return self._stay_plain(batch_size, context)
        # A stale time's first refresh comes at the shortest probe interval, not at one
        # stretched by that time: a speculative step filed too slow (steps right after a
        # wait) made the interval too, and a refresh landing after the next wait filed
        # it slow again (simulated tiny pair at c=1: 0.73x, plain on 99% of the batches).
        first_stale = stale and costs.bucket(batch_size) not in self._refreshed
        # So does a plain stretch's first check: the policy entered it on an estimate of a
        # few verifies (at batch 1 one request's each), or on a speculative time the
        # exploration measured, and the lone probes after it bring one verify each, aged
        # away by the next: on the tiny pair at c=1 (H100, 2026-12-07) early requests
        # accepting 2.1-2.8 tokens, or a warm-up's 4.3 ms step against 3.1 steady, kept
        # goodput plain for some 600-900 batches at about 0.85x static EAGLE-3. Within the
        # probe budget, as a stale time's later refreshes: a check at most every
        # REFRESH_STEPS probe intervals (where plain leads narrowly, a check that puts the
        # noisy estimate ahead starts a short speculative run, and the stretch after it
        # would be checked again).
        check = first_stale or (self._stretch_unchecked
                                and self._launched - self._checked_at >= self.REFRESH_STEPS * interval)
        due = self.probe_every if check else interval
        if self._plain_run >= due:
            close = spec >= plain * (1 - self.hysteresis)
            return True, "refresh" if close or check or stale else "probe"
        return self._stay_plain(batch_size, context, due - self._plain_run - 1)

    def _stay_plain(self, batch_size: int, context: int, launches: int | None = None) -> tuple[bool, str]:
        """``launches``: how many more launches stay plain before the probe due as this
        answer stands (None: no probe is due)."""
        if not self._offering:
            self._offer = self._plain_hold_for(batch_size, context, launches)
        return _STAY_PLAIN

    def _plain_hold_for(self, batch_size: int, context: int,
                        launches: int | None = None) -> tuple[int, int, int, int] | None:
        """The hold an answer to stay plain offers, or None: ``_hold_for``'s, for plain
        stretches (the users' K2.5 case: plain at every load), worked out each batch.

        While plain no verify comes (one ends the hold), so the estimate stands; what
        moves is the plain run and the launch count, towards the next probe or check, and
        the context, by one token a request a launch. Every way out of staying plain
        comes sooner with more launches (a probe due, a stale time, a stretch's check),
        so the answer after the hold's last launch stands for those before it; and it is
        worked out at both ends of the context range. None where one mode's prefill price
        is derived from the other's (as ``_hold_for``), or after a refresh that may run
        another round."""
        n = self.HOLD_MAX if launches is None else min(self.HOLD_MAX, launches)
        if self._derived_price_mode(batch_size) is not None or self._may_extend or n <= 0:
            return None
        saved = self._plain_run, self._launched
        self._offering = True
        try:
            for _ in range(2):  # near a probe due, a shorter hold once; then none
                self._plain_run, self._launched = saved[0] + n, saved[1] + n
                high = context + n * batch_size
                if (self._answer(batch_size, context) == _STAY_PLAIN
                        and self._answer(batch_size, high) == _STAY_PLAIN):
                    return batch_size, context, high, n
                n //= 8
                if not n:
                    break
        finally:
            self._plain_run, self._launched = saved
            self._offering = False
        return None

    def _hold_for(self, batch_size: int, context: int, margin: float) -> tuple[int, int, int, int] | None:
        """The hold an answer to stay with speculation at ``batch_size`` and ``context``
        offers (``margin``: its speculative rate over the least that stays), or None.

        Working out each answer was most of what the policy added to a speculative
        batch (``benchmark/hook_cost.py``, medians of 7 runs: 16.3 us a batch against 5.2 for
        a policy that never goes plain; 14.1 with holds), on servers whose host sets the pace. A hold
        of n launches is offered only where staying would be the answer at each of them
        whatever the verifies bring, so it changes no call: the n-th held launch's
        answer has seen at most n more verifies (with the overlap scheduler, those of
        the batch in flight at this answer and of the held ones before it; one more
        ends the hold), and the estimate is at its lowest where none of them accepted a
        draft (``expected_after_misses``); the batch's context has grown by at most
        k + 1 tokens a request with each, and the ratio of the two predictions moves one
        way with it, so the two ends of that range bound it. A new table, another batch
        size, a context outside the range or a prefill (its rate moved, and a new
        request may have joined) ends a hold; between prefills the rate moves slowly
        (half-life 256 steps) and is read as at the answer. None where one mode's
        prefill price is derived from the other's (``_unpriced`` then rests on the
        estimate, and the derived price on the context).
        """
        if self._derived_price_mode(batch_size) is not None:
            return None
        a = self.acceptance
        expected, lag = a.expected_tokens(), self._launched - a.aged_at
        growth = batch_size * (a.k + 1)
        n = self.HOLD_MAX
        while n:
            tokens = a.expected_after_misses(n, lag + n)
            # At this context the rate falls at most in proportion to the tokens (the
            # prefills' share falls with them): a bound checked first, without a lookup.
            if tokens * margin >= expected:
                high = context + n * growth
                _, _, plain, spec = self._rates(batch_size, high, tokens)
                if spec >= plain * (1 - self.hysteresis):
                    return batch_size, context, high, n
            n //= 2
        return None

    def _predict(self, batch_size: int, context: int = 0, derive: bool = True) -> Prediction:
        """Output tokens per second and request, with both modes' step times measured
        near ``batch_size``, at ``context`` tokens in the batch (``derive``: see
        ``_prefill_time``)."""
        t_plain, t_spec, plain, spec = self._rates(batch_size, context, self.acceptance.expected_tokens(), derive)
        return Prediction(t_plain, t_spec, plain, spec,
                          lambda tokens: self._rates(batch_size, context, tokens, derive)[3], self.acceptance)

    def _rates(self, batch_size: int, context: int, tokens: float,
               derive: bool = True) -> tuple[float, float, float, float]:
        """(T_plain, T_spec, plain, spec) of ``_predict`` with ``tokens`` expected a
        speculative step: the step times at ``context`` (seconds) and output tokens per
        second and request, each mode's prefills after a step included."""
        plan = self._plan(batch_size)
        t_plain, t_spec = plan[0] + plan[1] * context, plan[2] + plan[3] * context
        plain = 1.0 / (t_plain + self._prefill_time(batch_size, batch_size, False, t_plain, t_spec, derive))
        if tokens <= 0:
            return t_plain, t_spec, plain, 0.0
        prefills = self._prefill_time(batch_size, batch_size * tokens, True, t_spec, t_plain, derive)
        return t_plain, t_spec, plain, tokens / (t_spec + prefills)

    def _plan(self, batch_size: int) -> tuple:
        """What the current table says at a batch size, per table (an answer reads it some
        ten times): the plain step at no context and its seconds per token of context, the
        same for a speculative step, and (plain's, speculation's) prefill price where one
        was measured near it, else None."""
        plan = self._table_at.get(batch_size)
        if plan is None:
            prices = tuple(self._lookup(mode, batch_size) if self._near(mode, batch_size) else None
                           for mode in (costs.PLAIN_PREFILL, costs.SPEC_PREFILL))
            plan = self._table_at[batch_size] = (
                self._lookup(costs.PLAIN, batch_size, above="linear"), self.per_token.get(costs.PLAIN, 0.0),
                self._lookup(costs.SPEC, batch_size, above="proportional"), self.per_token.get(costs.SPEC, 0.0),
                prices)
        return plan

    def speculate(self, batch_size: int, context: int = 0) -> bool:
        # _decide's first line with _held inline: the scheduler asks twice a batch or more.
        if self._hold_left and batch_size == self._hold_size and self._hold_low <= context <= self._hold_high:
            return self._hold_spec
        return self._decide(batch_size, context)[0]

    def explain(self, batch_size: int, context: int = 0) -> dict:
        """The answer, why (goodput, probe, refresh, explore, price), the acceptance
        estimate and, once both modes have a step time, both predictions in output
        tokens/s per request (``sure``: the estimate less one standard error)."""
        decided, why = self._decide(batch_size, context)
        out = {"decided": decided, "why": why, "speculating": self._speculating, "plain_run": self._plain_run,
               "expected_tokens": round(self.acceptance.expected_tokens(), 3)}
        if self.costs[costs.PLAIN] and self.costs[costs.SPEC]:
            p = self._predict(batch_size, context)
            out.update(plain_tps=round(p.plain, 1), spec_tps=round(p.spec, 1), sure_tps=round(p.sure, 1))
        return out

    def describe(self) -> str:
        return (f"goodput(measured step costs, acceptance over {self.acceptance.k} draft positions, "
                f"probes within {self.probe_budget:.0%} of the time, hysteresis {self.hysteresis:.0%})")


@dataclass(frozen=True)
class PolicyConfig:
    """What the server flags say; validated in ``args.py``."""

    policy: str = POLICY_OFF
    threshold: int | None = None
    alternate_period: int = 1
    cost_table_path: str | None = None
    # None: 'kv' where the draft has a K/V writer, else 'none' (keepwarm.resolve).
    keep_warm: str | None = None
    # Chosen by default (EAGLE/EAGLE3 and none of this package's flags), not asked
    # for: a server it cannot serve falls back to upstream's worker, not to an error.
    implicit: bool = field(default=False, compare=False)

    @property
    def enabled(self) -> bool:
        return self.policy != POLICY_OFF


def make_policy(config: PolicyConfig, num_steps: int = 1) -> ModePolicy:
    """The policy of an enabled config. With 'off' no adaptive worker is built, so
    there is no policy to make. ``num_steps``: draft steps per speculative step."""
    if config.policy == POLICY_THRESHOLD:
        if config.threshold is None:
            raise ValueError("the threshold policy needs a threshold")
        return ThresholdPolicy(config.threshold)
    if config.policy == POLICY_ALTERNATE:
        return AlternatePolicy(config.alternate_period)
    if config.policy == POLICY_GOODPUT:
        return GoodputPolicy(num_steps)
    raise ValueError(
        f"no switching policy for {config.policy!r}; "
        f"choose {POLICY_THRESHOLD!r}, {POLICY_GOODPUT!r} or {POLICY_ALTERNATE!r}"
    )


def plain_kv_reserve(last_decode_width: int, overlap: bool) -> int:
    """KV slots beyond ``kv_committed_len`` a plain decode step must have allocated.

    Under the overlap scheduler the CPU lags one batch: the in-flight batch may still
    write ``last_decode_width`` positions past what is committed (1 after a plain
    step, num_draft_tokens after a speculative one), and this step writes one more.
    Without overlap the committed length is exact and one slot suffices.
    """
    return (last_decode_width if overlap else 0) + 1
