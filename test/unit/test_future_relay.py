"""A plain batch through upstream's real FutureMap (CPU): only the bonus token moves.

Gathering a plain batch's draft extras and stashing them back after the step
writes each row with its own values, so the hooks skip both; these tests hold the
skip to that identity: a later speculative batch resolves exactly what the last
speculative step stashed, the plain step's sampled tokens arrive, and a
speculative batch still moves everything.
"""

from types import SimpleNamespace as NS

import pytest
import torch

from sglang_adaptive import controller as ctl

POOL = 8


class _Rows(torch.Tensor):
    def record_stream(self, stream):  # a CUDA-stream call that a CPU tensor cannot take
        pass


ROWS = torch.tensor([2, 5, 7]).as_subclass(_Rows)


def gather_rows(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
    """What upstream's Triton gather_spec_extras returns, in torch (CPU has no Triton)."""
    rows = indices.as_subclass(torch.Tensor)
    hidden = None if hidden_states_buf is None else hidden_states_buf[rows]
    return topk_p_buf[rows], topk_index_buf[rows], output_tokens_buf[rows], hidden


@pytest.fixture()
def future_map(runtime_args, monkeypatch):
    from sglang.srt.managers import overlap_utils
    from sglang.srt.managers.overlap_utils import FutureMap

    monkeypatch.setattr(overlap_utils, "gather_spec_extras", gather_rows)
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runtime_args()  # EAGLE-3 server args: the map relays top-k and hidden states
    fmap = FutureMap(torch.device("cpu"), SpeculativeAlgorithm.EAGLE3,
                     NS(req_to_token=torch.zeros(POOL, 16, dtype=torch.int32)))
    return fmap


def draft_input(seed: int):
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    g = torch.Generator().manual_seed(seed)
    return EagleDraftInput(
        bonus_tokens=torch.randint(0, 100, (3,), generator=g),
        topk_p=torch.rand(3, 1, generator=g), topk_index=torch.randint(0, 100, (3, 1), generator=g),
        hidden_states=torch.rand(3, 6, generator=g),
    )


def stash(fmap, draft=None, tokens=None, plain=False, fresh_draft=False):
    """Upstream's Scheduler._relay_forward_payload (hooked) on a stand-in scheduler."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    res = GenerationBatchResult(next_token_ids=tokens, next_draft_input=draft)
    if plain:
        setattr(res, ctl.RESULT_FLAG, True)
        setattr(res, ctl.RESULT_DRAFT_FLAG, fresh_draft)
    Scheduler._relay_forward_payload(NS(spec_algorithm=SpeculativeAlgorithm.EAGLE3, future_map=fmap),
                                     ROWS, res)
    return res


def resolve(fmap, speculative: bool):
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    spec_info = draft_input(99)  # stale values: what a resolve must overwrite
    spec_info.future_indices = ROWS
    batch = ScheduleBatch.__new__(ScheduleBatch)
    batch.__dict__.update(spec_info=spec_info)
    setattr(batch, ctl.BATCH_FLAG, speculative)
    fmap._resolve_spec_extras(batch)
    return spec_info


def test_a_plain_step_moves_the_bonus_token_and_keeps_the_draft_extras(plugins, future_map):
    spec = draft_input(1)
    stash(future_map, spec)
    # Only the batch's rows: the rest of each buffer is uninitialized memory.
    rows = ROWS.as_subclass(torch.Tensor)
    extras = {k: getattr(future_map, k)[rows].clone() for k in ("topk_p_buf", "topk_index_buf", "hidden_states_buf")}

    got = resolve(future_map, speculative=False)
    assert torch.equal(got.bonus_tokens, spec.bonus_tokens)
    assert torch.equal(got.topk_p, draft_input(99).topk_p), "a plain batch gathered the draft extras"

    sampled = torch.tensor([11, 12, 13])
    res = stash(future_map, draft_input(3), tokens=sampled, plain=True)
    assert res.next_draft_input is not None, "the hook must hand the result back as it got it"
    for name, before in extras.items():
        assert torch.equal(getattr(future_map, name)[rows], before), f"a plain step rewrote {name}"

    after = resolve(future_map, speculative=True)
    assert torch.equal(after.bonus_tokens, sampled)
    assert torch.equal(after.topk_p, spec.topk_p) and torch.equal(after.topk_index, spec.topk_index)
    assert torch.equal(after.hidden_states, spec.hidden_states)
    assert future_map.need_topk and future_map.need_hidden_states, "the skip must not outlive its batch"


def test_a_speculative_step_still_relays_everything(plugins, future_map):
    stash(future_map, draft_input(1))
    newer = draft_input(2)
    stash(future_map, newer)
    got = resolve(future_map, speculative=True)
    for name in ("bonus_tokens", "topk_p", "topk_index", "hidden_states"):
        assert torch.equal(getattr(got, name), getattr(newer, name)), name


def test_a_plain_step_with_fresh_draft_state_relays_all_of_it(plugins, future_map):
    """Keep-warm 'full': the plain step ran the draft, its top-k and hidden state
    must reach the next speculative step."""
    stash(future_map, draft_input(1))
    fresh = draft_input(4)
    stash(future_map, fresh, tokens=fresh.bonus_tokens, plain=True, fresh_draft=True)
    got = resolve(future_map, speculative=True)
    for name in ("bonus_tokens", "topk_p", "topk_index", "hidden_states"):
        assert torch.equal(getattr(got, name), getattr(fresh, name)), name
