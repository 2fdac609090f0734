"""Planted bugs the test suites must catch, and the runner that plants them.

Each ``Mutant`` is one edit of one file of ``python/sglang_adaptive`` (an exact
text, found exactly once). The runner copies the package, applies one edit, puts
the copy first on ``PYTHONPATH`` and runs the tests named for it; a mutant that
leaves them green *survived*, and the run fails. A mutant whose tests stop for
another reason (an import error, no test collected) counts as an error, not a kill:
the edit no longer fits the code.

CPU mutants run here (``make mutants``, part of ``make test``); GPU mutants are
applied by the GPU suite's ``--mutants`` mode to servers on the GPU host (their
servers import the copy through ``PYTHONPATH``). Add one for every bug fixed.

    python test/mutants.py            # every CPU mutant
    python test/mutants.py NAME ...   # some of them
    python test/mutants.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "python" / "sglang_adaptive"
U = "test/unit/"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # inside python/sglang_adaptive
    old: str
    new: str
    tests: tuple[str, ...] = ()  # CPU: pytest paths that must fail
    gpu: bool = False  # GPU: killed by the GPU suite's --mutants mode instead
    why: str = ""


MUTANTS: tuple[Mutant, ...] = (
    # The seven a reviewer planted that the CPU suite once let through.
    Mutant("war-runner-not-reset", "worker.py",
           "        self._war_runner = self._draft_worker.draft_runner\n        if decode:",
           "        if decode:",
           (U + "test_worker_plain_step.py",),
           why="after a plain step the scheduler would fence its writes on the target's read, "
               "not the draft-extend's"),
    Mutant("plain-relay-moves-draft-extras", "scheduler_hooks.py",
           "    future_map.need_topk = future_map.need_hidden_states = False",
           "    pass",
           (U + "test_future_relay.py",),
           why="a plain batch would gather and stash back its draft extras: the host cost the skip removes"),
    Mutant("goodput-never-probes", "policy.py",
           "        if self._plain_run >= due:", "        if False:",
           (U + "test_goodput.py",),
           why="while plain, the acceptance estimate would never refresh: no way back to speculation"),
    Mutant("goodput-explores-in-lone-steps", "policy.py",
           "self._explore_left = (self._explore_left or self.EXPLORE_SYNC) - 1", "self._explore_left = 0",
           (U + "test_goodput_sim.py",),
           why="where the batch size wanders, exploring batches would run alone between the other mode's, "
               "file no step time and explore again (184 switches at c=8 on the tiny pair)"),
    Mutant("goodput-never-refreshes", "policy.py",
           'return True, "refresh" if close or check or stale else "probe"', 'return True, "probe"',
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="a stale speculative step time would keep the policy plain where speculation pays "
               "(70% plain at c=1 on the tiny pair)"),
    Mutant("goodput-refreshes-only-stale-times", "policy.py",
           'return True, "refresh" if close or check or stale else "probe"',
           'return True, "refresh" if check or stale else "probe"',
           (U + "test_goodput_sim.py",),
           why="a speculative time measured once too slow where the policy had speculated, or an estimate "
               "too unsure at batch 1, would keep it plain where speculation pays (84% plain at c=1 on the "
               "tiny pair, 0.86x static EAGLE-3)"),
    Mutant("goodput-stale-time-rules-out-its-probe", "policy.py",
           "if p.best <= plain * (1 + self.hysteresis) and not stale:",
           "if p.best <= plain * (1 + self.hysteresis):",
           (U + "test_goodput_sim.py::test_a_stall_while_speculating_does_not_keep_the_policy_plain",),
           why="a host stall while speculating put plain ahead of every draft accepted, and with no probe "
               "due the policy stayed plain (64% of the tiny pair's c=1 batches on an H100)"),
    Mutant("goodput-stale-time-refreshed-once-for-good", "policy.py",
           "        return b not in self._refreshed or self._plain_run >= self.REFRESH_STEPS * interval",
           "        return b not in self._refreshed",
           (U + "test_goodput.py::test_the_first_probe_where_speculation_was_only_explored_re_measures_its_step_time",),
           why="a bucket refreshed once would never be refreshed again: a second stall there would keep "
               "the policy plain for good"),
    Mutant("goodput-stale-refreshes-unbudgeted", "policy.py",
           "        return b not in self._refreshed or self._plain_run >= self.REFRESH_STEPS * interval",
           "        return True",
           (U + "test_goodput.py::test_the_first_probe_where_speculation_was_only_explored_re_measures_its_step_time",),
           why="a bucket slower than a larger one for good (the tiny pair's flat host-bound times) would "
               "run a refresh at every probe due, seven times the probe budget"),
    Mutant("goodput-never-refreshes-plain", "policy.py",
           'if self._stale_plain(batch_size):\n                    return False, "refresh"',
           'if False:\n                    return False, "refresh"',
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="a plain time measured too slow once would keep the policy speculating where plain pays "
               "(0.91x the better mode in the simulated case)"),
    Mutant("goodput-acceptance-counts-requests", "policy.py",
           "            weight = w / n\n", "            weight = w\n",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="after a load of 64 requests drops to one, the large batches' acceptance would stand for "
               "some 600 steps against the fresh verifies"),
    Mutant("goodput-refresh-keeps-stale-samples", "controller.py",
           "            self.costs.forget(mode, b)", "            pass",
           (U + "test_goodput_sim.py",),
           why="a refresh's fresh samples would share the median with the stale ones it was for"),
    Mutant("goodput-trusts-a-lucky-probe", "policy.py",
           "return self._rate(a.expected_tokens() - a.standard_error())",
           "return self._rate(a.expected_tokens())",
           (U + "test_goodput_sim.py",),
           why="one probe that happened to accept more would start a speculative stretch where plain pays "
               "(8% of the steps at batch 1, acceptance 1.3, on the GPU)"),
    Mutant("goodput-probes-where-speculation-cannot-pay", "policy.py",
           "        if p.best <= plain * (1 + self.hysteresis) and not stale:\n"
           "            return self._stay_plain(batch_size, context)\n",
           "",
           (U + "test_goodput.py",),
           why="8B pair at c=128: a probe every 400 steps costs a 5-plain-step speculative step "
               "(1% of the time) where no acceptance could make speculation win"),
    Mutant("goodput-probe-window-ignored", "policy.py",
           "extra = max(extra, t_window / t_plain - 3.0)", "pass",
           (U + "test_goodput.py",),
           why="8B pair at batch 32: probes would cost 1.6% of the time, not 1%, their two switches "
               "(0.7 plain steps) outside the budget"),
    Mutant("goodput-probe-window-across-a-prefill", "controller.py",
           "if all(back_to_back(a, b) for a, b in zip(r, list(r)[1:])):", "if True:",
           (U + "test_goodput.py",),
           why="a prefill inside a probe's window would be filed as the probe's cost and space "
               "probes far beyond the budget"),
    Mutant("goodput-answer-outlives-a-verify", "policy.py",
           "self.acceptance.update(num_correct_drafts_per_req, self._launched)\n        self._answers.clear()\n",
           "self.acceptance.update(num_correct_drafts_per_req, self._launched)\n",
           (U + "test_goodput.py",),
           why="a verify result arriving between two asks for the same batch would not count "
               "until the next launch: a collapsed draft would speculate one more step"),
    Mutant("goodput-answer-outlives-a-table", "policy.py",
           "for mode in (costs.PLAIN, costs.SPEC)}\n        self._answers.clear()\n",
           "for mode in (costs.PLAIN, costs.SPEC)}\n",
           (U + "test_goodput.py",),
           why="a freshly shared step-cost table would be ignored for batch sizes asked before it"),
    Mutant("goodput-answer-outlives-a-launch", "policy.py",
           "        self._reasons[key] = self._reasons.get(key, 0) + 1\n        self._answers.clear()\n",
           "        self._reasons[key] = self._reasons.get(key, 0) + 1\n",
           (U + "test_goodput.py",),
           why="the first answer for a batch size would stand for good: no probe, no way back"),
    Mutant("goodput-hold-ignores-misses", "policy.py",
           "tokens = a.expected_after_misses(n, lag + n)", "tokens = expected",
           (U + "test_goodput.py",),
           why="a held answer would go on speculating through launches where the draft stopped matching"),
    Mutant("goodput-hold-one-miss-short", "policy.py",
           "tokens = a.expected_after_misses(n, lag + n)", "tokens = a.expected_after_misses(n - 1, lag + n - 1)",
           (U + "test_goodput.py",),
           why="the last held launch would speculate where the verifies since the answer put plain ahead"),
    Mutant("goodput-hold-ages-without-the-lag", "policy.py",
           "tokens = a.expected_after_misses(n, lag + n)", "tokens = a.expected_after_misses(n, n)",
           (U + "test_goodput.py",),
           why="after plain launches the old evidence ages further than the hold allowed for"),
    Mutant("goodput-hold-ignores-context", "policy.py",
           "high = context + n * growth", "high = context + 10**9",
           (U + "test_goodput.py",),
           why="a held answer would speculate at a context where speculative steps lose (a long prompt joined)"),
    Mutant("goodput-hold-outlives-its-verifies", "policy.py",
           "if self._hold_verifies < 0:", "if False:",
           (U + "test_goodput.py",),
           why="verifies beyond those the hold allowed for would not end it"),
    Mutant("goodput-hold-outlives-a-table", "policy.py",
           "self._hold_left, self._offer = 0, None  # held", "self._offer = None  # held",
           (U + "test_goodput.py",),
           why="a held answer would rest on the old table's step times"),
    Mutant("goodput-hold-outlives-a-prefill", "policy.py",
           "        if batches:  # the prefill rate moved", "        if False:  # the prefill rate moved",
           (U + "test_goodput.py",),
           why="a held answer would ignore the prefill rate and a new request's context"),
    Mutant("goodput-held-speculate-ignores-context", "policy.py",
           "and self._hold_low <= context <= self._hold_high:\n            return self._hold_spec",
           ":\n            return self._hold_spec",
           (U + "test_goodput.py",),
           why="the scheduler's question (speculate) would answer a held stay at a context outside the hold"),
    Mutant("goodput-plain-hold-past-its-probe", "policy.py",
           "self._plain_run, self._launched = saved[0] + n, saved[1] + n",
           "self._plain_run, self._launched = saved",
           (U + "test_goodput.py",),
           why="a plain hold worked out at its first launch would run past the probe due within it"),
    Mutant("goodput-plain-hold-survives-a-verify", "policy.py",
           "self._hold_verifies = self._hold_left if speculative else 0",
           "self._hold_verifies = self._hold_left",
           (U + "test_goodput.py",),
           why="a probe's verify that comes after the next plain launch (overlap) would not end the hold "
               "that launch took"),
    Mutant("goodput-plain-held-launch-skips-the-run", "policy.py",
           "                    self._plain_run += 1\n", "",
           (U + "test_goodput.py",),
           why="held plain launches would not count towards the next probe: probes come late"),
    Mutant("shares-seldom-while-unsettled", "controller.py",
           "steady = self.policy.settled() and self._shared", "steady = self._shared",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="a policy speculating on a derived prefill price would wait 256 batches for the measured one "
               "(simulated: 17% speculative where plain leads, against 4%)"),
    Mutant("shares-seldom-after-a-switch", "controller.py",
           "        if switched and self._sync_wait > self.sync_every:", "        if False:",
           (U + "test_goodput.py",),
           why="the steps of the mode switched to would reach the policy up to 256 batches late"),
    Mutant("steady-table-ignores-values", "controller.py",
           "            if abs(value - old[key]) > share * max(abs(value), abs(old[key])):",
           "            if False:",
           (U + "test_goodput.py",),
           why="a table whose step times moved would still be shared only every 256 batches"),
    Mutant("share-wait-unbounded", "controller.py",
           "min(2 * self._sync_wait, self.sync_max_every)", "2 * self._sync_wait",
           (U + "test_goodput.py",),
           why="a steady server would share its table ever more rarely: the file and the policy go stale"),
    Mutant("acceptance-fold-ages-nothing", "policy.py",
           "        aged = 0.5 ** ((last - self._aged_at) / half_life)\n", "        aged = 1.0\n",
           (U + "test_goodput.py",),
           why="evidence before a fold would never age: an old acceptance would outweigh fresh verifies"),
    Mutant("acceptance-fold-drops-one-request-squares", "policy.py",
           "            squares += (1 + v) * (1 + v) * single[v]\n", "",
           (U + "test_goodput.py",),
           why="at batch 1 the step means' spread, and with it the standard error, would be wrong"),
    Mutant("acceptance-fold-one-weight-a-verify", "policy.py",
           "            w = 0.5 ** ((last - step) / half_life)\n", "            w = 1.0\n",
           (U + "test_goodput.py",),
           why="verifies folded together would weigh alike however far apart they came"),
    Mutant("goodput-probes-ignore-their-cost", "policy.py",
           "return max(self.probe_every, math.ceil(extra / self.probe_budget))", "return self.probe_every",
           (U + "test_goodput.py",),
           why="at high load a probe every 100 steps costs 3.5% of the time (speculative step = 4.5 plain)"),
    Mutant("goodput-files-dirty-intervals", "controller.py",
           "if pending is not None and back_to_back(last, now):", "if pending is not None:",
           (U + "test_goodput.py",),
           why="a step interval holding a prefill would be filed as a decode step's cost"),
    Mutant("goodput-files-intervals-across-a-switch", "controller.py",
           "back_to_back(last, now) and r[-3][1] == last[1]:", "back_to_back(last, now):",
           (U + "test_goodput.py",),
           why="a lone probe's interval holds the plain step before it: speculation would look as "
               "cheap as plain and win on the next sync"),
    Mutant("goodput-reads-large-batches-flat", "policy.py",
           'batch_size, above="proportional")', 'batch_size, above="flat")',
           (U + "test_goodput.py",),
           why="8B sweep, c=128: batch 64's speculative time read for batch 128 held speculation "
               "for 26 steps of 50 ms against 8.3 ms plain"),
    Mutant("goodput-probe-sets-the-mode", "policy.py",
           '        if speculative != decided or why == "probe":', '        if False:',
           (U + "test_goodput.py",),
           why="after a probe the hysteresis would keep speculating where the modes predict alike"),
    Mutant("goodput-extrapolates-far-above", "policy.py",
           " and batch_size <= self.REACH * max(spec)", "",
           (U + "test_goodput.py",),
           why="a speculative time extrapolated twice its measured range is never corrected: "
               "while plain only lone probes run, and their intervals are not filed"),
    Mutant("goodput-reads-small-batches-from-far-above", "policy.py",
           "\n                and costs.bucket(batch_size) * self.REACH >= min(spec))", ")",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="coming down from batch 128 to 64 (8B pair, acceptance 3.5), 128's 50 ms read flat ruled "
               "out every probe where speculation leads by 12%: 0.89x the better mode"),
    Mutant("goodput-reads-small-plain-batches-from-far-above", "policy.py",
           " and costs.bucket(batch_size) * self.REACH >= min(plain)", "",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="falling from batch 128 to 64 (8B pair, acceptance 3.5), 128's plain 6.3 ms read flat "
               "(5.2 measured) kept speculation on for good: 0.95x the better mode"),
    Mutant("goodput-decides-on-derived-prefill-prices", "policy.py",
           "        price = self._unpriced(batch_size, plain, spec, context)\n", "        price = None\n",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="tiny pair at batch 64 (H100): plain's prefill price derived from speculation's "
               "(10.5 ms, about 3.6 as served) kept goodput speculating on 96% of the steps, 0.90x no-spec"),
    Mutant("goodput-explores-prefill-prices-for-ever", "policy.py",
           ") >= self.PRICE_EXPLORATIONS:", ") >= math.inf:",
           (U + "test_goodput.py",),
           why="where prefills never fall between back-to-back steps of one mode (fixed output "
               "lengths), explorations for a price file none: without a bound the policy stays in that mode"),
    Mutant("goodput-refresh-runs-one-round", "policy.py",
           "    REFRESH_ROUNDS = 4\n", "    REFRESH_ROUNDS = 1\n",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="8B pair at acceptance 3.5, batch 64 after 32: speculation 12% ahead, one 7-step "
               "refresh leaves the call unsettled and the policy plain for some 1,100 steps (0.97x)"),
    Mutant("goodput-files-the-interval-after-a-prefill", "controller.py",
           "if len(r) > 2 and back_to_back(last, now) and", "if len(r) > 2 and",
           (U + "test_goodput.py",),
           why="every prefill would file one prefill-sized interval as a decode step"),
    Mutant("goodput-files-the-wait-for-a-prefill", "controller.py",
           "back_to_back(last, now) and r[-3][1] == last[1]:", "back_to_back(r[-3], last) and r[-3][1] == last[1]:",
           (U + "test_goodput.py",),
           why="the forward count shows a prefill one prepare late: checking the pair before would file "
               "the interval that waits for the prefill as a decode step (speculative steps of 24 ms "
               "mixed with prefill batches of 18 ms read too cheap)"),
    Mutant("goodput-prefills-counted-below-zero", "controller.py",
           "self.policy.on_prefills(max(0, r[-1][3] - r[-2][3] - 1),",
           "self.policy.on_prefills(r[-1][3] - r[-2][3] - 1,",
           (U + "test_goodput.py",),
           why="a batch prepared twice without a launch would count minus one prefill batch"),
    Mutant("goodput-prefills-unpriced", "policy.py",
           "return self._batches / self._events * -math.expm1(-q * tokens) if q else 0.0", "return 0.0",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="8B pair, acceptance 3.5, c=64, spread lengths: plain by decode steps (10% ahead) where "
               "static EAGLE-3 led end to end by 6.6% (0.85x EAGLE-3 on the GPU)"),
    Mutant("goodput-prefills-per-request-not-per-token", "policy.py",
           "self._prefill_time(batch_size, batch_size * tokens, True, t_spec, t_plain, derive)",
           "self._prefill_time(batch_size, batch_size, True, t_spec, t_plain, derive)",
           (U + "test_goodput.py",),
           why="a speculative step would be priced with a plain step's prefills, a third of what "
               "follows it at 3.5 tokens a step: speculation looks 30% ahead where it leads by 4%"),
    Mutant("goodput-prefill-time-of-the-other-mode-first", "policy.py",
           "        if own is not None:\n",
           "        if own is not None and other is None:\n",
           (U + "test_goodput.py",),
           why="a mode's own prefill cost would never count once the other mode had one"),
    Mutant("goodput-prefill-price-read-from-any-batch-size", "policy.py",
           "self._lookup(mode, batch_size) if self._near(mode, batch_size) else None",
           "self._lookup(mode, batch_size) if self.costs[mode] else None",
           (U + "test_goodput.py",),
           why="8B pair, acceptance 3.5, fixed lengths: speculation's prefill price at batch 1-2 (38 ms "
               "after a 7 ms step) read flat at batch 64, where its 26 ms step hides much of it; plain's "
               "derived from it put speculation 36% ahead there (a prefill after every fifth plain "
               "step), where no-spec led static EAGLE-3 by 6%"),
    Mutant("goodput-prefill-price-borrowed-as-it-stands", "policy.py",
           "max(0.0, other + t_other - t_own)",
           "max(0.0, other)",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="8B pair, acceptance 3.5, c=64, lengths 128-384: a prefill after a plain step (42.8 ms) "
               "priced a speculative step's prefills (13.8 ms): speculation 5% ahead instead of 30%, plain "
               "for the first 500 batches (0.886x static EAGLE-3)"),
    Mutant("goodput-prefill-cost-keeps-a-decode-step", "controller.py",
           "(c[0] - a[0] - 2 * step)", "(c[0] - a[0] - step)",
           (U + "test_goodput.py",),
           why="each prefill batch would cost one decode step more than it adds"),
    Mutant("goodput-prefill-cost-across-a-switch", "controller.py",
           "        if not first[1] == before[1] == a[1] == b[1]:\n            return\n", "",
           (U + "test_goodput.py",),
           why="a switch's own cost (and the other mode's step) would be filed as a prefill's"),
    Mutant("goodput-prefill-cost-after-a-switch", "controller.py",
           "        if not first[1] == before[1] == a[1] == b[1]:", "        if not before[1] == a[1] == b[1]:",
           (U + "test_goodput.py::test_a_prefill_next_to_a_switch_or_another_prefill_files_nothing",),
           why="the first step after a switch pays for it, and its time would be filed as a prefill's: "
               "speculation's prefills at 16.6 ms on the tiny pair at batch 64 against static EAGLE-3's 7.5"),
    Mutant("decision-log-after-launch", "controller.py",
           "        self.decisions.record(self.policy, speculative, batch_size, context)\n"
           "        self.policy.on_launch(speculative, batch_size, context)\n",
           "        self.policy.on_launch(speculative, batch_size, context)\n"
           "        self.decisions.record(self.policy, speculative, batch_size, context)\n",
           (U + "test_goodput.py::test_the_decision_log_writes_each_decode_batch_as_the_policy_decided_it",),
           why="the log would give the policy's answer for the next batch, not the one it ran: "
               "a probe would read as a plain decision"),
    Mutant("goodput-speculation-priced-without-context", "policy.py",
           "plan[2] + plan[3] * context", "plan[2]",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="a speculative step read at no context: the 8B pair's at batch 64 would cost 11.5 ms "
               "instead of 21.7-27.6 ms, and speculation would run where plain leads by 16%"),
    Mutant("costs-no-context-slope", "costs.py",
           "            self._slope = max(0.0, cxy / cxx)", "            self._slope = 0.0",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="8B pair, acceptance 3.5, c=64: speculation's time filed early in a wave and read for "
               "the whole wave (0.96-0.98x no-spec on the GPU, 0.975x in the simulation)"),
    Mutant("costs-table-at-the-context-it-ran", "costs.py",
           "        if not slope:\n            return d[0]\n", "        return d[0]\n",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="the table's times would hold their context twice once the policy adds it back"),
    Mutant("costs-table-keeps-a-bucket-past-its-samples", "costs.py",
           "        self._window(self._samples, key).append(seconds)\n        self._derived.pop(key, None)\n",
           "        self._window(self._samples, key).append(seconds)\n",
           (U + "test_goodput.py::test_the_table_reads_every_sample_and_slope_since_the_last_one",),
           why="the policy would go on reading a bucket's step time or prefill price from before its "
               "last samples"),
    Mutant("costs-table-keeps-a-time-past-its-slope", "costs.py",
           "        if d[2] != slope:", "        if d[2] is None:",
           (U + "test_goodput.py::test_the_table_reads_every_sample_and_slope_since_the_last_one",),
           why="a bucket's time at no context would keep the slope it was first worked out with"),
    Mutant("costs-context-slope-uncapped", "costs.py",
           "                    slope = min(slope, CONTEXT_SHARE * d[0] / d[1])",
           "                    pass",
           (U + "test_goodput.py::test_a_slope_never_takes_more_than_nine_tenths_of_the_steps_it_was_fitted_on",),
           why="H100, acceptance 1.3: a slope fitted on a few speculative steps read batch 128 at -44.8 ms "
               "with no context, a step of 128 requests of 140 tokens at 0.1 ms"),
    Mutant("costs-context-slope-per-bucket", "costs.py",
           "        self.slopes[mode].add(batch_size, context, seconds)",
           "        self.slopes[mode].add(bucket(batch_size), context, seconds)",
           (U + "test_goodput.py",),
           why="batches of different sizes in one bucket compared: their requests' own cost would pass "
               "for context (+56% where the batch grows with its context)"),
    Mutant("costs-context-slope-counts-a-refill", "costs.py",
           "            g.settle = self.settle if fell else g.settle - 1",
           "            g.settle = 0 if fell else g.settle - 1",
           (U + "test_goodput.py",),
           why="the steps a refill's prefill disturbs, right where the context falls, would count"),
    Mutant("costs-context-slope-unclipped", "costs.py",
           "        residual = min(max(seconds - fit, -bound), bound)", "        residual = seconds - fit",
           (U + "test_goodput.py",),
           why="one stall would weigh as a step three times as long"),
    Mutant("costs-context-slope-starts-at-the-first-step", "costs.py",
           "                g.mean_y, g.mean_x = sorted(g.first)[1]", "                g.mean_y, g.mean_x = g.first[0]",
           (U + "test_goodput.py",),
           why="a new size's means would start at its first step, which runs slow on a fresh server"),
    Mutant("controller-files-steps-without-context", "controller.py",
           "            self._pending = (last[1], last[2], now[0] - last[0], last[4])",
           "            self._pending = (last[1], last[2], now[0] - last[0])",
           (U + "test_goodput.py",),
           why="every step filed at no context: no slope, and the table back at the context it ran"),
    Mutant("hooks-prepare-asks-without-context", "scheduler_hooks.py",
           "    speculative = controller.speculate(len(self.reqs), self.has_grammar, context)",
           "    speculative = controller.speculate(len(self.reqs), self.has_grammar)",
           (U + "test_kv_accounting.py",),
           why="the memory check and the prepare would ask about different batches: the reserve "
               "checked is not the one allocated"),
    Mutant("goodput-explores-without-sync", "policy.py",
           "return self._explored > 0 and self._explored % self.EXPLORE_SYNC == 0", "return False",
           (U + "test_goodput.py",),
           why="a mode measured for the first time would run until the regular sync (32 steps): "
               "32 speculative steps at batch 128 are 1.6 s of a 7 s load point"),
    Mutant("decode-stats-hook-no-op", "scheduler_hooks.py",
           "if scheduler.spec_algorithm.is_none() or self.spec_num_forward_ct > 0:", "if True:",
           (U + "test_result_processing.py",),
           why="an interval of plain batches only divides by zero speculative forwards"),
    Mutant("kv-audit-min", "controller.py",
           "reserve = max((r.kv.kv_allocated_len", "reserve = min((r.kv.kv_allocated_len",
           (U + "test_controller.py",),
           why="the audit would report the smallest reserve, hiding an over-reserving request"),
    Mutant("plain-seq-lens-sum-not-advanced", "worker.py",
           "plain.seq_lens_sum = batch.seq_lens_sum + len(batch.reqs)",
           "plain.seq_lens_sum = batch.seq_lens_sum",
           (U + "test_worker_plain_step.py",),
           why="attention backends size their work from seq_lens_sum"),
    Mutant("plain-seq-lens-cpu-not-advanced", "worker.py",
           "plain.seq_lens_cpu = batch.seq_lens_cpu + 1", "plain.seq_lens_cpu = batch.seq_lens_cpu",
           (U + "test_worker_plain_step.py",),
           why="backends that plan on the host read one token too few"),
    Mutant("keep-alive-refs-dropped", "worker.py",
           "        result.extra_keep_alive_refs = [forward_batch]\n", "",
           (U + "test_worker_plain_step.py",),
           why="under overlap the forward batch's tensors could be freed while the graph reads them"),
    Mutant("plain-graphs-four-tokens", "plain_graph.py",
           "speculative_num_draft_tokens=1,", "speculative_num_draft_tokens=4,",
           (U + "test_plain_graph.py",),
           why="plain graphs captured for 4 tokens a request replay the wrong shapes"),
    # Bugs fixed in earlier sessions, and other single defects of the core path.
    Mutant("plain-step-rewrites-scheduler-batch", "worker.py",
           "plain = copy.copy(batch)", "plain = batch",
           (U + "test_worker_plain_step.py",),
           why="session 2: every plain step published twice under overlap (S+1, then S+2)"),
    Mutant("publish-after-forward", "worker.py",
           "        if on_publish is not None:\n            on_publish(new_seq_lens)\n", "",
           (U + "test_worker_plain_step.py",),
           why="the scheduler's next prepare waits on the host for the publish"),
    Mutant("plain-kv-slot-stale", "worker.py",
           "batch.req_pool_indices, seq_lens\n", "batch.req_pool_indices, seq_lens - 1\n",
           (U + "test_worker_plain_step.py",),
           why="the bonus token's K/V overwrite the previous position's slot"),
    Mutant("commit-loop-tensor", "scheduler_hooks.py",
           "        nxt_kv_lens_cpu = nxt_kv_lens_cpu.tolist()\n", "        pass\n",
           (U + "test_kv_accounting.py",),
           why="session 4: 1 ms of host time a plain step at 128 requests"),
    Mutant("plain-reserve-ignores-overlap", "policy.py",
           "return (last_decode_width if overlap else 0) + 1", "return 1",
           (U + "test_kv_accounting.py",),
           why="under overlap the in-flight batch writes past the committed length"),
    Mutant("decode-width-not-tracked", "controller.py",
           "self.last_decode_width = self.spec_width if speculative else 1",
           "self.last_decode_width = 1",
           (U + "test_kv_accounting.py",),
           why="the first plain batch after a speculative one must cover its in-flight verify"),
    Mutant("plain-keeps-spec-reserve", "controller.py",
           "        if speculative:\n            return None\n        return plain_kv_reserve",
           "        return None\n        return plain_kv_reserve",
           (U + "test_kv_accounting.py",),
           why="always-plain would hold 2 x num_draft_tokens slots a request"),
    Mutant("grammar-batches-go-plain", "controller.py",
           "return (has_grammar and not self.plain_grammar) or self.policy.speculate(batch_size, context)",
           "return self.policy.speculate(batch_size, context)",
           (U + "test_controller.py",),
           why="SGLANG_ADAPTIVE_PLAIN_GRAMMAR=0 would no longer keep constrained batches speculative"),
    Mutant("plain-grammar-sampled-without-barrier", "worker.py",
           "            grammar_barrier()\n", "            pass\n",
           (U + "test_worker_plain_step.py",),
           why="a constrained plain step would mask with grammars that have not taken the "
               "tokens of the batch still in flight"),
    Mutant("plain-result-skipped-by-grammar-barrier", "scheduler_hooks.py",
           "    if not getattr(result, ctl.RESULT_FLAG, False):\n        return original(self, result, batch)",
           "    if True:\n        return original(self, result, batch)",
           (U + "test_result_processing.py",),
           why="the step after a plain one would mask without the plain token: a grammar one token behind"),
    Mutant("plain-grammar-advanced-twice", "scheduler_hooks.py",
           "    if _grammars_advanced:\n", "    if False:\n",
           (U + "test_result_processing.py",),
           why="processing a plain result the barrier already advanced would feed its token to the "
               "grammar a second time"),
    Mutant("plain-result-not-committed", "scheduler_hooks.py",
           "            req.kv_committed_len += 1\n", "            pass\n",
           (U + "test_result_processing.py",),
           why="committed lengths lag, the KV of every plain token leaks"),
    Mutant("plain-result-processed-as-verify", "scheduler_hooks.py",
           "    batch.spec_algorithm = up.SpeculativeAlgorithm.NONE\n    try:\n",
           "    try:\n",
           (U + "test_result_processing.py",),
           why="a plain result read as a verify result takes the wrong token layout"),
    Mutant("mode-state-not-restored", "plain_graph.py",
           "        previous.apply(model_runner)\n", "        pass\n",
           (U + "test_plain_graph.py",),
           why="the next speculative step would replay plain graphs"),
    Mutant("diag-installs-its-controller", "worker.py",
           "        if not self._diag:\n            ctl.install(self.controller)",
           "        ctl.install(self.controller)",
           (U + "test_worker_plain_step.py::test_diagnostic_modes_leave_upstreams_controller_and_build_less",),
           why="a diagnostic server would time and decide each batch: what it measures would include the controller"),
    Mutant("diag-backend-only-captures", "worker.py",
           'capture=self._diag != "backend-only",', "capture=True,",
           (U + "test_worker_plain_step.py::test_diagnostic_modes_leave_upstreams_controller_and_build_less",),
           why="backend-only would also hold the plain graphs: the split could not tell the two apart"),
    Mutant("plain-state-captures-regardless", "plain_graph.py",
           "if capture and not up.check_cuda_graph_backend(", "if not up.check_cuda_graph_backend(",
           (U + "test_plain_graph.py",),
           why="capture=False would still capture the plain graphs"),
    Mutant("plain-graphs-no-hidden-floor", "plain_graph.py",
           "return max(self._return_hidden_states_mode, self._min_capture_hidden_mode)",
           "return self._return_hidden_states_mode",
           (U + "test_plain_graph.py",),
           why="EAGLE-3 plain graphs must capture the aux hidden states"),
    Mutant("switches-miscounted", "controller.py",
           "self.last_speculative != speculative", "self.last_speculative == speculative",
           (U + "test_controller.py",),
           why="the mode counters the GPU suite asserts on"),
    Mutant("hook-verification-skipped", "upstream.py",
           "if applied_hook(hook.target, hook.impl) is None:", "if False:",
           (U + "test_plugin.py",),
           why="SGLang only logs a hook that fails to apply"),
    # Model families the plain step cannot serve must stop start-up.
    Mutant("mrope-model-not-refused", "args.py",
           "    if model_config.model_is_mrope:\n", "    if False:\n",
           (U + "test_args.py",),
           why="the scheduler would die on the first plain step of an mrope model"),
    Mutant("hybrid-model-not-refused", "args.py",
           "    if up.mambaish_config(model_config) is not None:\n", "    if False:\n",
           (U + "test_args.py",),
           why="the radix cache would hand out recurrent-state checkpoints plain steps never wrote"),
    Mutant("eagle-hidden-states-not-refused", "args.py",
           'if algo == "EAGLE" and getattr(server_args, "enable_return_hidden_states", False):',
           'if False:',
           (U + "test_args.py",),
           why="eager plain steps of an EAGLE server return fewer hidden-state rows than tokens"),
    Mutant("accept-length-counts-plain-tokens", "telemetry.py",
           "    if verify_ct > 0 and get_config(self.server_args).enabled:\n", "    if False:\n",
           (U + "test_telemetry.py",),
           why="a partly plain request reported its plain tokens as accepted drafts"),
    Mutant("engine-flags-ignored", "args.py",
           "{**given, **flags}", "given",
           (U + "test_args.py",),
           why="sglang.Engine(speculative_disable_batch_threshold=...) would run with the default policy"),
    Mutant("static-reference-switches-modes", "bench/configs.py",
           '"eagle3": (spec + list(STATIC_ARGS), pair.spec_env),', '"eagle3": (spec, pair.spec_env),',
           (U + "test_bench.py::test_each_configuration_runs_the_policy_its_label_names",),
           why="the benchmark's static EAGLE-3 would run the default goodput policy: goodput against itself"),
    Mutant("report-keeps-the-last-round", "bench/report.py",
           "{label: median(v) for label, v in values.items()}", "{label: v[-1] for label, v in values.items()}",
           (U + "test_report.py",),
           why="with --rounds the tables would show whichever server ran last, not the median"),
    Mutant("bench-counts-modes-from-the-start", "bench/__main__.py",
           "row.update(metrics.mode_between(metrics.mode_samples(opened.before), samples))",
           "row.update(metrics.mode_between([], samples))",
           (U + "test_bench.py::test_a_point_counts_the_batches_logged_while_it_ran_not_those_of_its_first_second",),
           why="each point's plain share would hold every batch the server ran before it"),
    Mutant("steady-decode-keeps-windows-with-speculation", "bench/metrics.py",
           "            if prev.counts_before[1] == w.counts_after[1]:", "            if True:",
           (U + "test_bench.py::test_steady_decode_counts_whole_plain_windows_at_the_batch_size",),
           why="an adaptive server's steady plain speed would average in its speculative batches"),
    Mutant("steady-decode-calls-static-eagle3-plain", "bench/metrics.py",
           "(spec if w.speculated else plain).append(w.tok_per_s)", "plain.append(w.tok_per_s)",
           (U + "test_bench.py::test_steady_decode_reads_speculative_windows_apart_from_plain_ones",),
           why="static EAGLE-3's speculative windows would be reported as plain steps, beside no-spec's"),
    Mutant("closed-point-reads-the-whole-log", "bench/__main__.py",
           "point_log = log_after[len(opened.before):]",
           "point_log = log_after",
           (U + "test_bench.py::test_a_closed_point_reads_its_own_log_lines",),
           why="each point's steady speed and prefill count would hold every point's before it"),
    Mutant("interleave-same-order-every-slice", "bench/__main__.py",
           "for k in [(s + i) % len(live) for i in range(len(live))]:", "for k in range(len(live)):",
           (U + "test_bench.py::test_interleave_serves_every_configuration_at_once_and_takes_slices_in_turn",),
           why="one configuration would take every slice first, after the others' idle gap"),
    Mutant("interleave-different-requests-per-server", "bench/__main__.py",
           "recs, start, secs = client.run(live[k].srv.url, part, reqs)",
           "recs, start, secs = client.run(live[k].srv.url, part, requests_for(part, a, seed * 1000 + s + k))",
           (U + "test_bench.py::test_interleave_serves_every_configuration_at_once_and_takes_slices_in_turn",),
           why="the servers of one slice would decode different requests: the slices would not pair"),
    Mutant("policy-table-memo-outlives-its-table", "policy.py",
           "        self._table_at: dict = {}\n",
           "        self._table_at = getattr(self, '_table_at', {})\n",
           (U + "test_goodput.py",),
           why="answers would read step times and prices of a table the policy no longer holds"),
    Mutant("acceptance-estimate-outlives-a-verify", "policy.py",
           "            self._expected = self._error = None\n", "",
           (U + "test_goodput.py",),
           why="the policy would go on predicting with the acceptance of the first verify it read"),
    Mutant("idle-wait-filed-as-prefill-price", "controller.py",
           "back_to_back(c, d)) or c[5]:", "back_to_back(c, d)):",
           (U + "test_goodput.py",),
           why="a pause in the load would be filed as the price of the prefill after it, seconds "
               "against milliseconds, in the mode that ran before the pause"),
    Mutant("idle-wait-counts-as-back-to-back", "controller.py",
           "second[3] - first[3] == 1 and not second[5]", "second[3] - first[3] == 1",
           (U + "test_goodput.py",),
           why="an interval spanning an idle wait would pass for steps run one after another"),
    Mutant("idle-not-told", "scheduler_hooks.py",
           "    ctl.current().on_idle()\n", "",
           (U + "test_goodput.py",),
           why="the controller would never learn of a wait, and file it as a prefill price"),
    Mutant("reasons-count-the-answer-not-the-batch", "policy.py",
           "key = (speculative, batch_reason(speculative, decided, why))", "key = (decided, why)",
           (U + "test_goodput.py",),
           why="a batch run against the policy's answer (a grammar) would be counted as the mode it did not run"),
    Mutant("stale-refresh-waits-the-stretched-interval", "policy.py",
           "due = self.probe_every if check else interval", "due = interval",
           (U + "test_goodput_sim.py",),
           why="a speculative time filed slow after a wait would keep the policy plain until a refresh "
               "whose interval it stretched, which could land after the next wait (0.73x, simulated)"),
    Mutant("plain-stretch-never-checked", "policy.py",
           "check = first_stale or (self._stretch_unchecked", "check = first_stale or (False",
           (U + "test_goodput.py",),
           why="a plain stretch entered on a few poor verifies (the tiny pair's first requests at c=1) would "
               "wait for lone probes, one verify each: plain for some 900 batches where speculation paid"),
    Mutant("plain-stretch-from-exploration-unchecked", "policy.py",
           "self._stretch_unchecked or bool(self._speculating) or self._last_explored)",
           "self._stretch_unchecked or bool(self._speculating))",
           (U + "test_goodput.py",),
           why="a stretch entered on the exploration's speculative time (a warm-up's 4.3 ms step against "
               "3.1 steady) would wait for lone probes, which do not re-measure it"),
    Mutant("plain-stretch-checks-unspaced", "policy.py",
           "and self._launched - self._checked_at >= self.REFRESH_STEPS * interval)", "and True)",
           (U + "test_goodput.py",),
           why="where plain leads narrowly, every stretch after a short speculative run would be checked "
               "again, beyond the probe budget"),
    Mutant("plain-stretch-check-drops-samples", "policy.py",
           "            if why != REFRESH_STRETCH:\n", "            if True:\n",
           (U + "test_goodput.py", U + "test_goodput_sim.py"),
           why="a check that files fewer than MIN_SAMPLES steps (prefills between them) would leave the "
               "bucket unmeasured and start its exploration (tiny pair at c=64, simulated: 0.97x no-spec)"),
    Mutant("plain-reserve-outlives-its-block", "scheduler_hooks.py",
           "        _reserve_override = self.previous\n", "        pass\n",
           (U + "test_kv_accounting.py",),
           why="a plain batch's narrow KV reserve would stay in force for whatever asks next"),
    Mutant("interleave-cores-stay", "bench/__main__.py",
           "plan = pinner.pin_server(x.srv.proc.pid, live[(k + s) % len(live)].slot)",
           "plan = pinner.pin_server(x.srv.proc.pid, x.slot)",
           (U + "test_bench.py::test_interleave_serves_every_configuration_at_once_and_takes_slices_in_turn",),
           why="each configuration would keep its core: a slower core would read as a slower configuration"),
    Mutant("interleave-idle-servers-poll", "bench/__main__.py",
           "if self.a.interleave and \"--sleep-on-idle\" not in args:", "if False:",
           (U + "test_bench.py::test_interleave_serves_every_configuration_at_once_and_takes_slices_in_turn",),
           why="the servers waiting their turn would each keep a core at 100% while another is measured"),
    Mutant("interleave-servers-start-together", "bench/__main__.py",
           "memory=memory_fraction(k, len(plan))", "memory=0.7",
           (U + "test_bench.py::test_interleave_serves_every_configuration_at_once_and_takes_slices_in_turn",),
           why="each server would size its KV pool as if alone on the GPU: the later ones fail to start"),
    Mutant("cost-table-written-every-sync", "controller.py",
           "changed or self.clock() - self._table_written >= TABLE_WRITE_EVERY_S", "True",
           (U + "test_goodput.py::test_the_cost_table_file_is_rewritten_once_a_second_or_when_a_bucket_comes",),
           why="every sync would rewrite the table file, about 0.45 ms every 32 decode batches"),
    Mutant("paired-slices-against-the-worse-static", "bench/report.py",
           "best = [max(v) for v in zip(*statics)]",
           "best = [min(v) for v in zip(*statics)]",
           (U + "test_report.py",),
           why="an interleaved point would be judged against the slower static mode of each slice"),
    Mutant("pooled-runs-overwrite-each-other", "bench/report.py",
           'point.setdefault((row.get(SOURCE, 0), row.get("round", 1)), {})',
           'point.setdefault((0, row.get("round", 1)), {})',
           (U + "test_report.py::test_interleaved_runs_read_together_pool_their_slices_with_an_interval",),
           why="read together, each run's slices would replace the run's before: the last run judged alone"),
    Mutant("slice-interval-from-one-end", "bench/report.py",
           "return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]",
           "return medians[0], medians[int(0.975 * resamples) - 1]",
           (U + "test_report.py::test_interleaved_runs_read_together_pool_their_slices_with_an_interval",),
           why="the interval's low end would be the smallest resampled median, not its 2.5th percentile"),
    Mutant("slice-interval-to-the-largest", "bench/report.py",
           "return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]",
           "return medians[int(0.025 * resamples)], medians[-1]",
           (U + "test_report.py::test_interleaved_runs_read_together_pool_their_slices_with_an_interval",),
           why="the interval's high end would be the largest resampled median, not its 97.5th percentile"),
    Mutant("pin-the-main-thread-only", "bench/pinning.py",
           '        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]', "        tids = [pid]",
           (U + "test_pinning.py",),
           why="sched_setaffinity on a pid moves one thread: the scheduler's others would stay anywhere"),
    Mutant("pinned-servers-share-a-core", "bench/pinning.py",
           "mine = self.plan.slot(slot, schedulers)", "mine = self.plan.slot(0, schedulers)",
           (U + "test_pinning.py",),
           why="interleaved servers' schedulers would all run on one core"),
    Mutant("steal-read-from-the-idle-column", "bench/hostload.py",
           "STEAL = 7\n", "STEAL = 3\n",
           (U + "test_hostload.py",),
           why="rows would report the host's idle time as time the hypervisor took"),
    Mutant("goodput-not-the-default", "args.py",
           "        elif algo in SUPPORTED_ALGORITHMS:\n", "        elif False:\n",
           (U + "test_args.py",),
           why="--speculative-algorithm EAGLE3 alone would keep speculating at every load"),
    Mutant("default-policy-refuses-instead-of-falling-back", "args.py",
           "        if not config.implicit:\n", "        if True:\n",
           (U + "test_args.py",),
           why="a server the policies cannot serve (topk 2, an mrope model) would stop at start-up "
               "though the operator asked for nothing of this package"),
    # The log readers the GPU assertions rely on.
    Mutant("replays-count-draft-graphs", "testing.py",
           'rf"Decode graph replay: worker=target .* mode={mode} ")', 'rf"Decode graph replay: .* mode={mode} ")',
           (U + "test_log_parsers.py",),
           why="draft replays would inflate the per-mode target replay counts"),
    Mutant("memory-bound-counts-every-batch", "testing.py",
           "if int(q) > 0]", "]",
           (U + "test_log_parsers.py",),
           why="admission would be averaged over batches the load, not memory, limited"),
    Mutant("error-lines-ignored", "testing.py",
           "for m in LOG_ERROR_MARKERS if m in self.log]", "for m in LOG_ERROR_MARKERS if False]",
           (U + "test_log_parsers.py",),
           why="a server that logged a traceback or a leak would pass"),
    Mutant("accept-length-unweighted", "testing.py",
           "return sum(n * a for n, a in batches) / requests",
           "return sum(a for n, a in batches) / len(batches)",
           (U + "test_log_parsers.py",),
           why="tokens per verify would weigh a batch of 1 like a batch of 30"),
    Mutant("client-keeps-idle-connections-past-the-server", "testing.py",
           "connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive)",
           "connector=aiohttp.TCPConnector(limit=0)",
           (U + "test_testing_harness.py::test_client_does_not_send_on_a_connection_the_server_closed",),
           why="a request sent on a connection the server just closed fails before reaching it "
               "(the first full soak lost 18 of 12,603 that way)"),
    # Draft keep-warm (keepwarm.py): acceptance-only defects (tokens stay exact), so the
    # CPU tests hold each; on the GPU test_keep_warm.py's K/V check and bars do.
    Mutant("keep-warm-hidden-before-embeds", "keepwarm.py",
           "x = torch.cat([self.input_layernorm(self.embed(token_ids)), self.hidden_norm(h)], dim=-1)",
           "x = torch.cat([self.hidden_norm(h), self.input_layernorm(self.embed(token_ids))], dim=-1)",
           (U + "test_keep_warm.py",),
           why="the draft layer concatenates embeddings first: the K/V would be another function"),
    Mutant("keep-warm-refreshes-every-request", "keepwarm.py",
           "keep = fresh.unsqueeze(1)", "keep = torch.ones_like(fresh).unsqueeze(1)",
           (U + "test_keep_warm.py",),
           why="a request prefilled during the plain stretch would lose its fresh draft state"),
    Mutant("keep-warm-slot-inherits-a-pending-position", "keepwarm.py",
           "        self.position.index_fill_(0, batch.req_pool_indices, -1)\n\n    def prefill",
           "        pass\n\n    def prefill",
           (U + "test_keep_warm.py",),
           why="a new request in a reused slot would draft from its predecessor's stash"),
    # Host syncs: a Python number assigned through a tensor index is a blocking copy to
    # the GPU (the host waited ~12 ms for the decode step in flight at every speculative
    # prefill on the 8B pair: benchmark/results/2026-12-04-h200-prefill-sync).
    Mutant("keep-warm-prefill-clears-through-an-index", "keepwarm.py",
           "        self.position.index_fill_(0, batch.req_pool_indices, -1)\n",
           "        self.position[batch.req_pool_indices] = -1\n",
           (U + "test_keep_warm.py::test_clearing_stash_positions_copies_no_number_to_the_device",),
           why="every speculative prefill would make the host wait for the forward stream"),
    Mutant("keep-warm-spec-step-clears-through-an-index", "keepwarm.py",
           "        self.position.index_fill_(0, slots, -1)",
           "        self.position[slots] = -1",
           (U + "test_keep_warm.py::test_clearing_stash_positions_copies_no_number_to_the_device",),
           why="every return to speculation would make the host wait for the forward stream"),
    Mutant("keep-warm-graph-padding-writes-stale-slots", "keepwarm.py",
           "            self.loc[n:b].zero_()\n", "",
           (U + "test_keep_warm.py",),
           why="a padded replay would write garbage K/V into slots an earlier, larger step used"),
    Mutant("keep-warm-spec-step-does-not-wait-for-the-side-stream", "keepwarm.py",
           "        # The draft reads the pool the writes fill (and the pass below the stash).\n"
           "        self._fence()\n", "",
           (U + "test_keep_warm.py::test_the_speculative_step_waits_for_the_writes_in_flight",),
           why="the first speculative step could draft over K/V and a stash the side stream has not written yet"),
    Mutant("keep-warm-prefill-does-not-wait-for-the-side-stream", "keepwarm.py",
           "        # (freed by a finished request), and the stash row below.\n        self._fence()\n", "",
           (U + "test_keep_warm.py::test_a_prefill_waits_before_it_clears_a_reused_slot",),
           why="a late write for a finished request would land in the slots and stash row of the new one"),
    Mutant("keep-warm-set-reused-while-its-write-is-in-flight", "keepwarm.py",
           "            self.lane.reuse(graphs)\n", "",
           (U + "test_keep_warm.py::test_writes_on_the_side_stream_stay_in_flight_until_waited_for",),
           why="a step's indices would overwrite the inputs of a write two steps back still reading them"),
    Mutant("keep-warm-fence-leaves-deferred-rows-waiting", "keepwarm.py",
           "        if self.deferred is not None:\n            self.deferred.flush()\n", "",
           (U + "test_keep_warm.py::test_the_speculative_step_writes_the_waiting_steps_first",),
           why="a speculative step after deferred plain steps would draft over K/V not yet written"),
    Mutant("keep-warm-deferred-superseded-kv-rows-stored", "keepwarm.py",
           "keep.writer.store(torch.where(superseded(loc), 0, loc), k, v)", "keep.writer.store(loc, k, v)",
           (U + "test_keep_warm.py::test_a_kv_slot_reused_inside_the_window_ends_with_its_later_row",),
           why="a KV slot freed and reused inside the window would keep either request's row"),
    Mutant("keep-warm-deferred-superseded-stash-rows-written", "keepwarm.py",
           "        slots = torch.where(superseded(slots), keep.dump_slot, slots)\n", "",
           (U + "test_keep_warm.py::test_deferred_writes_wait_for_their_steps_then_land_in_step_order",),
           why="a request's stash row would keep any of its window's steps, not the latest"),
    Mutant("keep-warm-superseded-keeps-the-first-row", "keepwarm.py",
           "(order[:, None] < order[None, :])", "(order[:, None] > order[None, :])",
           (U + "test_keep_warm.py::test_only_the_latest_row_of_a_key_is_kept",),
           why="the earliest step of a slot would land instead of the latest"),
    Mutant("keep-warm-captured-flush-replays-stale-padding-rows", "keepwarm.py",
           "            buf.loc[rows:size].zero_()\n            buf.slots[rows:size].fill_(self.keep.dump_slot)\n",
           "            pass\n",
           (U + "test_keep_warm.py::test_a_captured_flush_aims_its_padding_rows_at_the_padding_slot_and_the_dump_row",),
           why="a captured flush would write an older window's rows again, after the newer ones"),
    Mutant("keep-warm-deferred-window-never-closes", "keepwarm.py",
           "        if len(buf.spans) >= self.steps:\n", "        if False:\n",
           (U + "test_keep_warm.py::test_deferred_writes_wait_for_their_steps_then_land_in_step_order",),
           why="rows would wait until the buffer overflows, not ``steps`` steps"),
    Mutant("keep-warm-deferred-step-overflows-its-buffer", "keepwarm.py",
           "        if self.buffers[self.turn].used + n > self.rows:\n            self.flush()\n", "",
           (U + "test_keep_warm.py::test_a_step_that_would_not_fit_flushes_the_steps_before_it",),
           why="a step larger than the room left would write past the buffer's end"),
    Mutant("keep-warm-deferred-buffer-rewritten-in-flight", "keepwarm.py",
           "        self.lane.reuse(self.buffers[self.turn])\n", "",
           (U + "test_keep_warm.py::test_deferred_buffers_take_turns_on_the_side_stream",),
           why="a step's inputs would overwrite rows a flush on the side stream has not read yet"),
    # A prefill without the draft's extend (keepwarm.KVKeepWarm.prefill and its callers).
    Mutant("plain-prefill-ids-not-shifted", "keepwarm.py",
           "        ids[:-1] = batch.input_ids[1:]\n", "        ids[:] = batch.input_ids\n",
           (U + "test_keep_warm.py::test_a_prefill_writes_every_prompt_position_and_stashes_the_last",),
           why="position i's draft K/V would encode its own token, not the next one, as the draft extend does"),
    Mutant("plain-prefill-positions-one-off", "keepwarm.py",
           "(prefix_lens - ends - 1 + extend_lens)[row_req]", "(prefix_lens - ends + extend_lens)[row_req]",
           (U + "test_keep_warm.py::test_a_prefill_writes_every_prompt_position_and_stashes_the_last",),
           why="rope would rotate every prompt K one position too far"),
    Mutant("plain-prefill-before-the-writes-in-flight", "keepwarm.py",
           "        # prefill's row.\n        self._fence()\n", "",
           (U + "test_keep_warm.py::test_a_plain_prefill_writes_after_the_writes_in_flight",),
           why="a finished request's late write would land over the new request's prompt row and stash"),
    Mutant("plain-prefill-not-pending", "keepwarm.py",
           "        self.pending = True\n        topk = self.draft_pass.topk\n",
           "        topk = self.draft_pass.topk\n",
           (U + "test_keep_warm.py::test_the_first_speculative_step_after_a_plain_prefill_"
                "drafts_from_its_last_position",),
           why="a speculative step right after the prefill would draft from the zero placeholders"),
    Mutant("plain-prefill-while-speculating", "controller.py",
           "drafts = not self.plain_prefill or self.stats.last_speculative is not False",
           "drafts = not self.plain_prefill",
           (U + "test_controller.py",),
           why="low-load prefills would skip the draft's extend and pay a draft pass before their first step"),
    Mutant("plain-prefill-of-embedded-prompts", "scheduler_hooks.py",
           "setattr(self, ctl.BATCH_FLAG, embeds or ctl.current().prefill_drafts())",
           "setattr(self, ctl.BATCH_FLAG, ctl.current().prefill_drafts())",
           (U + "test_kv_accounting.py::test_a_prefill_batch_records_whether_it_runs_the_draft",),
           why="the writer would embed placeholder ids where the draft embeds images or given embeddings"),
    Mutant("plain-prefill-fences-on-the-draft", "worker.py",
           "        self._war_runner = runner  # the keep-warm reads no scheduler buffer after it\n", "",
           (U + "test_worker_plain_step.py::test_a_prefill_runs_the_target_alone_when_the_scheduler_says_so",),
           why="the scheduler would fence its next writes on the draft's last read, an older step's"),
    Mutant("plain-prefill-under-rejection-sampling", "worker.py",
           "\n            and not up.get_spec().speculative_use_rejection_sampling)", ")",
           (U + "test_worker_plain_step.py::test_prefills_skip_the_draft_only_where_the_keep_warm_can_write_them",),
           why="the FutureMap would relay no draft probabilities for the first verify to sample against"),
    Mutant("keep-warm-full-relays-bonus-only", "scheduler_hooks.py",
           " or getattr(batch_result, ctl.RESULT_DRAFT_FLAG, False)", "",
           (U + "test_future_relay.py",),
           why="'full' would compute fresh draft state at every plain step and drop it"),
    # GPU mutants: numerical defects of the plain step that only real attention shows.
    # The GPU suite serves each in the tiny pair's alternate-1-fp32 configuration and
    # requires outputs that differ from the fp32 no-spec server.
    Mutant("gpu-stale-kv-slot", "worker.py",
           "batch.req_pool_indices, seq_lens\n", "batch.req_pool_indices, seq_lens - 1\n", gpu=True,
           why="the bonus token's K/V land on the previous position; position S stays stale"),
    Mutant("gpu-dropped-kv-slot", "worker.py",
           "        ].to(torch.int64)\n", "        ].to(torch.int64) * 0\n", gpu=True,
           why="the bonus token's K/V go to the padding slot and are never read"),
    Mutant("gpu-skipped-rope-position", "worker.py",
           "            result = self._target_worker.forward_batch_generation(",
           "            forward_batch.positions = forward_batch.positions + 1\n"
           "            result = self._target_worker.forward_batch_generation(", gpu=True,
           why="RoPE at position S+1 for the token at S"),
    Mutant("gpu-plain-keeps-spec-reserve", "controller.py",
           "        if speculative:\n            return None\n        return plain_kv_reserve",
           "        return None\n        return plain_kv_reserve", gpu=True,
           why="the effect the admission test guards: always-plain with the speculative reserve"),
)


def by_name(names=None, gpu: bool = False) -> list[Mutant]:
    chosen = [m for m in MUTANTS if m.gpu == gpu]
    if not names:
        return chosen
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown mutant(s): {', '.join(unknown)}; see --list")
    return [known[n] for n in names]


def plant(mutant: Mutant, root: Path) -> Path:
    """A copy of the package under ``root`` with the mutant applied; returns the
    folder to put first on PYTHONPATH."""
    dest = root / mutant.name
    shutil.copytree(PACKAGE, dest / "sglang_adaptive", ignore=shutil.ignore_patterns("__pycache__"))
    target = dest / "sglang_adaptive" / mutant.path
    text = target.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(f"mutant {mutant.name}: its text occurs {count} times in {mutant.path}, not once")
    target.write_text(text.replace(mutant.old, mutant.new))
    return dest


def env_with(path: Path | None, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH", "")) if p)
    return env


def imported_from(env: dict) -> str:
    """Where ``sglang_adaptive`` is imported from under ``env``."""
    out = subprocess.run([sys.executable, "-c", "import sglang_adaptive; print(sglang_adaptive.__file__)"],
                         env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def run_tests(tests, env: dict) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    return proc.returncode, (proc.stdout + proc.stderr)[-3000:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    if args.list:
        for m in MUTANTS:
            print(f"{'gpu' if m.gpu else 'cpu'}  {m.name:40s} {m.path:20s} {m.why}")
        return 0
    mutants = by_name(args.names)
    results, failed = [], False
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        # The unmutated copy must pass the same tests, or a kill proves nothing.
        base_dir = Path(tmp) / "baseline"
        shutil.copytree(PACKAGE, base_dir / "sglang_adaptive", ignore=shutil.ignore_patterns("__pycache__"))
        tests = sorted({t for m in mutants for t in m.tests})
        rc, out = run_tests(tests, env_with(base_dir))
        if rc != 0:
            print(f"baseline: the tests fail without any mutant (rc {rc}):\n{out}")
            return 1
        for m in mutants:
            t0 = time.time()
            env = env_with(plant(m, Path(tmp)))
            where = imported_from(env)
            if not where.startswith(tmp):
                raise SystemExit(f"mutant {m.name}: sglang_adaptive imported from {where}, not the copy")
            rc, out = run_tests(m.tests, env)
            # pytest: 1 = tests failed (killed), 0 = all passed (survived), else an error.
            status = {0: "SURVIVED", 1: "killed"}.get(rc, f"error (pytest rc {rc})")
            failed |= rc != 1
            results.append({"name": m.name, "file": m.path, "tests": list(m.tests), "status": status,
                            "seconds": round(time.time() - t0, 1)})
            print(f"{status:10s} {m.name:40s} {time.time() - t0:5.1f} s", flush=True)
            if rc != 1:
                print(out)
    killed = sum(r["status"] == "killed" for r in results)
    print(f"mutants: {killed} of {len(results)} killed")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
