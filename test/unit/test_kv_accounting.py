"""KV slot accounting of mixed speculative/plain decode, through upstream's own code.

ScheduleBatch.check_decode_mem / new_tokens_required_next_decode /
prepare_for_decode -> eagle_prepare_for_decode run for real (with this package's
hooks); only the GPU kernel that writes slot ids into req_to_token is replaced by
a recorder, since this machine has no GPU. A simulated spec-v2 timeline then checks
the invariant every decode step depends on: the slots allocated to a request cover
every position the in-flight batch and the next batch may write.
"""

import random
from types import SimpleNamespace as NS

import pytest
import torch

from sglang_adaptive import controller as ctl
from sglang_adaptive.policy import AlternatePolicy, ModePolicy, ThresholdPolicy

NUM_DRAFT_TOKENS = 4  # --speculative-num-steps 3, topk 1


class ScriptedPolicy(ModePolicy):
    """Random but reproducible modes; pure between launches like every policy."""

    def __init__(self, seed, uses_costs=False):
        self.rng = random.Random(seed)
        self.next = True
        self.uses_costs = uses_costs  # a policy that reads the step costs is given the context
        self.asked, self.launched = [], []

    def speculate(self, batch_size, context=0):
        self.asked.append((batch_size, context))
        return self.next

    def on_launch(self, speculative, batch_size=1, context=0):
        self.launched.append((batch_size, context))
        self.next = self.rng.random() < 0.5


@pytest.fixture()
def make_batch(runtime_args, monkeypatch):
    import sglang.srt.speculative.eagle_utils as eagle_utils
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runtime_args()
    allocated = {"tokens": 0}

    def record_alloc(tree_cache, req_to_token_pool, *, reqs, nxt_kv_lens_cpu, num_needed_tokens, **_):
        # What upstream's alloc_for_spec_decode does on the host side.
        allocated["tokens"] += num_needed_tokens
        for i, req in enumerate(reqs):
            req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, int(nxt_kv_lens_cpu[i]))

    monkeypatch.setattr(eagle_utils, "alloc_for_spec_decode", record_alloc)

    def make(num_reqs, prompt_len=100, overlap=True, free_tokens=10**9):
        reqs = [NS(kv_committed_len=prompt_len, kv=NS(kv_allocated_len=prompt_len),
                   decode_batch_idx=0, grammar=None) for _ in range(num_reqs)]
        allocator = NS(page_size=1, available_size=lambda: free_tokens)
        tree_cache = NS(supports_swa=lambda: False, is_chunk_cache=lambda: True,
                        token_to_kv_pool_allocator=allocator)
        batch = ScheduleBatch.__new__(ScheduleBatch)
        batch.__dict__.update(
            reqs=reqs, token_to_kv_pool_allocator=allocator, tree_cache=tree_cache,
            spec_algorithm=SpeculativeAlgorithm.EAGLE3, has_grammar=False,
            enable_overlap=overlap, device="cpu", req_to_token_pool=None,
            req_pool_indices=torch.arange(num_reqs), input_embeds=None, forward_mode=None,
            sampling_info=NS(penalizer_orchestrator=NS(is_required=False)),
        )
        return batch, allocated

    return make


def run_timeline(batch, steps, seed, overlap):
    """Drive prepare -> launch -> process like the scheduler and check every step."""
    rng = random.Random(seed)
    true_len = [r.kv_committed_len for r in batch.reqs]  # GPU truth: S before the bonus token
    in_flight = None  # (widths, accepts) of the launched, unprocessed batch
    modes = []
    for _ in range(steps):
        assert batch.check_decode_mem()
        batch.prepare_for_decode()
        spec = getattr(batch, ctl.BATCH_FLAG)
        modes.append(spec)
        width = NUM_DRAFT_TOKENS if spec else 1
        if overlap and in_flight is not None:
            # The previous batch is still running: it may accept its whole width.
            starts = [s + a for s, a in zip(true_len, in_flight)]
        else:
            starts = true_len
        for req, start in zip(batch.reqs, starts):
            assert req.kv.kv_allocated_len >= start + width, (modes, req.kv.kv_allocated_len, start)
        accepts = [rng.randint(1, width) for _ in batch.reqs]
        if overlap:
            if in_flight is not None:  # process the previous batch after launching this one
                for i, req in enumerate(batch.reqs):
                    req.kv_committed_len += in_flight[i]
                    true_len[i] += in_flight[i]
            in_flight = accepts
        else:
            for i, req in enumerate(batch.reqs):
                req.kv_committed_len += accepts[i]
                true_len[i] += accepts[i]
    return modes


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("seed", range(4))
def test_reserve_covers_every_write_across_random_switches(make_batch, overlap, seed):
    batch, _ = make_batch(5, overlap=overlap)
    ctl.install(ctl.AdaptiveModeController(ScriptedPolicy(seed), spec_width=NUM_DRAFT_TOKENS))
    modes = run_timeline(batch, 60, seed, overlap)
    assert True in modes and False in modes


@pytest.mark.parametrize("period", [1, 7])
def test_reserve_covers_every_write_when_alternating(make_batch, period):
    batch, _ = make_batch(3)
    ctl.install(ctl.AdaptiveModeController(AlternatePolicy(period), spec_width=NUM_DRAFT_TOKENS))
    run_timeline(batch, 40, period, overlap=True)


@pytest.mark.parametrize("overlap, reserve", [(True, 2), (False, 1)])
def test_always_plain_keeps_at_most_two_slots_ahead(make_batch, overlap, reserve):
    batch, allocated = make_batch(8, overlap=overlap)
    ctl.install(ctl.AdaptiveModeController(ThresholdPolicy(0), spec_width=NUM_DRAFT_TOKENS))
    run_timeline(batch, 30, 0, overlap)
    for req in batch.reqs:
        assert req.kv.kv_allocated_len - req.kv_committed_len <= reserve
    # One new slot per request per step, as a non-speculative server allocates.
    assert allocated["tokens"] == 8 * 30


def test_the_memory_check_retraction_and_prepare_ask_with_the_context_of_the_batch_they_check(make_batch):
    """A step's cost grows with the tokens of context its batch holds, and the answers
    for one batch must agree: every ask of a step sees its committed lengths."""
    batch, _ = make_batch(5, overlap=True)
    for i, req in enumerate(batch.reqs):
        req.kv_committed_len = req.kv.kv_allocated_len = 100 + 37 * i
    policy = ScriptedPolicy(0, uses_costs=True)
    ctl.install(ctl.AdaptiveModeController(policy, spec_width=NUM_DRAFT_TOKENS))
    rng = random.Random(0)
    for _ in range(12):
        context = sum(r.kv_committed_len for r in batch.reqs)
        policy.asked.clear()
        assert batch.check_decode_mem()
        batch.prepare_for_decode()
        assert policy.asked == [(5, context)] * 2 and policy.launched[-1] == (5, context)
        for req in batch.reqs:  # the step's result, processed
            req.kv_committed_len += rng.randint(1, NUM_DRAFT_TOKENS)
    policy.asked.clear()
    batch.check_decode_mem(selected_indices=[0, 2])
    assert policy.asked == [(2, batch.reqs[0].kv_committed_len + batch.reqs[2].kv_committed_len)]
    # Where nothing reads the step costs, no request is summed.
    plain_policy = ScriptedPolicy(0)
    ctl.install(ctl.AdaptiveModeController(plain_policy, spec_width=NUM_DRAFT_TOKENS))
    batch.check_decode_mem()
    assert plain_policy.asked == [(5, 0)]


def test_memory_check_uses_the_mode_reserve(make_batch):
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode

    batch, _ = make_batch(8, free_tokens=8 * 2)
    ctl.install(ctl.AdaptiveModeController(ThresholdPolicy(4), spec_width=NUM_DRAFT_TOKENS))
    # 8 requests > threshold: plain, 2 slots each fit in 16 free tokens.
    assert batch.check_decode_mem()
    assert get_alloc_reserve_per_decode() == 2 * NUM_DRAFT_TOKENS, "the plain reserve ends with its check"
    # Retraction asks for a subset of 4: speculative, 2 x 4 slots each do not fit.
    assert not batch.check_decode_mem(selected_indices=[0, 1, 2, 3])
    assert get_alloc_reserve_per_decode() == 2 * NUM_DRAFT_TOKENS  # outside a check


def test_static_eagle_is_untouched(make_batch):
    batch, _ = make_batch(6)
    assert not ctl.current().active
    batch.prepare_for_decode()
    assert getattr(batch, ctl.BATCH_FLAG) is True
    assert all(r.kv.kv_allocated_len == 100 + 2 * NUM_DRAFT_TOKENS for r in batch.reqs)


@pytest.mark.parametrize("active,page_size,expect_list", [(True, 1, True), (False, 1, False), (True, 16, False)])
def test_commit_loop_reads_a_list_only_on_adaptive_servers_with_page_size_one(plugins, active, page_size,
                                                                              expect_list):
    # Upstream's own alloc_for_spec_decode (hooked), with nothing to allocate: only its
    # per-request commit loop runs. It must see the same lengths, as a list when the
    # adaptive server can skip the tensor indexing, and untouched otherwise.
    from sglang.srt.mem_cache import allocation

    if active:
        ctl.install(ctl.AdaptiveModeController(ThresholdPolicy(0), spec_width=NUM_DRAFT_TOKENS))
    seen = []
    reqs = [NS(kv=NS(kv_allocated_len=n)) for n in (5, 9, 7)]
    nxt = torch.tensor([8, 9, 12], dtype=torch.int32)
    tree_cache = NS(token_to_kv_pool_allocator=NS(page_size=page_size))
    original_tolist = torch.Tensor.tolist

    def spy(self):
        seen.append("tolist")
        return original_tolist(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.Tensor, "tolist", spy)
        allocation.alloc_for_spec_decode(
            tree_cache, None, reqs=reqs, req_pool_indices=None, cur_kv_lens=None,
            cur_kv_lens_cpu=None, nxt_kv_lens=None, nxt_kv_lens_cpu=nxt, num_needed_tokens=0)
    assert [r.kv.kv_allocated_len for r in reqs] == [8, 9, 12]
    assert (seen == ["tolist"]) is expect_list


@pytest.mark.parametrize("overlap, reserve", [(True, 2), (False, 1)])
def test_kv_audit_reports_the_plain_reserve(make_batch, overlap, reserve):
    batch, _ = make_batch(4, overlap=overlap)
    c = ctl.AdaptiveModeController(ThresholdPolicy(0), spec_width=NUM_DRAFT_TOKENS, audit_kv=True)
    ctl.install(c)
    run_timeline(batch, 12, 0, overlap)
    # Audited after each plain prepare_for_decode: allocated minus committed, which
    # under overlap includes the in-flight step's slot.
    assert c.stats.max_plain_reserve == reserve


def test_batch_of_a_server_without_speculation_is_not_marked(plugins):
    """A non-speculative batch goes straight to upstream: no mode, no count, no reserve."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_adaptive.scheduler_hooks import around_prepare_for_decode

    c = ctl.AdaptiveModeController(ThresholdPolicy(0), spec_width=NUM_DRAFT_TOKENS, audit_kv=True)
    ctl.install(c)
    calls = []
    batch = NS(spec_algorithm=SpeculativeAlgorithm.NONE, reqs=[object()] * 3)
    assert around_prepare_for_decode(lambda b: calls.append(b) or "prepared", batch) == "prepared"
    assert calls == [batch] and not hasattr(batch, ctl.BATCH_FLAG)
    assert (c.stats.spec_batches, c.stats.plain_batches) == (0, 0)


@pytest.mark.parametrize("embeds", [None, "input_embeds", "replace_embeds", "multimodal_inputs"])
def test_a_prefill_batch_records_whether_it_runs_the_draft(plugins, embeds):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_adaptive.scheduler_hooks import after_prepare_for_extend

    c = ctl.AdaptiveModeController(ThresholdPolicy(0), spec_width=NUM_DRAFT_TOKENS, plain_prefill=True)
    ctl.install(c)
    c.on_prepare(False)
    batch = NS(spec_algorithm=SpeculativeAlgorithm.EAGLE3, input_embeds=None, replace_embeds=None,
               multimodal_inputs=[None, None])
    if embeds == "multimodal_inputs":
        batch.multimodal_inputs = [None, object()]
    elif embeds:
        setattr(batch, embeds, torch.zeros(2, 4))
    assert after_prepare_for_extend("prepared", batch) == "prepared"
    # The keep-warm writer embeds token ids: prompts with other embeddings take the draft.
    assert getattr(batch, ctl.BATCH_FLAG) is (embeds is not None)
    assert c.stats.plain_prefills == (embeds is None)
    none = NS(spec_algorithm=SpeculativeAlgorithm.NONE)
    after_prepare_for_extend(None, none)
    assert not hasattr(none, ctl.BATCH_FLAG)
