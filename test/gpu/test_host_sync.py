"""The keep-warm's bookkeeping on the scheduler's hot path does not make the host wait
for the GPU.

Under the overlap scheduler the host prepares batch N+1 while the GPU runs batch N; a
call that synchronises with the forward stream stalls the host until N has finished
and leaves the GPU idle while N+1 is launched. ``position[idx] = -1`` was one: PyTorch
copies a Python number assigned through an index to the device with a blocking copy.
It ran at every speculative prefill (about 12 ms a prefill on the 8B pair at c=64,
benchmark/results/2026-12-04-h200-prefill-sync). With CUDA's sync debug mode set to
"error", any synchronising call raises; the control shows that the old assignment is
one, so this test fails if the detector stops detecting. On the GPU host:

    ADAPTIVE_GPU_REQUIRED=1 python -m pytest -m gpu test/gpu/test_host_sync.py -v
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace as NS

import pytest
from suite import require_gpu

from sglang_adaptive import keepwarm

pytestmark = pytest.mark.gpu

SLOTS = 16


@contextlib.contextmanager
def no_host_sync(torch):
    """A long kernel queued first, so a sync would wait for it; then any sync raises."""
    torch.cuda._sleep(50_000_000)
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


class Pass:
    topk = 1

    def __call__(self, batch, token_ids, hidden, prefix_lens, prefix_lens_cpu, loc):
        n = token_ids.shape[0]
        return hidden.new_ones(n, 1), token_ids.view(n, 1), hidden, None


def keep_warm(torch):
    writer = NS(hidden_size=4, w_kv=torch.zeros(1, device="cuda"))
    req_to_token = torch.arange(SLOTS * 64, device="cuda").reshape(SLOTS, 64)
    return keepwarm.KVKeepWarm(writer, Pass(), req_to_token, "cuda")


def test_the_old_assignment_is_a_host_sync():
    require_gpu()
    import torch

    position = torch.zeros(SLOTS, dtype=torch.int64, device="cuda")
    with no_host_sync(torch), pytest.raises(RuntimeError, match="synchroniz"):
        position[torch.tensor([3], device="cuda")] = -1


def test_clearing_pending_positions_does_not_wait_for_the_gpu():
    require_gpu()
    import torch

    kw = keep_warm(torch)
    slots = torch.tensor([2, 5], device="cuda")
    kw.position[slots] = torch.tensor([9, 3], device="cuda")  # pending from a plain step
    kw.pending = True
    info = NS(bonus_tokens=torch.tensor([7, 8], dtype=torch.int32, device="cuda"),
              topk_p=torch.zeros(2, 1, device="cuda"), topk_index=torch.zeros(2, 1, dtype=torch.int64, device="cuda"),
              hidden_states=torch.zeros(2, 4, device="cuda"), draft_probs=None)
    spec = NS(req_pool_indices=slots, seq_lens=torch.tensor([10, 4], device="cuda"), seq_lens_cpu=None,
              spec_info=info)
    prefill = NS(req_pool_indices=torch.tensor([7], device="cuda"))  # a list to the GPU: a sync
    with no_host_sync(torch):
        kw.on_prefill(prefill)
        kw.before_spec(spec)
    assert (kw.position == -1).all().item()
    assert info.topk_index[:, 0].tolist() == [7, 8], "the pass ran for both requests"
