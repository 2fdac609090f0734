"""The plain step of AdaptiveEAGLEWorker against SGLang's real types, with the target forward stubbed.

What is checked is what a GPU run cannot show directly: the order of events in one
plain step (the scheduler's next prepare waits on the host for ``on_publish``, so it
must come before the forward is enqueued), the rewritten batch the target sees, and
the draft input handed to the FutureMap.
"""

from types import SimpleNamespace as NS

import pytest
import torch

from sglang_adaptive import controller as ctl
from sglang_adaptive.plain_graph import ModeState
from sglang_adaptive.upstream import sglang_symbols as up
from sglang_adaptive.worker import AdaptiveEAGLEWorker


def plain_worker(runner, forward, req_to_token) -> AdaptiveEAGLEWorker:
    """The worker as built on a GPU, minus the GPU: just what a plain step reads."""
    worker = AdaptiveEAGLEWorker.__new__(AdaptiveEAGLEWorker)
    worker._target_worker = NS(model_runner=runner, forward_batch_generation=forward)
    worker._draft_worker = NS(draft_runner="draft-runner")
    worker._war_runner = "draft-runner"
    worker._plain_state = ModeState("plain", "plain-backend", "decode-graphs",
                                    up.SpeculativeAlgorithm.NONE, up.CaptureHiddenMode.LAST)
    worker.req_to_token_pool = NS(req_to_token=req_to_token)
    return worker


def spec_runner():
    return NS(attn_backend="verify-backend", decode_cuda_graph_runner="verify-graphs",
              spec_algorithm=up.SpeculativeAlgorithm.EAGLE3)


def draft_input_of(bonus_tokens: list[int]):
    n = len(bonus_tokens)
    return up.EagleDraftInput(
        bonus_tokens=torch.tensor(bonus_tokens, dtype=torch.int32), topk_p=torch.rand(n, 1),
        topk_index=torch.arange(1, n + 1).view(n, 1), hidden_states=torch.rand(n, 8))


@pytest.fixture
def step(monkeypatch):
    events = []
    runner = spec_runner()

    def init_new(batch, model_runner, **kwargs):
        events.append(("init", model_runner.decode_cuda_graph_runner))
        return NS(batch=batch, **kwargs)

    def forward(batch=None, forward_batch=None):
        b = forward_batch.batch
        events.append(("forward", runner.decode_cuda_graph_runner, runner.spec_algorithm,
                       b.forward_mode, b.input_ids.tolist(), b.out_cache_loc.tolist(),
                       b.seq_lens.tolist(), b.spec_info))
        return up.GenerationBatchResult(next_token_ids=torch.tensor([7, 8, 9]))

    monkeypatch.setattr(up.ForwardBatch, "init_new", staticmethod(init_new))
    req_to_token = torch.arange(3 * 16).reshape(3, 16)
    worker = plain_worker(runner, forward, req_to_token)
    draft_input = draft_input_of([4, 5, 6])
    batch = NS(
        spec_info=draft_input, seq_lens=torch.tensor([5, 9, 2]),
        req_pool_indices=torch.tensor([2, 0, 1]), seq_lens_cpu=torch.tensor([5, 9, 2]),
        seq_lens_sum=16, reqs=[object()] * 3, forward_mode=up.ForwardMode.DECODE,
        is_extend_in_batch=False, spec_algorithm=up.SpeculativeAlgorithm.EAGLE3,
        input_ids=None, out_cache_loc=None,
    )
    setattr(batch, ctl.BATCH_FLAG, False)

    def on_publish(new_seq_lens):
        events.append(("publish", new_seq_lens.tolist()))

    result = worker.forward_batch_generation(batch, on_publish=on_publish)
    return NS(events=events, result=result, draft_input=draft_input, worker=worker,
              runner=runner, req_to_token=req_to_token)


def test_publishes_once_before_the_forward(step):
    kinds = [e[0] for e in step.events]
    assert kinds == ["publish", "init", "forward"]
    assert step.events[0] == ("publish", [6, 10, 3])


def test_target_runs_one_plain_decode_of_the_bonus_tokens(step):
    _, graphs, algorithm, mode, input_ids, out_cache_loc, seq_lens, spec_info = step.events[2]
    assert graphs == "decode-graphs" and algorithm == up.SpeculativeAlgorithm.NONE
    assert mode == up.ForwardMode.DECODE and spec_info is None
    assert input_ids == [4, 5, 6]
    # KV slot of the bonus token: req_to_token[req, S] for each request.
    assert out_cache_loc == [step.req_to_token[2, 5].item(), step.req_to_token[0, 9].item(),
                             step.req_to_token[1, 2].item()]
    assert seq_lens == [6, 10, 3]
    # The speculative bundle is back on the runner afterwards.
    assert step.runner.decode_cuda_graph_runner == "verify-graphs"
    assert step.runner.spec_algorithm == up.SpeculativeAlgorithm.EAGLE3


def test_result_is_marked_plain_and_keeps_the_draft_state(step):
    result, draft_input = step.result, step.draft_input
    assert getattr(result, ctl.RESULT_FLAG) is True
    assert result.speculative_num_draft_tokens == 1
    assert result.new_seq_lens.tolist() == [6, 10, 3]
    nxt = result.next_draft_input
    assert nxt.bonus_tokens.dtype == torch.int32 and nxt.bonus_tokens.tolist() == [7, 8, 9]
    assert nxt.topk_p is draft_input.topk_p and nxt.topk_index is draft_input.topk_index
    assert nxt.hidden_states is draft_input.hidden_states
    # The scheduler's WAR barrier now fences on the target runner's read-done event.
    assert step.worker.war_fastpath_runner is step.runner


@pytest.mark.parametrize("unified_memory", [False, True])
def test_one_publish_per_plain_step_through_the_real_run_batch(monkeypatch, unified_memory):
    """Upstream's overlap branch of Scheduler.run_batch around the real plain step.

    run_batch publishes ``batch.seq_lens + 1`` itself when, after the worker returns
    and still inside _forward_isolation, the batch reads spec_algorithm NONE. A plain
    step that rewrote the scheduler's batch therefore published twice (S+1, then
    S+2) and every request skipped a position per step under overlap.
    """
    import contextlib
    import dataclasses

    from sglang.srt.managers import scheduler as sched_mod

    publishes, write_sets = [], []
    monkeypatch.setattr(up.ForwardBatch, "init_new",
                        staticmethod(lambda batch, model_runner, **kw: NS(batch=batch)))
    worker = plain_worker(
        spec_runner(),
        lambda batch=None, forward_batch=None: up.GenerationBatchResult(next_token_ids=torch.tensor([7, 8])),
        torch.arange(64).reshape(4, 16))

    @dataclasses.dataclass
    class Batch:  # the ScheduleBatch fields run_batch, _forward_isolation and the step touch
        spec_info: object
        seq_lens: object
        req_pool_indices: object
        reqs: list
        forward_mode: object
        spec_algorithm: object
        seq_lens_cpu: object = None
        seq_lens_sum: object = None
        is_extend_in_batch: bool = False
        input_ids: object = None
        out_cache_loc: object = None
        sampling_info: object = None
        return_logprob: bool = False
        return_hidden_states: bool = False
        forward_iter: int = 0
        launch_ts: float = 0.0

    draft_input = draft_input_of([4, 5])
    batch = Batch(spec_info=draft_input, seq_lens=torch.tensor([5, 9]),
                  req_pool_indices=torch.tensor([2, 1]), reqs=[object()] * 2,
                  forward_mode=up.ForwardMode.DECODE, spec_algorithm=up.SpeculativeAlgorithm.EAGLE3)
    setattr(batch, ctl.BATCH_FLAG, False)

    Scheduler = sched_mod.Scheduler
    sched = NS(
        forward_ct=0, scripted_scheduler_hook=None, forward_sleep_time=None, disaggregation_mode=None,
        profiler_manager=NS(_profile_batch_predicate=lambda b: None),
        is_generation=True, enable_overlap=True, _confidence_budget_prepare=None,
        future_map=NS(resolve_seq_lens_cpu=lambda b: None,
                      publish=lambda indices, lens: publishes.append(lens.tolist())),
        forward_stream_ctx=contextlib.nullcontext(), forward_stream=NS(wait_stream=lambda s: None),
        schedule_stream=None, model_worker=worker, batch_record_buf=[None, None], batch_record_ct=0,
        enable_unified_memory=unified_memory,
        token_to_kv_pool_allocator=NS(set_latest_forward_done_event=lambda ev: None,
                                      set_inflight_forward=lambda ev, loc: write_sets.append(loc.tolist())),
        device_module=NS(Event=lambda: NS(record=lambda *a, **k: None)),
        copy_stream=NS(wait_stream=lambda s: None), copy_stream_ctx=contextlib.nullcontext(),
        spec_algorithm=up.SpeculativeAlgorithm.EAGLE3,
        _relay_forward_payload=lambda *a: None, _advance_pending_grammar=lambda *a, **k: None,
        _maybe_report_active_ranks=lambda: None,
    )
    sched._forward_isolation = lambda b, overlap: Scheduler._forward_isolation(sched, b, overlap=overlap)
    sched.record_batch_in_overlap = lambda b: Scheduler.record_batch_in_overlap(sched, b)
    monkeypatch.setattr(sched_mod, "resolve_forward_inputs", lambda b, f: None)
    monkeypatch.setattr(up.GenerationBatchResult, "copy_to_cpu", lambda *a, **k: None)

    result = Scheduler.run_batch(sched, batch)

    assert publishes == [[6, 10]]
    # With the unified KV pool the allocator learns the slots this step writes:
    # req_to_token[2, 5] and req_to_token[1, 9] of the 4 x 16 table.
    assert write_sets == ([[37, 25]] if unified_memory else [])
    assert getattr(result, ctl.RESULT_FLAG) is True
    # The scheduler's batch is as it was, apart from the next draft input it installs.
    assert batch.seq_lens.tolist() == [5, 9] and batch.out_cache_loc is None
    assert batch.spec_algorithm == up.SpeculativeAlgorithm.EAGLE3
    assert batch.spec_info is result.next_draft_input
