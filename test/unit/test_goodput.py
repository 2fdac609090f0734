"""The goodput policy, its acceptance estimate and the step-cost table, on synthetic
cost tables and acceptance streams (pure Python: no torch, no SGLang)."""

import copy
from collections import Counter
import json
import math
import os
import random
from statistics import median
import threading

import pytest

from sglang_adaptive import controller as ctl, costs, decisions
from sglang_adaptive.policy import (REFRESH_STALE, AcceptanceEstimator, GoodputPolicy, PolicyConfig, PrefillRate,
                                    make_policy)

K = 3  # draft steps: up to 4 tokens per speculative step


def table(plain: dict, spec: dict) -> dict:
    """Milliseconds by batch size -> the seconds table the policy reads."""
    return {costs.PLAIN: {b: ms / 1e3 for b, ms in plain.items()},
            costs.SPEC: {b: ms / 1e3 for b, ms in spec.items()}}


# A small model at TP 2, roughly as measured on the K2.5-shaped pair: a speculative
# step costs 2-3 plain steps, less so at small batches.
MEASURED = table(plain={1: 2.5, 8: 2.8, 32: 3.4, 128: 5.3}, spec={1: 4.8, 8: 5.6, 32: 9.0, 128: 24.0})


def feed(policy: GoodputPolicy, accepted: int, steps: int, batch: int = 4) -> None:
    """``steps`` speculative steps in which every request accepts ``accepted`` drafts."""
    for _ in range(steps):
        policy.on_launch(True, batch)
        policy.on_verify([accepted] * batch)


def put(policy: GoodputPolicy, **state) -> None:
    """Set the policy's private state as a scenario needs it; its answers are kept
    per state, so they go too."""
    for name, value in state.items():
        setattr(policy, name, value)
    policy._answers.clear()
    policy._hold_left, policy._offer = 0, None


def serve(policy: GoodputPolicy, batch: int, steps: int, accepted: int) -> int:
    """``steps`` decode batches as the policy decides them, each speculative one
    verified with ``accepted`` drafts per request; returns how many speculated."""
    spec_steps = 0
    for _ in range(steps):
        spec = policy.speculate(batch)
        spec_steps += spec
        policy.on_launch(spec, batch)
        if spec:
            policy.on_verify([accepted] * batch)
    return spec_steps


# -- acceptance ----------------------------------------------------------------------


def test_acceptance_per_position_gives_the_expected_tokens_per_step():
    est = AcceptanceEstimator(K, half_life=1e9)
    # 10 requests: 4 accept nothing, 3 accept one draft, 2 accept two, 1 all three.
    est.update([0] * 4 + [1] * 3 + [2] * 2 + [3], step=1)
    # The step weighs 1 (each request 1/10); the prior (1 reached, 0.5 accepted per
    # position) is included.
    reached, accepted = [2.0, 1.6, 1.3], [1.1, 0.8, 0.6]
    assert est.rates() == pytest.approx([a / r for a, r in zip(accepted, reached)])
    r = est.rates()
    assert est.expected_tokens() == pytest.approx(1 + r[0] + r[0] * r[1] + r[0] * r[1] * r[2])


def test_old_evidence_halves_every_half_life_of_launched_steps():
    est = AcceptanceEstimator(1, half_life=10)
    est.update([1] * 1000, step=0)   # all accepted
    est.update([0] * 1000, step=10)  # all rejected, one half-life later
    # (prior 0.5 of 1, plus the first step's 1 of 1), halved; then the second step's 0 of 1
    assert est.rates()[0] == pytest.approx((1.5 * 0.5 + 0) / (2 * 0.5 + 1), rel=1e-9)


def test_a_step_weighs_one_whatever_its_batch_size():
    """A load that drops from 64 requests to 1: 100 verifies at batch 64 that accepted
    every draft, a plain stretch of 300 steps (4.7 half-lives), then 7 verifies at batch
    1 that accepted none. Counted per request, the large batches' 6,400 requests would
    still hold 250 of weight against 7 and predict about 3.9 tokens a step."""
    est = AcceptanceEstimator(K)
    for i in range(100):
        est.update([K] * 64, step=i)
    for i in range(400, 407):
        est.update([0], step=i)
    assert est.expected_tokens() < 2.2, est.expected_tokens()
    assert est.rates()[0] == pytest.approx(est.accepted[0] / est.reached[0])


def test_the_standard_error_counts_steps_not_requests():
    est = AcceptanceEstimator(K)
    assert est.standard_error() == float("inf")  # no verify yet: nothing is sure
    est.update([1] * 128, step=1)
    one_step = est.standard_error()
    # 128 requests that accepted alike are one observation of the step's mean,
    # as sure as a single request's.
    alone = AcceptanceEstimator(K)
    alone.update([1], step=1)
    assert one_step == pytest.approx(alone.standard_error()) and one_step > 0.3
    # Steps that disagree widen it; many steps narrow it.
    for i in range(2, 40):
        est.update([i % 2 * 2] * 128, step=i)
    assert 0.1 < est.standard_error() < 0.25


def test_expected_tokens_span_one_to_k_plus_one():
    low, high = AcceptanceEstimator(K), AcceptanceEstimator(K)
    for i in range(1000):  # steps, each weighing 1: the prior's weight of one step fades
        low.update([0] * 10, step=i)
        high.update([K] * 10, step=i)
    assert low.expected_tokens() == pytest.approx(1.0, abs=1e-3)
    assert high.expected_tokens() == pytest.approx(K + 1, abs=1e-2)



def fold_in_turn(k: int, half_life: float, verifies: list) -> dict:
    """The estimate's sums by their definition, one verify at a time: everything before a
    verify ages by 0.5 ** (steps since the last one / half_life), then the verify adds
    weight 1 spread over its requests (the prior: 1 reached, 0.5 accepted per position)."""
    reached, accepted, steps, total, total_sq, at = [1.0] * k, [0.5] * k, 0.0, 0.0, 0.0, 0
    for num_correct, step in verifies:
        f = 0.5 ** ((step - at) / half_life)
        at, n = step, len(num_correct)
        mean = 1 + sum(num_correct) / n
        steps, total, total_sq = steps * f + 1, total * f + mean, total_sq * f + mean * mean
        for i in range(k):
            reached[i] = reached[i] * f + sum(d >= i for d in num_correct) / n
            accepted[i] = accepted[i] * f + sum(d > i for d in num_correct) / n
    return {"reached": reached, "accepted": accepted, "sums": [steps, total, total_sq]}


@pytest.mark.parametrize("sizes", [(1,), (1, 2, 7, 64)], ids=["batch 1", "mixed batches"])
def test_folding_many_verifies_at_once_equals_folding_each_in_turn(sizes):
    """The estimate folds its pending verifies in one pass when read (at batch 1 the
    whole fold sorts each verify's weight by drafts accepted): the sums must be the
    ones of the definition, read after every verify or after 63."""
    rng = random.Random(7)
    for k in (1, 3, 5):
        verifies, step = [], 0
        for _ in range(400):
            step += rng.choice((0, 1, 1, 1, 2, 9))
            verifies.append(([rng.choice((0, 0, 1, k, k)) if rng.random() < 0.5 else rng.randint(0, k)
                              for _ in range(rng.choice(sizes))], step))
        want = fold_in_turn(k, 64.0, verifies)
        for read_every in (1, 5, 63):
            est = AcceptanceEstimator(k)
            for i, (num_correct, at) in enumerate(verifies):
                est.update(num_correct, at)
                if i % read_every == 0:
                    est.expected_tokens()
            got = {"reached": est.reached, "accepted": est.accepted, "sums": [est._steps, est._sum, est._sum_sq]}
            for key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-12), (k, read_every, key)
            assert est.aged_at == step and min(est.accepted) > 0

# -- step costs ------------------------------------------------------------------------


def test_step_costs_keep_the_median_per_bucket_once_there_are_enough_samples():
    c = costs.StepCosts(window=5, min_samples=3)
    for seconds in (0.010, 0.011):
        c.add(False, 30, seconds)
    no_slopes = {costs.PER_TOKEN: {costs.PLAIN: 0.0, costs.SPEC: 0.0}}
    assert c.table() == {**{mode: {} for mode in costs.MODES}, **no_slopes} and c.step_time(False, 30) is None
    c.add(False, 29, 0.5)  # the same bucket (32); a stall, ignored by the median
    assert c.table()[costs.PLAIN] == {32: 0.011} and c.step_time(False, 25) == 0.011
    assert c.step_time(True, 30) is None
    assert [costs.bucket(b) for b in (1, 8, 9, 16, 17, 128)] == [1, 8, 16, 16, 24, 128]


def test_the_table_reads_every_sample_and_slope_since_the_last_one():
    """table() keeps what it worked out per bucket between calls (a sync every 32
    batches); it must equal the table worked out afresh from the same history."""
    rng = random.Random(7)
    kept, fresh = costs.StepCosts(window=7, min_samples=3), costs.StepCosts(window=7, min_samples=3)
    tables = 0
    for step in range(3000):
        bs = rng.choice((1, 2, 8, 12, 40))
        context = bs * (64 + step % 448)  # grows, then a refill
        spec = rng.random() < 0.5
        seconds = (0.003 if spec else 0.0015) * (1 + 0.02 * bs) + (4e-7 if spec else 5e-8) * context
        seconds *= rng.uniform(0.97, 1.03) * (1 + step / 3000)  # the steps slow down: medians move
        prefill = 0.004 * rng.uniform(0.9, 1.1) if step % 17 == 0 else None
        for c in (kept, fresh):
            c.add(spec, bs, seconds, context)
            if prefill is not None:
                c.add_prefill(spec, bs, prefill)
        if step % 29 == 0:
            fresh._derived.clear()
            assert kept.table() == fresh.table()
            tables += 1
    assert tables > 100 and kept.slope(costs.SPEC) > 0  # the slopes moved between the calls


def test_lookup_interpolates_between_measured_buckets_and_clamps_outside():
    by = {8: 0.002, 32: 0.004}
    assert costs.lookup(by, 16) == pytest.approx(0.002 + 0.002 * 8 / 24)
    assert costs.lookup(by, 1) == 0.002 and costs.lookup(by, 500) == 0.004
    assert costs.lookup({}, 4) is None


def waves_of_steps(bs: int, at_no_context: float, per_token: float, *, waves: int = 4, prompt: int = 256,
                   output: int = 256, tokens_per_step: int = 1, stall_every: int = 0):
    """(batch size, context, seconds) of the decode steps of closed-loop waves: every
    request starts at ``prompt`` tokens and ends after ``output`` more, then the wave is
    replaced. Every ``stall_every``-th step takes three times as long."""
    n = 0
    for _ in range(waves):
        for made in range(0, output, tokens_per_step):
            context = bs * (prompt + made)
            n += 1
            stall = 3.0 if stall_every and n % stall_every == 0 else 1.0
            yield bs, context, stall * (at_no_context + per_token * context)


def test_the_context_slope_is_fitted_per_batch_size_and_stalls_leave_it():
    """Speculative steps (4 tokens a request) whose batch grows from 25 to 31 requests
    through each wave, within bucket 32, where each request costs 0.25 ms a step of its
    own: compared across sizes, that would pass for context (+56%). Every 97th step
    stalls (three times as long), and so does each size's third (the first after it
    settles: a server's first steps run slow)."""
    c = costs.StepCosts()
    slope, n, seen = 0.3e-6, 0, Counter()
    for _ in range(6):
        for made in range(0, 256, 4):
            bs = 25 + made // 40
            context, n = bs * (256 + made), n + 1
            seen[bs] += 1
            seconds = 1e-3 + 0.25e-3 * bs + slope * context
            c.add(True, bs, seconds * (3.0 if n % 97 == 0 or seen[bs] == 3 else 1.0), context)
    table = c.table()
    assert table[costs.PER_TOKEN][costs.SPEC] == pytest.approx(slope, rel=0.03)
    assert table[costs.PER_TOKEN][costs.PLAIN] == 0.0
    # The bucket's median at no context, over a window of the wave's last 31 steps
    # (sizes 28 to 31: 8.0 to 8.75 ms).
    assert 8.0e-3 <= table[costs.SPEC][32] <= 8.75e-3, table
    assert c.step_time(True, 30, 0) == table[costs.SPEC][32]
    assert c.step_time(True, 30, 12000) == pytest.approx(table[costs.SPEC][32] + 12000 * c.slopes[costs.SPEC].slope())


@pytest.mark.parametrize("seed", range(3))
def test_the_context_slope_holds_through_noisy_steps(seed):
    """The 8B pair's speculative step at batch 64 (11.5 ms + 0.5 us per token of
    context), each step off by 2% at random, 8 waves."""
    rng, slope = random.Random(seed), costs.ContextSlope()
    for _ in range(8):
        for made in range(0, 256, 4):
            context = 64 * (256 + made)
            slope.add(64, context, (11.5e-3 + 0.5e-6 * context) * rng.gauss(1.0, 0.02))
    assert slope.slope() == pytest.approx(0.5e-6, rel=0.05)


def test_a_context_slope_needs_its_steps_and_is_never_negative():
    """A new batch size counts from its sixth step: two settle, the middle one of the
    next three starts its means; then 32 more bring its decayed weight to the 32 a slope
    needs (31 would, undecayed)."""
    c = costs.ContextSlope(min_steps=32)
    slopes = []
    for b, context, seconds in waves_of_steps(8, 2e-3, 0.5e-6, waves=1):
        c.add(b, context, seconds)
        slopes.append(c.slope())
    assert slopes.index(next(x for x in slopes if x)) == 2 + 3 + 32 - 1
    assert slopes[-1] == pytest.approx(0.5e-6, rel=1e-6)
    shrinking = costs.ContextSlope(min_steps=4)
    for i in range(20):  # a step that got faster as the context grew
        shrinking.add(8, 1000 + 100 * i, 5e-3 - 1e-5 * i)
    assert shrinking.slope() == 0.0


def test_the_steps_after_a_refill_do_not_set_the_slope():
    """Where the context falls, a refill's prompts have just been prefilled and the
    first decode steps after them are the ones a prefill disturbs (slow here by 30%):
    they settle uncounted."""
    c = costs.ContextSlope()
    for wave in range(8):
        for i, (b, context, seconds) in enumerate(waves_of_steps(64, 10e-3, 0.5e-6, waves=1, tokens_per_step=4)):
            c.add(b, context, seconds * (1.3 if i < 2 and wave else 1.0))
    assert c.slope() == pytest.approx(0.5e-6, rel=0.01)


def test_a_slope_never_takes_more_than_nine_tenths_of_the_steps_it_was_fitted_on():
    """The H100 at acceptance 1.3 (2026-12-06-h100-goodput-full): speculation's steps at
    batch 128 gave 2.5 us a token, -44.8 ms with no context, which reads a step at 128
    requests of 140 tokens as 0.1 ms and puts speculation at 1.3 tokens a step far ahead
    of plain's 8 ms. Capped where the bucket would keep less than a tenth of its median
    step with no context, the slope prices that step above plain's. The 8B pair's
    fitted costs (11.47 ms + 0.5 us a token at batch 64) keep their slope."""
    c = costs.StepCosts()
    for i in range(60):  # 1.3 tokens a step for 128 requests
        context = 33000 + 166 * i
        c.add(True, 128, -44.8e-3 + 2.5e-6 * context, context)
    assert c.slopes[costs.SPEC].slope() == pytest.approx(2.5e-6)
    samples, contexts = c._samples[(costs.SPEC, 128)], c._contexts[(costs.SPEC, 128)]
    table = c.table()
    capped = table[costs.PER_TOKEN][costs.SPEC]
    assert capped == pytest.approx(0.9 * median(samples) / median(contexts)) and capped < 1.3e-6
    assert table[costs.SPEC][128] == pytest.approx(0.1 * median(samples))
    assert c.step_time(True, 128, 128 * 140) == pytest.approx(table[costs.SPEC][128] + capped * 128 * 140)
    p = GoodputPolicy(K)
    p.set_costs({**table, costs.PLAIN: {1: 6.21e-3, 128: 7.04e-3},
                 costs.PER_TOKEN: {costs.PLAIN: 0.061e-6, costs.SPEC: capped}})
    for i in range(40):  # 1.3 tokens a step
        p.acceptance.update([1 if i % 10 < 3 else 0] * 128, i)
    p._speculating = False
    assert p._predict(128, 128 * 140).t_spec > 2 * p._predict(128, 128 * 140).t_plain
    assert not p.speculate(128, 128 * 140)
    healthy = costs.StepCosts()
    for b, context, seconds in waves_of_steps(64, 11.47e-3, 0.5e-6, tokens_per_step=4):
        healthy.add(True, b, seconds, context)
    assert healthy.table()[costs.PER_TOKEN][costs.SPEC] == pytest.approx(0.5e-6, rel=1e-6)


def test_the_controller_files_each_step_at_its_batchs_context_and_shares_the_slopes(tmp_path):
    clock = Clock()
    path = tmp_path / "costs.json"
    policy = GoodputPolicy(K)
    c = ctl.AdaptiveModeController(policy, spec_width=K + 1, sync_every=64, cost_table_path=str(path), clock=clock)
    it = 0
    for b, context, seconds in waves_of_steps(16, 4e-3, 0.05e-6, waves=1):
        it += 1
        c.on_prepare(False, b, it, context)
        clock.t += seconds
    # The interval between two prepares is filed under the batch prepared first.
    assert list(c.costs._contexts[(costs.PLAIN, 16)])[-1] == 16 * (256 + 253)
    assert policy.per_token[costs.PLAIN] == pytest.approx(0.05e-6, rel=0.02)
    assert policy.costs[costs.PLAIN][16] == pytest.approx(4e-3, rel=0.01)
    doc = json.loads(path.read_text())
    assert doc["seconds_per_context_token"]["plain"] == pytest.approx(0.05e-6, rel=0.02)
    assert doc["seconds_per_step"]["plain"]["16"] == pytest.approx(4e-3, rel=0.01)
    assert ctl.format_costs(c.costs.table()).endswith("; per 1k context tokens plain 0.050, spec 0.000")


def test_the_same_batch_size_speculates_at_a_short_context_and_runs_plain_at_a_long_one():
    """The 8B pair at batch 64, acceptance 3.5 (2026-12-05 decode log windows): a plain
    step 5.17 ms + 0.05 us per token of context, a speculative one 11.47 ms + 0.5 us.
    At 260 tokens a request speculation leads by 6%, at 480 plain by 14%."""
    p = GoodputPolicy(K)
    p.set_costs({costs.PLAIN: {64: 5.17e-3}, costs.SPEC: {64: 11.47e-3},
                 costs.PER_TOKEN: {costs.PLAIN: 0.05e-6, costs.SPEC: 0.5e-6}})
    for i in range(40):  # 3.5 tokens a step: 2 or 3 drafts accepted, alike
        p.acceptance.update([2 + i % 2] * 64, i)
    p._speculating = True
    assert p.speculate(64, 64 * 260) and not p.speculate(64, 64 * 480)
    p.on_launch(False, 64, 64 * 480)
    assert not p.speculate(64, 64 * 481), "plain once the context has outgrown speculation"


# -- decisions -------------------------------------------------------------------------


def test_speculates_at_low_load_and_runs_plain_at_high_load_with_good_acceptance():
    p = GoodputPolicy(K)
    p.set_costs(MEASURED)
    feed(p, accepted=2, steps=50)  # ~3 tokens per step
    e = p.acceptance.expected_tokens()
    assert 2.9 < e < 3.1
    # bs 1: 3 tokens / 4.8 ms beats 1 / 2.5 ms; bs 128: 3 / 24 ms loses to 1 / 5.3 ms.
    assert p.speculate(1) is True and p.speculate(8) is True
    assert p.speculate(128) is False
    # The crossover sits where E / T_spec = 1 / T_plain: between 32 and 128 here.
    assert p.speculate(32) is True


def test_acceptance_collapse_turns_plain_even_at_batch_one_and_probes_bring_it_back():
    p = GoodputPolicy(K, probe_every=100, half_life=64)
    p.set_costs(MEASURED)
    feed(p, accepted=2, steps=100)
    assert p.speculate(1) is True
    feed(p, accepted=0, steps=100)  # the draft stops matching: 1 token per step
    assert p.speculate(1) is False
    # Plain from here; every 100th step is a speculative probe whose verify feeds the
    # estimate. The draft recovers: probes see 3 accepted drafts again, and the
    # collapse's evidence ages away between them.
    modes = []
    for _ in range(1000):
        spec = p.speculate(1)
        modes.append(spec)
        p.on_launch(spec, 1)
        if spec:
            p.on_verify([K])
    assert modes.index(True) == 100 and modes[:100] == [False] * 100
    back = next(i for i in range(len(modes) - 10) if all(modes[i:i + 10]))
    assert back < 800, back
    assert all(modes[back:]), "recovered acceptance should bring speculation back for good"


def test_probes_cost_at_most_one_percent_of_the_time_while_plain_pays():
    p = GoodputPolicy(K, probe_every=100, probe_budget=0.01)
    # A speculative step costs 3.5 plain ones: plain pays at ~3 tokens a step, but
    # speculation could if the drafts were accepted more (up to 4), so probes run.
    p.set_costs(table(plain={64: 4.0}, spec={64: 14.0}))
    feed(p, accepted=2, steps=20, batch=64)
    t_plain, t_spec = 4.0e-3, 14.0e-3
    steps = 5000
    spec_steps = serve(p, batch=64, steps=steps, accepted=2)
    # A probe every 100 steps would cost 2.5% of the time; the budget spaces them to
    # one in 250.
    assert spec_steps >= 10, "probes must still run"
    overhead = spec_steps * (t_spec - t_plain) / (steps * t_plain)
    assert 0.009 <= overhead <= 0.0101, overhead
    # Where speculation is cheap the floor of probe_every steps applies.
    assert p.probe_interval(0.0025, 0.0026) == 100 and p.probe_interval(0.0053, 0.024) == 353


def test_no_probes_where_even_full_acceptance_would_lose_until_the_batch_shrinks():
    """8B pair at batch 128: a speculative step costs 5 plain ones and yields at most
    k + 1 = 4 tokens. A probe there cannot change the answer and costs 4 plain steps."""
    p = GoodputPolicy(K)
    p.set_costs(MEASURED)  # batch 128: 24.0 ms against 5.3 ms, 4.5 plain steps
    feed(p, accepted=K, steps=20, batch=128)  # as good as acceptance gets
    modes = []
    for _ in range(2000):
        spec = p.speculate(128)
        modes.append(spec)
        p.on_launch(spec, 128)
    assert not any(modes) and p._plain_run == 2000
    # The load drops to batch 32 (9.0 ms against 3.4 ms), where speculation could pay:
    # the plain run is long past the interval, so a probe runs at once. (An estimate of
    # 1 token a step, so that the probe, not the estimate, starts speculation.)
    low = AcceptanceEstimator(K)
    low.update([0] * 32, step=p._launched)
    put(p, acceptance=low)
    assert p._decide(32) == (True, "probe")
    # The bound counts the hysteresis, as leaving plain does: k + 1 tokens must beat
    # plain by 5%.
    edge = 4.0 * (K + 1) / 1.05
    p.set_costs(table(plain={64: 4.0}, spec={64: edge * 1.001}))
    assert p._decide(64) == (False, "goodput")
    p.set_costs(table(plain={64: 4.0}, spec={64: edge * 0.999}))
    assert p._decide(64) == (True, "probe")


def test_hysteresis_keeps_the_current_mode_when_predictions_are_close():
    # Speculation predicts 3% more tokens/s than plain: within the 5% hysteresis.
    p = GoodputPolicy(K, hysteresis=0.05)
    feed(p, accepted=2, steps=50)
    e = p.acceptance.expected_tokens()
    p.set_costs(table(plain={8: 3.0}, spec={8: 3.0 * e / 1.03}))
    put(p, _speculating=False)
    assert p.speculate(8) is False  # plain stays plain
    put(p, _speculating=True)
    assert p.speculate(8) is True  # speculative stays speculative
    p.set_costs(table(plain={8: 3.0}, spec={8: 3.0 * e / 1.10}))  # 10% better: switch
    put(p, _speculating=False)
    assert p.speculate(8) is True


# What the 8B server logged at c=128 (acceptance 2.5), before batch 128 had a
# speculative time: plain 64 and 128 measured, speculative only up to 64.
SWEEP_8B = table(plain={1: 4.78, 4: 4.89, 16: 5.38, 32: 5.87, 64: 6.91, 128: 7.83},
                 spec={1: 7.04, 2: 7.12, 4: 7.23, 8: 8.55, 16: 11.04, 32: 16.04, 64: 21.53})


def test_lookup_extrapolates_above_the_largest_bucket_as_asked():
    by = {32: 0.016, 64: 0.0215}
    assert costs.lookup(by, 128) == 0.0215  # flat
    assert costs.lookup(by, 128, above="proportional") == pytest.approx(0.043)
    assert costs.lookup(by, 128, above="linear") == pytest.approx(0.0215 + 0.0055 * 2)
    assert costs.lookup({64: 0.0215}, 128, above="linear") == 0.0215  # one bucket: flat
    assert costs.lookup({32: 0.02, 64: 0.01}, 128, above="linear") == 0.01  # never below
    with pytest.raises(ValueError, match="unknown extrapolation"):
        costs.lookup(by, 128, above="quadratic")


def test_an_unmeasured_large_batch_leans_plain_and_a_probe_does_not_hold_speculation():
    """The 8B sweep at c=128: a probe at batch 128, then the old policy stayed in
    speculation for 26 steps of 50 ms (plain: 8.3 ms), reading batch 64's 21.5 ms."""
    p = GoodputPolicy(K)
    p.set_costs(SWEEP_8B)
    feed(p, accepted=2, steps=3, batch=64)  # E about 2.7 after a probe's verify
    # Far above the largest speculative batch (64): measured by running it, briefly.
    assert p.speculate(128) is True
    # Within reach (up to 1.25 x 64) it is extrapolated in proportion, an upper bound.
    assert costs.lookup(SWEEP_8B[costs.SPEC], 72, above="proportional") == pytest.approx(0.02153 * 72 / 64)
    p.on_launch(False, 72)
    assert p.speculate(72) is False
    put(p, _plain_run=10_000)  # a probe is due
    assert p.speculate(72) is True
    p.on_launch(True, 72)
    p.on_verify([2] * 72)
    assert p.speculate(72) is False  # back to plain at once
    p.on_launch(False, 72)
    assert p._plain_run == 1
    # Within the measured range nothing changed: batch 16 speculates.
    assert p.speculate(16) is True
    # Where flat and proportional disagree: batch 80 read flat from 64 (20 ms) would
    # speculate (2.7 / 20 ms beats 1 / 8.5 ms by 15%); in proportion (25 ms) it does not.
    p.set_costs(table(plain={32: 7.0, 64: 8.0}, spec={32: 14.0, 64: 20.0}))
    assert p.speculate(80) is False
    # A probe leaves the policy plain: where its verify brings the two modes within the
    # hysteresis, the step after it is plain again, not "speculating, so stay".
    after = copy.deepcopy(p.acceptance)
    after.update([K] * 8, p._launched + 1)  # verified after its launch
    e, e_after = p.acceptance.expected_tokens(), after.expected_tokens()
    t_spec = 3.0 * e_after / 0.97  # after the probe's verify: 3% behind plain
    assert e / t_spec < 0.95 / 3.0, "before it: further behind than the hysteresis"
    p.set_costs(table(plain={8: 3.0}, spec={8: t_spec}))
    assert p.speculate(8) is False
    put(p, _plain_run=10_000)
    assert p._decide(8) == (True, "probe")
    p.on_launch(True, 8)
    p.on_verify([K] * 8)
    assert p.acceptance.expected_tokens() == pytest.approx(e_after)
    assert p.speculate(8) is False


def test_a_batch_forced_to_speculate_leaves_the_policy_plain():
    """The controller makes grammar batches speculate whatever the policy says: such a
    step is not the policy's choice and must not switch its mode."""
    p = GoodputPolicy(K)
    feed(p, accepted=2, steps=50, batch=16)
    e = p.acceptance.expected_tokens()
    p.set_costs(table(plain={16: 3.0}, spec={16: 3.0 * e / 1.03}))  # within the hysteresis
    put(p, _speculating=False)  # in plain mode
    assert p.speculate(16) is False
    p.on_launch(True, 16)  # forced
    assert p.speculate(16) is False and p._plain_run == 0


def test_proportional_extrapolation_scales_by_the_batch_not_its_bucket():
    assert costs.lookup({8: 0.008}, 9, above="proportional") == pytest.approx(0.009)
    assert costs.lookup({8: 0.008}, 9, above="flat") == 0.008


def test_exploration_asks_for_a_sync_every_few_steps():
    p = GoodputPolicy(K)
    asked = []
    for _ in range(14):
        p.on_launch(p.speculate(4), 4)
        asked.append(p.sync_due())
    assert asked == ([False] * (GoodputPolicy.EXPLORE_SYNC - 1) + [True]) * 2 + [False] * (12 - 2 * 7)
    p.set_costs(table(plain={4: 2.0}, spec={4: 5.0}))
    p.on_launch(p.speculate(4), 4)
    assert not p.sync_due()
    # The controller shares the table then, not only on its schedule.
    shared = []
    c = ctl.AdaptiveModeController(GoodputPolicy(K), spec_width=K + 1, sync_every=32,
                                   share=lambda t: shared.append(t) or t)
    for i in range(16):  # 7 steps exploring speculation (its time filed), 7 exploring plain
        c.on_prepare(c.speculate(4), 4, i)
    assert len(shared) == 2


def test_a_mode_without_a_step_time_near_the_batch_size_is_run_to_measure_it():
    p = GoodputPolicy(K)
    assert p.speculate(4) is True  # nothing measured: speculate first
    p.set_costs(table(plain={}, spec={4: 5.0}))
    assert p.speculate(4) is False  # then plain, to get its time
    p.set_costs(table(plain={4: 2.0}, spec={4: 5.0}))
    assert p.speculate(64) is True  # nothing within a factor 2 of 64
    p.set_costs(table(plain={4: 2.0}, spec={4: 5.0, 64: 20.0}))
    assert p.speculate(64) is False


def test_answers_for_the_same_batch_agree_until_the_state_moves():
    p = GoodputPolicy(K)
    p.set_costs(MEASURED)
    feed(p, accepted=1, steps=30)
    for bs in (1, 5, 24, 77, 128):
        assert len({p.speculate(bs) for _ in range(5)}) == 1


def test_answers_follow_every_verify_and_every_new_table():
    """Answers are kept per batch size until the state moves; a verify result or a
    shared table moves it, whether or not a batch was launched in between."""
    p = GoodputPolicy(K)
    p.set_costs(MEASURED)
    feed(p, accepted=2, steps=50, batch=8)
    put(p)  # no hold: the answer below is worked out, and kept
    assert p.speculate(8) is True
    for _ in range(200):  # the draft stops matching; no launch in between
        p.on_verify([0] * 8)
    assert p.speculate(8) is False
    p = GoodputPolicy(K)
    p.set_costs(MEASURED)
    feed(p, accepted=2, steps=50, batch=8)
    assert p.speculate(8) is True
    p.set_costs(table(plain={8: 2.8}, spec={8: 28.0}))  # speculation ten times dearer
    assert p.speculate(8) is False


def twins(plain_ms: float, spec_ms: float, spec_per_1k: float) -> tuple[GoodputPolicy, GoodputPolicy]:
    """A goodput policy, and its twin that works out every answer (no hold), on one
    table at batch 1: ``spec_per_1k`` ms more a speculative step per 1,000 tokens of
    context, plain's flat."""
    tab = {**table(plain={1: plain_ms}, spec={1: spec_ms}),
           costs.PER_TOKEN: {costs.PLAIN: 0.0, costs.SPEC: spec_per_1k / 1e6}}
    holder, every = GoodputPolicy(K), GoodputPolicy(K)
    every.HOLD_MAX = 0
    for p in (holder, every):
        p.set_costs(tab)
    return holder, every


def bursts(rng: random.Random, chance: float, lengths: tuple, during: tuple, otherwise: tuple):
    """Drafts a step's verify accepts: from ``otherwise``, but with ``chance`` a step a
    burst of ``lengths`` steps (a range) starts in which they come from ``during``."""
    until = [-1]

    def accepted(step: int) -> int:
        if rng.random() < chance:
            until[0] = step + rng.randrange(*lengths)
        choices = during if step < until[0] else otherwise
        return choices[0] if len(choices) == 1 else rng.choice(choices)  # one choice draws nothing
    return accepted


def play_twins(holder: GoodputPolicy, every: GoodputPolicy, rng: random.Random, steps: int, overlap: bool,
               accepted, share_every: int = 32, tag: tuple = ()) -> list:
    """``steps`` batches of one request launched on a holding policy and on its twin that
    works out every answer, asserting the same call at each; ``accepted(step)``: the drafts
    that step's verify accepts. Verifies come one batch late under the overlap scheduler,
    at once without it; now and then a request is replaced by one with a long prompt (its
    prefill counted after the batch, as the controller does); the table is shared every
    ``share_every`` launches. Returns each answer with whether the holder held it."""
    context, in_flight, out = 64, None, []
    for step in range(steps):
        answer = holder._decide(1, context)
        out.append((answer, holder._hold_left > 0))
        assert answer == every._decide(1, context), (*tag, step, context)
        assert holder.speculate(1, context) == answer[0]  # the scheduler's question, held inline
        drafts = accepted(step)
        jumped = rng.random() < 0.01  # a request replaced by one with a long prompt
        for p in (holder, every):
            p.on_launch(answer[0], 1, context)
        verify = [drafts] if answer[0] else None
        if overlap:
            verify, in_flight = in_flight, verify
        if verify is not None:
            for p in (holder, every):
                p.on_verify(verify)
            context += verify[0] + 1
        elif not answer[0]:
            context += 1
        if jumped:
            context = rng.choice((40, 20_000))
            # Asked before its prefill is counted (one batch late under overlap).
            assert holder.speculate(1, context) == every.speculate(1, context), (*tag, step, context)
            for p in (holder, every):
                p.on_prefills(1, answer[0], 1)
        if step % share_every == share_every - 1:  # the controller's share
            for p in (holder, every):
                p.set_costs(p.costs | {costs.PER_TOKEN: p.per_token})
    return out


@pytest.mark.parametrize("overlap", [True, False])
def test_a_held_answer_is_the_answer_worked_out_afresh_whatever_the_verifies_bring(overlap):
    """A hold makes exactly the calls of a policy that works out every batch: the
    acceptance falling to nothing at any launch, the context growing as fast as the
    tokens allow or jumping with a new request, the table shared again."""
    held = 0
    for seed in range(40):
        rng = random.Random(seed)
        holder, every = twins(1.5, rng.uniform(2.8, 4.6), rng.uniform(0.1, 0.6))
        answers = play_twins(holder, every, rng, 500, overlap, bursts(rng, 0.01, (5, 60), (0,), (2, 3, 3)),
                             tag=(seed,))
        held += sum(was_held and answer == (True, "goodput") for answer, was_held in answers)
    assert held > 3000, held  # the holds ran, not only full answers


@pytest.mark.parametrize("overlap", [True, False])
def test_a_held_plain_answer_is_the_answer_worked_out_afresh(overlap):
    """Plain stretches (the users' case) hold their answer too, and make exactly the
    calls of a policy that works out every batch: probes and refreshes on time, stale
    times, a draft that matches again for a while (speculation retaken), the context
    growing or jumping with a new request, the table shared again, or seldom (as while
    the policy is settled)."""
    held = plain = 0
    for seed in range(40):
        rng = random.Random(100 + seed)
        # Up to 8 ms a speculative step: where even every draft accepted would lose, no probe
        # comes, and a stale time's refresh waits for the plain run alone.
        holder, every = twins(1.5, rng.uniform(2.6, 8.0), rng.uniform(0.0, 0.6))
        if seed % 2:  # batch 1's speculative time slower than batch 64's: stale, refreshed now and then
            for p in (holder, every):
                tab = p.costs | {costs.PER_TOKEN: p.per_token}
                p.set_costs(tab | {costs.PLAIN: tab[costs.PLAIN] | {64: 0.0025},
                                   costs.SPEC: tab[costs.SPEC] | {64: 0.0024}})
        # Now and then the draft matches well for a while.
        accepted = bursts(rng, 0.005, (20, 200), (2, 3, 3), (0, 0, 0, 1))
        answers = play_twins(holder, every, rng, 1500, overlap, accepted, share_every=(32, 256)[seed % 4 < 2],
                             tag=(seed,))
        plain += sum(not answer[0] for answer, _ in answers)
        held += sum(was_held and answer == (False, "goodput") for answer, was_held in answers)
    assert plain > 30000 and held > 0.7 * plain, (plain, held)  # plain stretches, mostly held


def test_a_plain_hold_ends_where_a_stale_times_refresh_falls_due():
    """Where even every draft accepted would lose, no probe comes; a stale speculative
    time (slower than a larger batch's) already refreshed once is refreshed again after
    REFRESH_STEPS probe intervals of plain steps. A hold offered just before must not
    run past it."""
    holder, every = twins(1.5, 8.0, 0.0)
    for p in (holder, every):
        p.set_costs(p.costs | {costs.PLAIN: {1: 0.0015, 64: 0.0025}, costs.SPEC: {1: 0.008, 64: 0.0024}})
        feed(p, accepted=0, steps=20, batch=1)
        interval = p.probe_interval(0.0015, 0.008)
        put(p, _speculating=False, _refreshed={1}, _plain_run=GoodputPolicy.REFRESH_STEPS * interval - 10,
            _stretch_unchecked=False)
    answers, held = [], 0
    for step in range(40):
        answer = holder._decide(1, 100 + step)
        assert answer == every._decide(1, 100 + step), step
        answers.append(answer)
        for p in (holder, every):
            p.on_launch(answer[0], 1, 100 + step)
        held = max(held, holder._hold_left)
    assert answers[:10] == [(False, "goodput")] * 10 and answers[10] == (True, "refresh"), answers[:12]
    assert held >= 4, "a shorter hold came before the refresh"


def test_steady_speculation_works_out_few_answers_and_counts_every_launch():
    """At c=1 with speculation well ahead, a hold spans the launches between two
    shares of the table; the reason counters still count each batch."""
    p = GoodputPolicy(K)
    p.set_costs(table(plain={1: 1.5}, spec={1: 3.1}))
    feed(p, accepted=2, steps=50, batch=1)
    before = dict(p.reason_counts())
    answers, answer = [0], p._answer

    def counted(batch_size, context):
        answers[0] += 1
        return answer(batch_size, context)

    p._answer = counted
    rng = random.Random(0)
    for step in range(3200):
        assert p.speculate(1, step) is True
        p.on_launch(True, 1, step)
        p.on_verify([rng.choice((1, 2, 3))])
        p.on_prefills(0, True, 1)
        if step % 32 == 31:
            p.set_costs(p.costs)
    assert answers[0] <= 3200 // 32 + 10, answers
    assert p.reason_counts() == {**before, (True, "goodput"): before[True, "goodput"] + 3200}


def test_a_hold_ends_at_another_batch_size_a_plain_launch_a_prefill_or_a_new_table():
    p = GoodputPolicy(K)
    p.set_costs(table(plain={1: 1.5, 2: 1.6}, spec={1: 3.1, 2: 3.3}))
    feed(p, accepted=2, steps=50, batch=1)
    ends = {"size": lambda: p.on_launch(True, 2), "plain": lambda: p.on_launch(False, 1),
            "prefill": lambda: p.on_prefills(1, True, 1), "table": lambda: p.set_costs(p.costs),
            "verifies": lambda: [p.on_verify([2]) for _ in range(p._hold_verifies + 1)]}
    for name, end in ends.items():
        p.speculate(1)
        p.on_launch(True, 1)
        assert p._hold_left > 1, name
        end()
        assert not (p._hold_left and p._held(1, 0)), name  # another size may hold its own


def test_make_policy_builds_goodput_with_the_draft_step_count():
    p = make_policy(PolicyConfig(policy="goodput"), num_steps=5)
    assert isinstance(p, GoodputPolicy) and p.acceptance.k == 5
    assert "goodput" in p.describe()


# -- controller: timing, sharing, dumping ----------------------------------------------


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_controller_files_clean_intervals_only_and_shares_the_table_on_a_schedule(tmp_path):
    clock, shared = Clock(), []
    path = tmp_path / "costs.json"

    def share(t):
        shared.append(t)
        return {costs.PLAIN: {8: 0.003}, costs.SPEC: {8: 0.006}}  # "rank 0's" table

    policy = GoodputPolicy(K)
    c = ctl.AdaptiveModeController(policy, spec_width=K + 1, share=share, sync_every=10,
                                   cost_table_path=str(path), clock=clock)
    c.costs = costs.StepCosts(min_samples=1)
    it = 100
    for step in range(10):
        # A prefill launched between decode batches 3 and 4: the forward count (the
        # running batch's at its previous launch) jumps by 2 at prepare 5.
        it += 2 if step == 5 else 1
        clock.t += (step + 1) / 1e3  # the interval ending at prepare s lasts s + 1 ms
        c.on_prepare(False, 8, it)
    local = sorted(round(1e3 * t) for t in c.costs._samples[(costs.PLAIN, 8)])
    # 9 intervals between 10 prepares; not filed: the first (no batch before it), 3-4
    # (the waits for batches 2 and 3), 4-5 (the wait for the prefill), 8-9 (pending).
    assert local == [3, 4, 7, 8, 9], local
    assert shared and policy.costs == {**{mode: {} for mode in costs.MODES},
                                       costs.PLAIN: {8: 0.003}, costs.SPEC: {8: 0.006}}
    doc = json.loads(path.read_text())
    assert doc["seconds_per_step"]["plain"] == {"8": 0.003} and len(doc["acceptance_per_position"]) == K
    assert doc["seconds_per_probe_window"] == {}
    assert doc["seconds_per_prefill_batch"] == {"plain": {}, "spec": {}}
    # One prefill seen after 10 plain steps of 8 tokens.
    rate = doc["prefill_batches_per_step"]
    assert rate["batches_per_event"] == 1.0 and 0.005 < rate["per_token_end_rate"] < 0.02, rate
    assert ctl.format_costs({costs.PLAIN: {8: 0.003}, costs.SPEC: {}, costs.PROBE: {8: 0.021}}) == (
        "plain 8:3.00; spec ; probe 8:21.00")


def test_a_lone_probe_files_no_speculative_time_and_spoils_no_plain_one():
    """Under overlap the interval after a batch's prepare holds the wait for the batch
    before it: an interval counts only between two batches of the same mode."""
    clock = Clock()
    c = ctl.AdaptiveModeController(GoodputPolicy(K), spec_width=K + 1, clock=clock)
    c.costs = costs.StepCosts(min_samples=1)
    modes = [False] * 10 + [True] + [False] * 10 + [True] * 6 + [False] * 3
    for it, spec in enumerate(modes):
        # The interval that ends here holds the GPU step of the batch two prepares back.
        clock.t += (0.020 if modes[it - 2] else 0.005) if it >= 2 else 0.001
        c.on_prepare(spec, 64, it)
    plain = list(c.costs._samples[(costs.PLAIN, 64)])
    spec = list(c.costs._samples[(costs.SPEC, 64)])
    # Filed: the interval after prepare k (k >= 1, filed two prepares later) where
    # batches k - 1 and k ran the same mode. The probe at 10 gives none; nor do the
    # intervals right after a switch.
    filed = [modes[k] for k in range(1, len(modes) - 2) if modes[k - 1] == modes[k]]
    assert len(spec) == filed.count(True) == 5 and len(plain) == filed.count(False)
    assert all(abs(t - 0.005) < 1e-9 for t in plain), plain
    assert all(abs(t - 0.020) < 1e-9 for t in spec), spec


def test_a_lone_probe_files_its_window_with_both_switches():
    """The probe's own interval holds its speculative step and the draft pass that
    resumes the draft; the next holds the first plain step after it. Both are dearer
    than the table's steady steps, and only the window shows it."""
    clock = Clock()
    c = ctl.AdaptiveModeController(GoodputPolicy(K), spec_width=K + 1, clock=clock)
    c.costs = costs.StepCosts(min_samples=1)
    # Lone probes at 10 and 30 (the one at 30 with a prefill right after the plain step
    # that follows it), a speculative run at 50-55, and a probe at 70 too close to the end.
    modes = [False] * 73
    for k in (10, 30, 50, 51, 52, 53, 54, 55, 70):
        modes[k] = True
    gpu = [0.005] * 73
    gpu[10] = gpu[30] = 0.016   # the probe and the draft pass before it
    gpu[11] = gpu[31] = 0.007   # the first plain step after speculation
    it = 0
    for k, spec in enumerate(modes):
        it += 2 if k == 33 else 1
        # The interval that ends here holds the GPU step of the batch two prepares back.
        clock.t += gpu[k - 2] if k >= 2 else 0.001
        c.on_prepare(spec, 32, it)
    windows = list(c.costs._samples[(costs.PROBE, 32)])
    assert windows == [pytest.approx(0.005 + 0.016 + 0.007)], windows
    assert c.costs.table()[costs.PROBE] == {32: pytest.approx(0.028)}
    # The steady step's median does not move.
    assert c.costs.table()[costs.PLAIN] == {32: pytest.approx(0.005)}


def test_a_measured_probe_window_spaces_the_probes_to_the_budget():
    """8B pair at batch 32 (session 14): a speculative step is 2.1 plain steps, but a
    window of ten steps with a probe took 11.8: the switches cost 0.7 plain steps more
    than the table's speculative step. Probes every 110 steps cost 1.6% of the time."""
    t_plain, t_spec = 5.9e-3, 12.33e-3
    t_window = 3 * t_plain + 1.8 * t_plain
    p = GoodputPolicy(K, probe_every=100, probe_budget=0.01)
    assert p.probe_interval(t_plain, t_spec) == 109
    assert p.probe_interval(t_plain, t_spec, t_window) == 180
    # A window can only add: the speculative step alone is the floor.
    assert p.probe_interval(t_plain, t_spec, 3 * t_plain) == 109
    p.set_costs({costs.PLAIN: {32: t_plain}, costs.SPEC: {32: t_spec}, costs.PROBE: {32: t_window}})
    feed(p, accepted=0, steps=20, batch=32)  # plain pays: about 1 token a step
    steps = 9000
    probes = serve(p, batch=32, steps=steps, accepted=0)
    overhead = probes * (t_window - 3 * t_plain) / (steps * t_plain)
    assert probes >= 40 and overhead <= 0.0101, (probes, overhead)
    # The table far from this batch size says nothing about its probes.
    p.set_costs({costs.PLAIN: {32: t_plain}, costs.SPEC: {32: t_spec}, costs.PROBE: {128: 1.0}})
    put(p, _plain_run=110)
    assert p._decide(32) == (True, "probe")


def test_the_decision_log_writes_each_decode_batch_as_the_policy_decided_it(tmp_path, monkeypatch):
    """One line per decode batch with the mode it ran in and the policy's own account,
    taken before the policy hears of the launch (its answer for that batch, not the
    next one's). Off without the variable, and on rank 0 only."""
    monkeypatch.delenv(decisions.ENV, raising=False)
    assert type(decisions.make_decision_log(True)) is decisions.NoDecisionLog
    path = tmp_path / "decisions.jsonl"
    monkeypatch.setenv(decisions.ENV, str(path))
    assert type(decisions.make_decision_log(False)) is decisions.NoDecisionLog
    policy = GoodputPolicy(K)
    # Grammar batches speculate whatever the policy says (plain_grammar off): the log
    # keeps the mode run and the policy's answer apart.
    c = ctl.AdaptiveModeController(policy, spec_width=K + 1, clock=Clock(), plain_grammar=False,
                                   decisions=decisions.make_decision_log(True))
    policy.set_costs(MEASURED)
    feed(policy, accepted=2, steps=50)  # ~3 tokens a step: speculation leads at batch 1
    expected = []
    for it, (batch, grammar) in enumerate([(1, False), (128, True), (128, False), (1, False)], 1):
        policy._answers.clear()
        wanted = policy.speculate(batch)
        ran = c.speculate(batch, has_grammar=grammar)
        c.on_prepare(ran, batch, it)
        expected.append((batch, ran, wanted))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["batch_size"], x["speculative"], x["decided"]) for x in lines] == expected
    assert [x["batch"] for x in lines] == [0, 1, 2, 3]
    # A batch of 128 runs plain (3 tokens / 24 ms < 1 / 5.3 ms), unless its grammar forces speculation.
    assert expected[1:3] == [(128, True, False), (128, False, False)]
    assert lines[0]["why"] == "goodput" and lines[0]["spec_tps"] > lines[0]["plain_tps"]
    assert lines[2]["spec_tps"] < lines[2]["plain_tps"]
    assert 2.9 < lines[0]["expected_tokens"] < 3.1
    # A probe: plain at batch 1 with acceptance gone, due after a long plain run. Once the
    # policy has heard of it the run restarts and its answer would read plain.
    feed(policy, accepted=0, steps=200)
    put(policy, _speculating=False, _plain_run=10**6)
    assert c.speculate(1)
    c.on_prepare(True, 1, 5)
    probe = json.loads(path.read_text().splitlines()[-1])
    assert (probe["decided"], probe["why"], probe["plain_run"]) == (True, "probe", 10**6)
    assert probe["spec_tps"] < probe["plain_tps"] and not policy.speculate(1)
    # A mode with no step time yet: the policy explores, with nothing to predict from.
    fresh = GoodputPolicy(K).explain(8)
    assert fresh["why"] == "explore" and fresh["decided"] and "spec_tps" not in fresh


def test_controller_passes_verify_results_to_the_policy():
    policy = GoodputPolicy(K)
    c = ctl.AdaptiveModeController(policy, spec_width=K + 1)
    before = policy.acceptance.expected_tokens()
    c.on_verify([K] * 64)
    assert policy.acceptance.expected_tokens() > before
    ctl.ModeController().on_verify([1])  # upstream's controller ignores it


def test_policies_that_do_not_read_costs_never_share_them(tmp_path):
    from sglang_adaptive.policy import ThresholdPolicy

    shared = []
    c = ctl.AdaptiveModeController(ThresholdPolicy(8), spec_width=K + 1, share=shared.append, sync_every=2)
    for i in range(10):
        c.on_prepare(c.speculate(4), 4, i)
    assert shared == []  # no collective for the threshold policy
    c = ctl.AdaptiveModeController(ThresholdPolicy(8), spec_width=K + 1, share=lambda t: shared.append(t) or t,
                                   sync_every=2, cost_table_path=str(tmp_path / "costs.json"))
    for i in range(4):
        c.on_prepare(True, 4, i)
    assert len(shared) == 2  # keeping the table on disk still syncs it
    assert json.loads((tmp_path / "costs.json").read_text())["policy"].startswith("threshold")


def test_the_cost_table_file_is_rewritten_once_a_second_or_when_a_bucket_comes(tmp_path, monkeypatch):
    """A write costs about 0.45 ms: at every sync (32 batches) half a percent of a tiny
    pair's speculative step."""
    clock, writes = Clock(), []
    monkeypatch.setattr(ctl, "write_cost_table", lambda path, table, policy: writes.append(
        (clock.t, sorted(b for v in table.values() for b in v))))
    tables = iter([{costs.PLAIN: {8: 0.003}}] * 3 + [{costs.PLAIN: {8: 0.003, 16: 0.004}}] * 9)
    c = ctl.AdaptiveModeController(GoodputPolicy(K), spec_width=K + 1, share=lambda t: next(tables),
                                   sync_every=2, sync_max_every=2, cost_table_path=str(tmp_path / "costs.json"),
                                   clock=clock)
    for i in range(24):  # a sync every second prepare, 0.2 s apart: 12 syncs over 4.6 s
        c.on_prepare(False, 8, i)
        clock.t += 0.2
    # The first sync, the bucket that came at the fourth, then one a second.
    assert writes == [(pytest.approx(0.2), [8]), (pytest.approx(1.4), [8, 16]), (pytest.approx(2.6), [8, 16]),
                      (pytest.approx(3.8), [8, 16])], writes


def test_a_cost_table_path_that_is_not_a_regular_file_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    ctl.write_cost_table(str(fifo), {costs.PLAIN: {1: 0.002}, costs.SPEC: {}}, GoodputPolicy(K))
    reader.join(timeout=10)
    assert json.loads(got[0])["seconds_per_step"]["plain"] == {"1": 0.002}
    assert fifo.is_fifo(), "the pipe must not be replaced by a regular file"


def serve_at_one(c: ctl.AdaptiveModeController, batches: int, accepted: int = K, syncs: list | None = None,
                 start: int = 0) -> list:
    """``batches`` decode batches of one request as the controller decides them, each
    speculative one verified with ``accepted`` drafts; the batch count at each share."""
    syncs = [] if syncs is None else syncs
    sync = c.sync

    def counted():
        syncs.append(c.stats.spec_batches + c.stats.plain_batches)
        sync()
    c.sync = counted
    for it in range(start, start + batches):
        context = 64 + 4 * (it % 40)
        spec = c.speculate(1, context=context)
        c.on_prepare(spec, 1, it, context)
        if spec:
            c.on_verify([accepted])
    c.sync = sync
    return syncs


def steady_at_one(**kwargs) -> ctl.AdaptiveModeController:
    """Speculation at batch 1 clearly ahead of plain, the shared table fixed."""
    shared = table(plain={1: 1.5}, spec={1: 2.5})
    return ctl.AdaptiveModeController(GoodputPolicy(K), spec_width=K + 1, share=lambda t: shared, **kwargs)


def test_a_settled_policy_on_a_steady_table_is_shared_less_often():
    """At batch 1 on the tiny pair each share (a table, the policy's derived state, and
    the end of its held answer) was a sixth of what goodput adds to a batch."""
    c = steady_at_one(sync_every=32)
    syncs = serve_at_one(c, 1200)
    assert c.policy.settled() and c.stats.plain_batches == 0
    # The first share when the first steps asked for one (an exploration: no table yet).
    assert [b - a for a, b in zip(syncs, syncs[1:])] == [32, 64, 128, 256, 256, 256], syncs
    # A steady table alone is not enough: a policy that does not hold its answer (here
    # with plain's prefill price measured and speculation's not) is shared the regular way.
    shared = {**table(plain={1: 1.5}, spec={1: 2.5}), costs.PLAIN_PREFILL: {1: 0.01}}
    c = ctl.AdaptiveModeController(GoodputPolicy(K), spec_width=K + 1, share=lambda t: shared, sync_every=32)
    syncs = serve_at_one(c, 600)
    assert c.stats.spec_batches > 580 and not c.policy.settled()
    assert {b - a for a, b in zip(syncs[-8:], syncs[-7:])} == {32}, syncs


def test_a_moved_table_or_a_switch_shares_at_the_regular_interval_again():
    tables = [table(plain={1: 1.5}, spec={1: 2.5})]
    c = ctl.AdaptiveModeController(GoodputPolicy(K), spec_width=K + 1, share=lambda t: tables[-1], sync_every=32)
    syncs = serve_at_one(c, 500)
    assert c._sync_wait == 256, syncs
    tables.append(table(plain={1: 1.5}, spec={1: 2.5 * 1.04}))  # within 5%: steady
    serve_at_one(c, 300, syncs=syncs, start=500)
    assert c._sync_wait == 256
    tables.append(table(plain={1: 1.5}, spec={1: 2.5 * 1.04 * 1.06}))  # moved
    n = len(syncs)
    serve_at_one(c, 300, syncs=syncs, start=800)
    assert syncs[n + 1] - syncs[n] == 32, syncs[n:]
    tables.append(table(plain={1: 1.5, 8: 2.0}, spec={1: 2.65}))  # a bucket came
    serve_at_one(c, 400, syncs=syncs, start=1100)
    n = len(syncs)
    serve_at_one(c, 1, syncs=syncs, start=1500)
    assert c._sync_wait == 256
    tables.append(table(plain={1: 1.5}, spec={1: 2.65}))  # and went
    serve_at_one(c, 300, syncs=syncs, start=1501)
    assert syncs[n + 1] - syncs[n] == 32, syncs[n:]
    # A switch: the mode switched to files its steps now.
    serve_at_one(c, 500, syncs=syncs, start=1801)
    assert c._sync_wait == 256
    total = c.stats.spec_batches + c.stats.plain_batches
    c.on_prepare(False, 1, 2301, 64)
    n = len(syncs)
    serve_at_one(c, 40, syncs=syncs, start=2302)
    assert syncs[n:] and syncs[n] <= total + 1 + 32, (total, syncs[n:])


def test_ranks_that_time_their_steps_apart_join_the_same_syncs_as_the_wait_grows():
    """Each rank files its own step times; the wait for the next share is decided from
    the shared table, the policy and the batch count only, so every rank joins the same
    collectives (a rank that skipped one would hang the others)."""
    shared, syncs, ranks = [], {0: [], 1: []}, []

    def share_of(rank):
        def share(local):
            syncs[rank].append(ranks[rank][0].stats.spec_batches + ranks[rank][0].stats.plain_batches)
            if rank == 0:
                shared.append(local)
            return shared[-1]  # rank 0's, as the broadcast hands it to every rank
        return share

    for r in (0, 1):
        clock = Clock()
        ranks.append((ctl.AdaptiveModeController(GoodputPolicy(K), spec_width=K + 1, share=share_of(r), clock=clock),
                      clock))
    rng = random.Random(3)
    for it in range(3000):
        context = 64 + 4 * (it % 40)
        accepted = rng.choice((0, 1, 2, K, K, K)) if it < 2000 else 0  # then acceptance collapses
        modes = []
        for c, clock in ranks:  # rank 0 first, as its broadcast must come before the others read it
            modes.append(c.speculate(1, context=context))
            clock.t += (0.0025 if modes[-1] else 0.0015) * rng.uniform(0.7, 1.3)
            c.on_prepare(modes[-1], 1, it, context)
            if modes[-1]:
                c.on_verify([accepted])
        assert modes[0] == modes[1], it
    assert syncs[0] == syncs[1]
    waits = [b - a for a, b in zip(syncs[0], syncs[0][1:])]
    assert max(waits) == 256 and min(waits) <= 32, waits
    assert ranks[0][0].stats.plain_batches > 100, "the collapse turned the policy plain"
    assert ranks[0][0].costs.table() != ranks[1][0].costs.table(), "the ranks' own samples differ"


def test_every_rank_joins_the_same_syncs_and_only_rank_0_writes_the_table(tmp_path):
    """The sync is a collective: a rank that skipped one would hang the others."""
    from sglang_adaptive.policy import ThresholdPolicy

    path = tmp_path / "costs.json"
    calls = {0: 0, 1: 0}

    def share_of(rank):
        def share(table):
            calls[rank] += 1
            return table
        return share

    ranks = [ctl.AdaptiveModeController(ThresholdPolicy(8), spec_width=K + 1, share=share_of(r), sync_every=4,
                                        cost_table_path=str(path), writes_table=r == 0) for r in (0, 1)]
    for i in range(12):
        for c in ranks:
            c.on_prepare(True, 4, i)
    assert calls == {0: 3, 1: 3}
    assert path.exists() and [p.name for p in tmp_path.iterdir()] == ["costs.json"]


def refresh_steps(p: GoodputPolicy, accepted: int) -> tuple[list, list, list]:
    """A refresh's steps at batch 1 and the step after: the modes, whether each asked
    for a sync, and every bucket it gave the controller to drop."""
    modes, syncs, dropped = [], [], []
    for _ in range(GoodputPolicy.REFRESH_STEPS + 1):
        modes.append(p.speculate(1))
        p.on_launch(modes[-1], 1)
        syncs.append(p.sync_due())
        dropped += p.stale_buckets()
        if modes[-1]:
            p.on_verify([accepted])
    return modes, syncs, dropped


def test_the_first_probe_where_speculation_was_only_explored_re_measures_its_step_time():
    p = GoodputPolicy(K, probe_every=100)
    # Speculation at batch 1 measured (by exploration) at 7 ms: worse than plain.
    p.set_costs(table(plain={1: 2.1, 4: 2.2}, spec={1: 7.0, 4: 3.3}))
    feed(p, accepted=2, steps=30, batch=4)  # about 2.9 tokens a step, speculating at 4
    assert p._speculating is True and p._slower[costs.SPEC] == {1}, "speculating at 4; 1 is stale"
    put(p, _speculating=False, _plain_run=10_000)
    assert p._decide(1) == (True, "refresh")
    modes, syncs, dropped = refresh_steps(p, accepted=2)
    assert dropped == [(costs.SPEC, 1, REFRESH_STALE)], "dropped once"
    assert modes == [True] * GoodputPolicy.REFRESH_STEPS + [False], "a refresh, then plain on the old table"
    assert syncs.index(True) == GoodputPolicy.REFRESH_STEPS - 1, "the fresh samples are shared after it"
    p.set_costs(table(plain={1: 2.1, 4: 2.2}, spec={1: 3.2, 4: 3.3}))
    assert p.speculate(1) is True, "the fresh time shows speculation paying"
    # Stale again: the next probe due there is a lone step, and a refresh comes only
    # after REFRESH_STEPS probe intervals, within the probe budget.
    p.set_costs(table(plain={1: 2.1, 4: 2.2}, spec={1: 7.0, 4: 3.3}))
    interval = p.probe_interval(2.1e-3, 7.0e-3)
    put(p, _speculating=False, _plain_run=interval)
    assert p._decide(1) == (True, "probe")
    put(p, _plain_run=GoodputPolicy.REFRESH_STEPS * interval - 1)
    assert p._decide(1) == (True, "probe")
    put(p, _plain_run=GoodputPolicy.REFRESH_STEPS * interval)
    assert p._decide(1) == (True, "refresh")


TINY_C1 = table(plain={1: 1.5}, spec={1: 3.63})  # the tiny pair at batch 1 (H100, 2026-12-07)
# Drafts accepted per verify at batch 1: 2 on average (3 tokens a step, speculation ahead
# by about a fifth), one request's verify at a time, so a lone probe may see 0 or 1.
NOISY = [3, 0, 3, 2, 1, 3, 3, 0, 3, 2]


def stretch(p: GoodputPolicy, steps: int, draws: list) -> tuple[list, list, list]:
    """``steps`` decode batches at batch 1 as the policy decides them, each speculative
    one verified with the next of ``draws`` (cycled); returns (mode, why) per batch,
    what each batch gave the controller to drop, and the batches that began a check the
    call being close would not have brought (a close call's refresh checks a stretch too)."""
    out, dropped, checks, verifies = [], [], [], 0
    for i in range(steps):
        decided = p._decide(1)
        checked_at, explained = p._checked_at, p.explain(1)
        close = explained["spec_tps"] >= explained["plain_tps"] * (1 - p.hysteresis)
        p.on_launch(decided[0], 1)
        if p._checked_at != checked_at and not close:
            checks.append(i)
        dropped.append(p.stale_buckets())
        if decided[0]:
            p.on_verify([draws[verifies % len(draws)]])
            verifies += 1
        out.append(decided)
    return out, dropped, checks


def test_a_plain_stretch_entered_on_a_few_poor_verifies_is_checked_by_a_refresh():
    """The tiny pair at c=1 (H100, 2026-12-07): the first requests accepted 2.1-2.8
    tokens a step, the policy left speculation, and lone probes (one request's verify
    each, aged away by the next) kept it plain for about 900 batches where speculation
    paid a fifth. The stretch's first probe due is a refresh, at the shortest interval."""
    p = GoodputPolicy(K, probe_every=100, half_life=64)
    p.set_costs(TINY_C1)
    feed(p, accepted=1, steps=40, batch=1)  # poor early requests: 2 tokens a step
    put(p, _speculating=True)
    assert p._decide(1) == (False, "goodput")
    modes, dropped, checks = stretch(p, 1000, NOISY)
    first = next(i for i, (m, _) in enumerate(modes) if m)
    assert first == 100 and modes[first] == (True, "refresh") and checks[0] == first, (first, modes[first])
    assert all(why == "goodput" for _, why in modes[:first]), "plain by the comparison until then"
    assert not any(dropped[first:first + GoodputPolicy.REFRESH_STEPS]), "the check adds samples, drops none"
    # Lone probes every 142 steps brought it back at about batch 570 (43% speculative).
    back = next(i for i in range(len(modes)) if all(m for m, _ in modes[i:i + 20]))
    assert back <= 300 and sum(m for m, _ in modes) >= 0.7 * len(modes), back


def test_a_plain_stretch_entered_after_the_explorations_is_checked_by_a_refresh():
    """The tiny pair at c=1 (H100, 2026-12-07): the warm-up's speculative steps at batch
    1 filed 4.3 ms against 3.1 steady, and after the two explorations the policy went
    plain on that time, for 40% of the batches (0.85x static EAGLE-3); lone probes file
    no step time. The stretch's first probe due is a refresh, whose steps join the
    bucket's samples."""
    p = GoodputPolicy(K, probe_every=100, half_life=64)
    assert p._decide(1) == (True, "explore")
    for accepted in [1, 2, 1, 0, 2, 1, 2][:GoodputPolicy.EXPLORE_SYNC]:
        p.on_launch(True, 1)
        p.on_verify([accepted])
    p.set_costs(table(plain={}, spec={1: 4.3}))
    assert p._decide(1) == (False, "explore")
    for _ in range(GoodputPolicy.EXPLORE_SYNC):
        p.on_launch(False, 1)
    p.set_costs(table(plain={1: 1.68}, spec={1: 4.3}))
    assert p._decide(1) == (False, "goodput")
    modes, dropped, checks = stretch(p, 200, NOISY)
    first = next(i for i, (m, _) in enumerate(modes) if m)
    # The plain run counts the plain exploration's steps too.
    assert first + GoodputPolicy.EXPLORE_SYNC == 100 and modes[first] == (True, "refresh") and checks == [first], \
        (first, checks)
    assert not any(dropped), "its steps join the bucket's samples"


def test_a_stretch_check_stays_within_the_probe_budget():
    """Where plain leads, a check that the estimate's noise puts ahead starts a short
    speculative run, and the stretch after it is unchecked again: it is checked only
    REFRESH_STEPS probe intervals after the last check, as a stale time's later
    refreshes are; the probes due before that stay lone steps."""
    p = GoodputPolicy(K, probe_every=100, half_life=64)
    p.set_costs(table(plain={1: 1.5}, spec={1: 5.2}))  # 3 tokens: behind plain by an eighth
    feed(p, accepted=2, steps=40, batch=1)
    interval = p.probe_interval(1.5e-3, 5.2e-3)
    checks, spec = [], 0
    for _ in range(12):  # each time a short speculative run, then a stretch of 400 batches
        put(p, _speculating=True)
        base = p._launched
        modes, _, at = stretch(p, 400, NOISY)
        checks += [base + i for i in at]
        spec += sum(m for m, _ in modes)
        assert all(why in ("goodput", "probe", "refresh") for _, why in modes)
    assert len(checks) >= 2 and all(b - a >= GoodputPolicy.REFRESH_STEPS * interval
                                    for a, b in zip(checks, checks[1:])), (checks, interval)
    assert len(checks) <= 1 + 12 * 400 // (GoodputPolicy.REFRESH_STEPS * interval) + 1, checks
    assert spec * (5.2 - 1.5) / (12 * 400 * 1.5) <= 0.05, spec


def test_no_refresh_where_speculative_times_grow_with_the_batch():
    """The 8B pair's table: each speculative time at most the next larger batch's, so
    none looks stale and a probe stays one step (a refresh costs 6 more speculative
    steps: at acceptance 1.3 and c=64 about 1.5% of the bench's run, by this table)."""
    p = GoodputPolicy(K, probe_every=100)
    p.set_costs(table(plain={32: 5.9, 64: 6.9}, spec={32: 14.7, 64: 26.2}))
    put(p, _speculating=False, _plain_run=10_000)
    assert p._decide(32) == (True, "probe") and p._decide(64) == (True, "probe")
    p.set_costs(table(plain={32: 5.9, 64: 6.9}, spec={32: 20.0, 64: 18.0}))
    assert p._decide(32) == (True, "refresh") and p._decide(64) == (True, "probe")
    # Slower than any larger bucket, not only the next one.
    assert GoodputPolicy._slower_than_larger({1: 5.0, 8: 6.0, 16: 4.0, 32: 7.0}) == {1, 8}


def test_while_speculating_a_stale_plain_time_is_measured_again_once():
    """The users' case turned round: plain pays at batch 1 (2.5 ms against 5.5 ms for 2
    tokens), but the table's plain time there was measured once at 6 ms, slower than at
    batch 8; no probe runs plain steps while speculating, so it would stand for good."""
    p = GoodputPolicy(K)
    stale = table(plain={1: 6.0, 8: 2.8}, spec={1: 5.5, 8: 5.6})
    p.set_costs(stale)
    feed(p, accepted=1, steps=30, batch=1)  # 2 tokens a step
    put(p, _speculating=True)
    assert p._decide(1) == (False, "refresh")
    modes, syncs, dropped = refresh_steps(p, accepted=1)
    assert dropped == [(costs.PLAIN, 1, REFRESH_STALE)], "dropped once"
    assert modes == [False] * GoodputPolicy.REFRESH_STEPS + [True], "a refresh, then the old table's answer"
    assert syncs.index(True) == GoodputPolicy.REFRESH_STEPS - 1, "the fresh samples are shared after it"
    assert p._speculating is True, "a refresh does not set the mode"
    p.set_costs(table(plain={1: 2.5, 8: 2.8}, spec={1: 5.5, 8: 5.6}))
    assert p.speculate(1) is False, "the fresh time shows plain paying"
    # Once per bucket.
    put(p, _speculating=True)
    p.set_costs(stale)
    assert p._decide(1) == (True, "goodput")
    # None where the plain times grow with the batch.
    q = GoodputPolicy(K)
    q.set_costs(table(plain={1: 6.0, 8: 6.5}, spec={1: 5.5, 8: 5.6}))
    feed(q, accepted=1, steps=30, batch=1)
    put(q, _speculating=True)
    assert q._decide(1) == (True, "goodput")


# -- prefill batches between decode steps ------------------------------------------------


def test_prefill_batches_per_step_grow_with_the_tokens_a_step_makes():
    rate = PrefillRate()
    assert rate.rate() == 0.0 and rate.per_step(224) == 0.0, "no prefill seen: decode steps alone"
    for i in range(2000):  # plain steps of 64 requests, a prefill batch after every fifth
        rate.update(int(i % 5 == 4), 64)
    # q = -ln(1 - 0.2) / 64; a speculative step of 3.5 tokens a request makes 224.
    assert rate.per_step(64) == pytest.approx(0.2, rel=0.02)
    assert rate.per_step(224) == pytest.approx(-math.expm1(-224 * math.log(1 / 0.8) / 64), rel=0.02)
    assert 0.53 < rate.per_step(224) < 0.56  # the spread run measured 0.546 (model 0.547)
    chunked = PrefillRate()
    for i in range(2000):  # the same events, each a prompt in two chunks
        chunked.update(2 * int(i % 5 == 4), 64)
    assert chunked.per_step(224) == pytest.approx(2 * rate.per_step(224))
    assert chunked.describe()["batches_per_event"] == pytest.approx(2.0)
    always = PrefillRate()
    for _ in range(100):
        always.update(1, 64)
    assert math.isfinite(always.rate()) and always.per_step(64) == pytest.approx(0.95)


class Recording(GoodputPolicy):
    def __init__(self):
        super().__init__(K)
        self.told = []

    def on_prefills(self, batches, speculative, batch_size):
        self.told.append((batches, speculative, batch_size))
        super().on_prefills(batches, speculative, batch_size)


def test_the_controller_files_what_a_prefill_batch_adds_and_tells_the_policy_after_which_step():
    """Decode steps of 6 ms under the overlap scheduler; two prefill batches of 19 ms in a
    row launched after step 10. The forward count at a prepare is the running batch's at
    its previous launch, so the gap shows at step 12's prepare; step 13's shows nothing
    else ran between 11 and 12. Steps 11 and 12 start late by the prefills' time."""
    clock, policy = Clock(), Recording()
    c = ctl.AdaptiveModeController(policy, spec_width=K + 1, clock=clock)
    forward, launched = 0, None
    for step in range(20):
        if step in (11, 12):  # the intervals that hold the prefills (one batch late)
            clock.t += 0.019
        clock.t += 0.006
        c.on_prepare(False, 64, launched)
        forward += 1
        launched = forward
        if step == 10:
            forward += 2
    assert policy.told[step - 2] == (0, False, 64)
    gaps = [i for i, told in enumerate(policy.told) if told[0]]
    assert gaps == [12 - 2] and policy.told[gaps[0]] == (2, False, 64), policy.told
    assert c.costs.table()[costs.PLAIN_PREFILL] == {}, "one sample is below MIN_SAMPLES"
    assert list(c.costs._samples[(costs.PLAIN_PREFILL, 64)]) == [pytest.approx(0.019)]
    assert not c.costs._samples.get((costs.SPEC_PREFILL, 64))
    c.on_prepare(False, 64, launched)
    c.on_prepare(False, 64, launched)  # prepared again without a launch in between
    assert [t[0] for t in policy.told[-2:]] == [0, 0] and policy.prefills._batches >= 0


def test_a_prefill_next_to_a_switch_or_another_prefill_files_nothing():
    # A speculative step at 8 makes 9 the first plain step, which pays the switch back
    # and whose GPU time the interval holding the prefill includes.
    for spec_at, second_prefill_after in ((8, None), (9, None), (11, None), (None, 11)):
        clock, policy = Clock(), Recording()
        c = ctl.AdaptiveModeController(policy, spec_width=K + 1, clock=clock)
        forward, launched = 0, None
        for step in range(20):
            clock.t += 0.006 if step not in (11, 12, 13) else 0.025
            c.on_prepare(step == spec_at, 64, launched)
            forward += 1
            launched = forward
            if step in (10, second_prefill_after):
                forward += 1
        assert not c.costs._samples.get((costs.PLAIN_PREFILL, 64)), (spec_at, second_prefill_after)


def test_a_wait_with_nothing_to_run_is_no_prefill_price_nor_step_time():
    """A load that pauses: the scheduler idles 2 s (``on_idle``) before a new request's
    prefill, which launches after step 10. Under the overlap scheduler the wait falls
    before step 11's prepare or step 12's (whether the finished request's batch was
    prepared once more). Without the idle signal the wait is filed as a prefill price."""
    from sglang_adaptive.scheduler_hooks import after_scheduler_on_idle

    def run(idle_before: int | None) -> ctl.AdaptiveModeController:
        clock, policy = Clock(), Recording()
        c = ctl.AdaptiveModeController(policy, spec_width=K + 1, clock=clock)
        ctl.install(c)
        forward, launched = 0, None
        for step in range(24):
            clock.t += 0.006
            if step == idle_before:
                clock.t += 2.0
                assert after_scheduler_on_idle("idled", None) == "idled"  # the Scheduler.on_idle hook
            if step == 11 and idle_before is None:
                clock.t += 2.0  # the same wait, unannounced
            c.on_prepare(True, 1, launched)
            forward += 1
            launched = forward
            if step == 10:
                forward += 1
        ctl.reset()
        assert [t[0] for t in policy.told].count(1) == 1, "the prefill is counted either way"
        return c

    assert list(run(None).costs._samples[(costs.SPEC_PREFILL, 1)]) == [pytest.approx(2.0)]
    for idle_before in (11, 12):
        c = run(idle_before)
        assert not c.costs._samples.get((costs.SPEC_PREFILL, 1)), idle_before
        assert max(c.costs._samples[(costs.SPEC, 1)]) == pytest.approx(0.006), idle_before


def test_launched_batches_are_counted_by_reason_and_logged_every_log_interval(caplog):
    import logging

    policy = GoodputPolicy(K)
    c = ctl.AdaptiveModeController(policy, spec_width=K + 1, log_interval=3)
    with caplog.at_level(logging.INFO, logger=ctl.__name__):
        c.on_prepare(c.speculate(1), 1)  # no step time yet: explores speculation
        c.on_prepare(False, 1)  # ran plain against the answer (a grammar, say)
        c.on_prepare(c.speculate(1), 1)
    assert policy.reason_counts() == {(True, "explore"): 2, (False, "forced"): 1}
    lines = [r.getMessage() for r in caplog.records if "by reason" in r.getMessage()]
    assert lines == ["AdaptiveEAGLE decode batches by reason: plain forced 1, spec explore 2"]


def priced(tables: dict, plain_prefill_ms: float | None, spec_prefill_ms: float | None) -> dict:
    """``tables`` with what a prefill batch adds at batch 64 in each mode (ms; None: no price)."""
    for mode, ms in ((costs.PLAIN_PREFILL, plain_prefill_ms), (costs.SPEC_PREFILL, spec_prefill_ms)):
        if ms is not None:
            tables[mode] = {64: ms / 1e3}
    return tables


def gs8_35(policy: GoodputPolicy, plain_ms: float | None, spec_ms: float | None = None) -> None:
    """The 8B pair at acceptance 3.5, batch 64, output lengths 128-384 (2026-12-02 spread
    run): the goodput server's table, plain steps with a prefill batch after every fifth."""
    policy.set_costs(priced(table(plain={64: 6.26}, spec={64: 24.22}), plain_ms, spec_ms))
    for i in range(40):  # probes and refreshes: 2.5 of 3 drafts accepted
        policy.acceptance.update([2, 3] * 32, i)
    put(policy, _speculating=False, _launched=40)
    for i in range(1000):
        policy.on_prefills(int(i % 5 == 4), False, 64)


def test_prefill_batches_priced_in_make_speculation_lead_where_it_ends_more_requests_per_batch():
    """By decode steps plain leads by 10% (6.26 ms a token against 24.22 / 3.5 = 6.92).
    A prefill batch follows every fifth plain step (64 tokens) and, by the fitted rate,
    54% of the speculative ones (224 tokens). At 24 ms a prefill batch after plain steps
    (an adaptive server's, 2026-12-02) and 19 ms after speculative ones, speculation
    leads by 12% (0.154 ms a token against 0.173); with 24 ms for both, by 4%, within the
    hysteresis."""
    policy = GoodputPolicy(K)
    gs8_35(policy, None)
    assert policy._decide(64) == (False, "goodput")
    gs8_35(policy, 24.0, 19.0)
    assert policy._decide(64) == (True, "goodput")
    gs8_35(policy, 24.0, 24.0)
    assert policy._decide(64) == (False, "goodput")
    put(policy, _plain_run=10_000)
    assert policy._decide(64) == (True, "refresh"), "a close call: the probe due is a refresh"
    put(policy, _speculating=True, _plain_run=0)
    assert policy._decide(64) == (True, "goodput"), "speculating, it stays"
    put(policy, costs={**policy.costs, costs.SPEC_PREFILL: {64: 0.060}})
    assert policy._decide(64) == (False, "goodput"), "its own mode's prefill time counts first"


def test_a_mode_without_a_prefill_price_takes_the_other_modes_less_what_its_longer_step_hides():
    """The host launches a prefill while the GPU runs the decode step before it: after a
    6.4 ms plain step a prefill batch added 42.8 ms on the 8B pair (acceptance 3.5, batch
    64), after a 24.6 ms speculative one 13.8 ms (2026-12-04 prefill-sync run). Borrowed
    as it stood, plain's price put speculation 5% ahead instead of 30%, a close call, and
    the policy stayed plain for its first 500 batches."""
    policy = GoodputPolicy(K)
    gs8_35(policy, 24.0)  # no speculative prefill price yet
    per_spec_step, per_plain_step = policy.prefills.per_step(224), policy.prefills.per_step(64)
    assert policy._prefill_time(64, 224, True, 24.22e-3, 6.26e-3) == pytest.approx(per_spec_step * 6.04e-3)
    assert policy._decide(64) == (True, "goodput"), "speculation well ahead: no close call"
    gs8_35(policy, None, 6.04)  # the other way round: plain's from speculation's
    assert policy._prefill_time(64, 64, False, 6.26e-3, 24.22e-3) == pytest.approx(per_plain_step * 24.0e-3)
    gs8_35(policy, 10.0)  # a speculative step longer than plain's by more than the prefill adds
    assert policy._prefill_time(64, 224, True, 24.22e-3, 6.26e-3) == 0.0
    gs8_35(policy, 24.0, 19.0)  # a mode's own price, once measured, is used as it stands
    assert policy._prefill_time(64, 224, True, 24.22e-3, 6.26e-3) == pytest.approx(per_spec_step * 19.0e-3)


def test_a_prefill_price_counts_only_near_the_batch_it_was_measured_at():
    """The 8B pair at acceptance 3.5 with fixed output lengths (2026-12-04 goodput sweep):
    the goodput server's last table held speculation's prefill price at batch 1-2 only
    (32-38 ms, after a 7 ms step) and none for plain. Read flat at batch 64 and derived
    for plain (38 + 26 - 7 ms), with a prefill batch after every fifth plain step, it put
    speculation 36% ahead where plain leads by decode steps (6.83 ms a token against
    26.0 / 3.46) and no-spec led static EAGLE-3 by 6%."""
    policy = GoodputPolicy(K)
    tables = table(plain={1: 4.79, 4: 4.81, 32: 5.29, 48: 5.72, 64: 6.83, 128: 7.48},
                   spec={1: 6.92, 2: 7.00, 4: 7.10, 8: 8.39, 16: 10.89, 32: 15.82, 64: 26.00, 128: 39.67})
    for i in range(40):
        policy.acceptance.update([2, 3] * 32, i)
    put(policy, _speculating=False, _launched=40)
    for i in range(1000):  # a prefill batch after every fifth plain step
        policy.on_prefills(int(i % 5 == 4), False, 64)
    policy.set_costs({**tables, costs.SPEC_PREFILL: {1: 32.22e-3, 2: 37.77e-3}})
    assert policy._prefill_time(64, 224, True, 26.0e-3, 6.83e-3) == 0.0
    assert policy._prefill_time(64, 64, False, 6.83e-3, 26.0e-3) == 0.0
    assert policy._decide(64) == (False, "goodput"), "decode steps alone: plain 9% ahead"
    assert policy._prefill_time(2, 7, True, 7.0e-3, 4.8e-3) > 0, "it still counts where it was measured"
    # The same price measured at batch 32, within a factor of two of 64, counts there.
    policy.set_costs({**tables, costs.SPEC_PREFILL: {32: 37.77e-3}})
    assert policy._prefill_time(64, 224, True, 26.0e-3, 6.83e-3) > 0
    assert policy._prefill_time(64, 64, False, 6.83e-3, 26.0e-3) > 0
    # Derived from speculation's, plain's price puts speculation ahead; free, plain
    # leads: the call rests on it, so plain runs to measure its own (_unpriced).
    assert policy._decide(64) == (False, "price")
    put(policy, _price_explored={(False, 64): GoodputPolicy.PRICE_EXPLORATIONS})
    assert policy._decide(64) == (True, "goodput"), "explorations that filed none leave the derived price"


def tiny64(policy: GoodputPolicy, plain_prefill_ms: float | None = None,
           spec_prefill_ms: float | None = 8.44) -> None:
    """The tiny pair at batch 64 on an H100 (2026-12-06 goodput run): plain 2.1 ms, a
    speculative step 4.0 ms for 2.9 tokens, output length 128 (a prefill batch after
    39% of the plain steps and 77% of the speculative ones); speculating."""
    policy.set_costs(priced(table(plain={64: 2.1}, spec={64: 4.0}), plain_prefill_ms, spec_prefill_ms))
    for i in range(40):
        policy.acceptance.update([2, 2, 2, 1, 2, 3, 2, 1, 3, 1] * 6 + [2] * 4, i)
    for i in range(1000):  # a prefill batch after three speculative steps in four
        policy.on_prefills(int(i % 4 != 0), True, 64)
    put(policy, _speculating=True, _launched=40)


def test_a_call_that_rests_on_a_derived_prefill_price_runs_the_mode_without_one():
    """On the tiny pair (H100) plain's prefill price, derived from speculation's 8.4 ms
    (10.5 ms after a 2 ms step), kept goodput speculating on 96% of the steps at batch
    64, 0.90x no-spec. Free of prefills plain leads there, so the call rests on that
    derived price: plain is explored until it files its own, for at most
    PRICE_EXPLORATIONS explorations of EXPLORE_SYNC steps each."""
    policy = GoodputPolicy(K)
    tiny64(policy)
    p = policy._predict(64)
    assert p.spec > 1.3 * p.plain, "the derived price puts speculation well ahead"
    assert policy._decide(64) == (False, "price")
    assert policy._decide(64) == policy._decide(64), "a pure answer"
    for n in range(1, GoodputPolicy.PRICE_EXPLORATIONS + 1):
        for _ in range(GoodputPolicy.EXPLORE_SYNC):
            decided = policy._decide(64)
            assert decided in ((False, "price"), (False, "explore")), decided
            policy.on_launch(False, 64)
        assert policy.sync_due(), "each exploration shares what it filed"
        assert policy._price_explored == {(False, 64): n}
        policy.set_costs(policy.costs)  # nothing filed: the sync brings no price
    assert policy._decide(64) == (True, "goodput"), "after the last one the derived price stands"
    # Measured, plain's own price decides: 2.5 ms puts plain ahead by more than the
    # hysteresis, 10 ms leaves speculation ahead.
    tiny64(policy, plain_prefill_ms=2.5)
    assert policy._decide(64) == (False, "goodput")
    tiny64(policy, plain_prefill_ms=10.0)
    assert policy._decide(64) == (True, "goodput")


def test_a_call_that_does_not_rest_on_a_derived_prefill_price_explores_nothing():
    """Where speculation leads even with plain's prefills free (a 6 ms plain step
    here), or where neither mode has a price (prefills count in neither), no mode is
    explored for one; nor where speculation lacks one and leads either way."""
    policy = GoodputPolicy(K)
    tiny64(policy)
    policy.set_costs({**policy.costs, costs.PLAIN: {64: 6.0e-3}})
    assert policy._decide(64) == (True, "goodput")
    tiny64(policy, spec_prefill_ms=None)
    assert policy._decide(64)[1] == "goodput"
    tiny64(policy, plain_prefill_ms=3.6, spec_prefill_ms=None)
    assert policy._predict(64, derive=False).spec > policy._predict(64).spec
    assert policy._decide(64)[1] == "goodput"


def test_a_call_that_rests_on_speculations_derived_prefill_price_explores_speculation():
    """The other way round: plain's price measured (10 ms after a 2 ms step), none for
    speculation (3 ms a step), at an acceptance (about 1.2 tokens a step) where
    speculation's derived prefills tip the call to plain while free they leave
    speculation well ahead: speculation runs to measure its own."""
    policy = GoodputPolicy(K)
    policy.set_costs(priced(table(plain={64: 2.0}, spec={64: 3.0}), 10.0, None))
    for i in range(40):
        policy.acceptance.update([0] * 52 + [1] * 12, i)
    for i in range(1000):  # a prefill batch after every fifth plain step
        policy.on_prefills(int(i % 5 == 4), False, 64)
    put(policy, _speculating=False, _launched=40)
    low, p = policy._predict(64, derive=False), policy._predict(64)
    assert low.spec > 1.5 * low.plain and p.spec < p.plain, (low, p)
    assert policy._decide(64) == (True, "price")
    policy.on_launch(True, 64)
    assert policy._price_explored == {(True, 64): 1}


def test_a_batch_well_below_every_measured_speculative_batch_explores_speculation():
    """Read flat from above, a speculative time is an upper bound that can rule out every
    probe (8B pair: 50 ms at 128 for a batch of 64 that takes 21.6)."""
    policy = GoodputPolicy(K)
    policy.set_costs(table(plain={64: 6.91, 128: 8.27}, spec={128: 50.2}))
    put(policy, _speculating=False)
    assert policy._decide(64) == (True, "explore")
    assert policy._decide(104)[1] != "explore", "within REACH of 128: read from it"
    policy.set_costs(table(plain={64: 6.91, 128: 8.27}, spec={64: 21.6, 128: 50.2}))
    assert policy._decide(64)[1] != "explore"


def test_a_batch_well_below_every_measured_plain_batch_explores_plain():
    """Read flat from above, a plain time is an upper bound too (8B pair: 6.31 ms at 128,
    read for a batch of 64 that takes 5.17), and one that can favour speculation: a
    server whose load fell from 128 to 64 speculated there for good (simulated, 0.95x)."""
    policy = GoodputPolicy(K)
    for i in range(40):
        policy.acceptance.update([2, 3] * 32, i)
    put(policy, _speculating=True, _launched=40)
    policy.set_costs(table(plain={128: 8.27}, spec={64: 21.6, 128: 50.2}))
    assert policy._decide(64) == (False, "explore")
    assert policy._decide(104)[1] != "explore", "within REACH of 128: read from it"
    policy.set_costs(table(plain={64: 6.91, 128: 8.27}, spec={64: 21.6, 128: 50.2}))
    assert policy._decide(64)[1] != "explore"


def close_refresh(during: list[int]) -> tuple[int, list, tuple]:
    """Speculation 7% ahead by the estimate (about 3.47 tokens at 22.5 ms against 6.91 ms
    plain) from 20 steps of whole-step acceptance 3 or 4 tokens (upstream's simulated
    3.5): not surely ahead, a close call, so the probe due is a refresh. Runs it with
    verifies cycling through ``during`` (drafts per request); returns its steps, what it
    dropped and the answer after it."""
    p = GoodputPolicy(K)
    p.set_costs(table(plain={64: 6.91}, spec={64: 22.5}))
    for i in range(20):
        p.acceptance.update([2 + i % 2] * 64, i)
    put(p, _speculating=False, _plain_run=10_000, _launched=20)
    assert p._decide(64) == (True, "refresh")
    steps, dropped = 0, []
    while p._decide(64)[1] == "refresh" and steps < 100:
        p.on_launch(True, 64)
        dropped += p.stale_buckets()
        p.on_verify([during[steps % len(during)]] * 64)
        steps += 1
    return steps, dropped, p._decide(64)


def test_a_close_refresh_that_leaves_speculation_ahead_unsurely_runs_more_rounds():
    """One round's verifies leave the estimate less one standard error within the
    hysteresis, so another round runs, its samples not dropped again, up to
    REFRESH_ROUNDS; a round that puts speculation behind ends it."""
    steps, dropped, after = close_refresh([2, 3])
    rounds = steps // GoodputPolicy.REFRESH_STEPS
    assert steps % GoodputPolicy.REFRESH_STEPS == 0 and 1 < rounds <= GoodputPolicy.REFRESH_ROUNDS, steps
    assert [(mode, b) for mode, b, _ in dropped] == [(costs.SPEC, 64)], "dropped once, at the first round"
    assert after == (True, "goodput") or after == (False, "goodput"), after
    steps, _, after = close_refresh([2])  # 3 tokens a step: behind plain
    assert steps == GoodputPolicy.REFRESH_STEPS and after == (False, "goodput"), (steps, after)
