"""The plain step of AdaptiveEAGLEWorker against SGLang's real types, with the target forward stubbed.

What is checked is what a GPU run cannot show directly: the order of events in one
plain step (the scheduler's next prepare waits on the host for ``on_publish``, so it
must come before the forward is enqueued), the rewritten batch the target sees, and
the draft input handed to the FutureMap.
"""

from types import SimpleNamespace as NS

import pytest
import torch
from conftest import eagle3_argv

from sglang_adaptive import controller as ctl, keepwarm
from sglang_adaptive.plain_graph import ModeState
from sglang_adaptive.upstream import sglang_symbols as up
from sglang_adaptive.worker import AdaptiveEAGLEWorker

# The plain step and the prefill without the draft run on the scheduler's hot path.
pytestmark = pytest.mark.usefixtures("no_number_through_an_index")


def plain_worker(runner, forward, req_to_token) -> AdaptiveEAGLEWorker:
    """The worker as built on a GPU, minus the GPU: just what a plain step reads."""
    worker = AdaptiveEAGLEWorker.__new__(AdaptiveEAGLEWorker)
    worker._target_worker = NS(model_runner=runner, forward_batch_generation=forward)
    worker._draft_worker = NS(draft_runner="draft-runner")
    worker._war_runner = "draft-runner"
    worker._plain_state = ModeState("plain-backend", "decode-graphs",
                                    up.SpeculativeAlgorithm.NONE, up.CaptureHiddenMode.LAST)
    worker.req_to_token_pool = NS(req_to_token=req_to_token)
    worker._keep_warm = keepwarm.NoKeepWarm()
    return worker


def spec_runner():
    return NS(attn_backend="verify-backend", decode_cuda_graph_runner="verify-graphs",
              spec_algorithm=up.SpeculativeAlgorithm.EAGLE3,
              tp_group=NS(rank_in_group=0, broadcast_object=lambda obj, src: obj))


def draft_input_of(bonus_tokens: list[int]):
    n = len(bonus_tokens)
    return up.EagleDraftInput(
        bonus_tokens=torch.tensor(bonus_tokens, dtype=torch.int32), topk_p=torch.rand(n, 1),
        topk_index=torch.arange(1, n + 1).view(n, 1), hidden_states=torch.rand(n, 8))


def run_plain_step(monkeypatch, keep_warm=None, **batch_fields):
    """One plain step of a 3-request batch (S = 5, 9, 2); ``batch_fields`` override
    fields of the scheduler's batch; ``keep_warm(events)`` builds the keep-warm object."""
    events, forward_batches = [], []
    runner = spec_runner()

    def init_new(batch, model_runner, **kwargs):
        events.append(("init", model_runner.decode_cuda_graph_runner))
        forward_batches.append(NS(batch=batch, **kwargs))
        return forward_batches[-1]

    def forward(batch=None, forward_batch=None):
        b = forward_batch.batch
        events.append(("forward", runner.decode_cuda_graph_runner, runner.spec_algorithm,
                       b.forward_mode, b.input_ids.tolist(), b.out_cache_loc.tolist(),
                       b.seq_lens.tolist(), b.spec_info))
        return up.GenerationBatchResult(next_token_ids=torch.tensor([7, 8, 9]))

    monkeypatch.setattr(up.ForwardBatch, "init_new", staticmethod(init_new))
    req_to_token = torch.arange(3 * 16).reshape(3, 16)
    worker = plain_worker(runner, forward, req_to_token)
    if keep_warm is not None:
        worker._keep_warm = keep_warm(events)
    draft_input = draft_input_of([4, 5, 6])
    batch = NS(
        spec_info=draft_input, seq_lens=torch.tensor([5, 9, 2]),
        req_pool_indices=torch.tensor([2, 0, 1]), seq_lens_cpu=torch.tensor([5, 9, 2]),
        seq_lens_sum=16, reqs=[object()] * 3, forward_mode=up.ForwardMode.DECODE,
        is_extend_in_batch=False, spec_algorithm=up.SpeculativeAlgorithm.EAGLE3,
        input_ids=None, out_cache_loc=None, has_grammar=False,
    )
    batch.__dict__.update(batch_fields)
    setattr(batch, ctl.BATCH_FLAG, False)

    def on_publish(new_seq_lens):
        events.append(("publish", new_seq_lens.tolist()))

    result = worker.forward_batch_generation(batch, on_publish=on_publish)
    return NS(events=events, result=result, draft_input=draft_input, worker=worker,
              runner=runner, req_to_token=req_to_token, batch=batch,
              forward_batches=forward_batches)


@pytest.fixture
def step(monkeypatch):
    return run_plain_step(monkeypatch)


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
        has_grammar: bool = False

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


def test_plain_batch_advances_the_host_lengths(step):
    """Backends that plan on the host read seq_lens_cpu and size work from seq_lens_sum."""
    (forward_batch,) = step.forward_batches
    plain = forward_batch.batch
    assert plain.seq_lens_cpu.tolist() == [6, 10, 3]
    assert plain.seq_lens_sum == 16 + 3
    assert forward_batch.capture_hidden_mode == up.CaptureHiddenMode.LAST
    assert forward_batch.return_hidden_states_before_norm is False
    # The scheduler's own batch keeps S.
    assert step.batch.seq_lens_cpu.tolist() == [5, 9, 2] and step.batch.seq_lens_sum == 16


def test_plain_batch_without_host_lengths(monkeypatch):
    step = run_plain_step(monkeypatch, seq_lens_cpu=None, seq_lens_sum=None)
    plain = step.forward_batches[0].batch
    assert plain.seq_lens_cpu is None and plain.seq_lens_sum is None
    assert plain.seq_lens.tolist() == [6, 10, 3]
    assert step.result.new_seq_lens.tolist() == [6, 10, 3]


def test_result_keeps_the_forward_batch_alive(step):
    refs = step.result.extra_keep_alive_refs
    assert len(refs) == 1 and refs[0] is step.forward_batches[0]


@pytest.fixture
def upstream_step(monkeypatch):
    """EAGLEWorkerV2.forward_batch_generation (the speculative step) recorded, not run."""
    calls = []

    def spec_step(self, batch, on_publish=None, grammar_barrier=None):
        calls.append((batch, on_publish, grammar_barrier, self.war_fastpath_runner))
        return "spec-result"

    monkeypatch.setattr(up.EAGLEWorkerV2, "forward_batch_generation", spec_step)
    return calls


def test_speculative_step_after_a_plain_one_fences_on_the_draft_runner(step, upstream_step):
    assert step.worker.war_fastpath_runner is step.runner
    batch = NS(forward_mode=up.ForwardMode.DECODE, is_extend_in_batch=False)
    setattr(batch, ctl.BATCH_FLAG, True)
    publish, barrier = object(), object()
    assert step.worker.forward_batch_generation(batch, publish, barrier) == "spec-result"
    # Reset before the speculative step runs: draft-extend is its last reader.
    assert upstream_step == [(batch, publish, barrier, "draft-runner")]
    assert step.worker.war_fastpath_runner == "draft-runner"


@pytest.mark.parametrize("mode, extend_in_batch, flag", [
    ("EXTEND", False, None),   # a prefill prepare_for_extend did not mark
    ("EXTEND", False, True),   # a prefill that runs the draft's extend
    ("EXTEND", True, False),   # an extend among DP ranks' batches
    ("MIXED", False, False),   # a prefill mixed with decode requests
    ("DECODE", True, False),   # mixed batch with an extend part
    ("DECODE", False, None),   # a batch prepare_for_decode did not mark
])
def test_batches_that_stay_on_the_upstream_path(upstream_step, mode, extend_in_batch, flag):
    forwards = []
    worker = plain_worker(spec_runner(), lambda **kw: forwards.append(kw), torch.zeros(1, 1))
    batch = NS(forward_mode=up.ForwardMode[mode], is_extend_in_batch=extend_in_batch)
    if flag is not None:
        setattr(batch, ctl.BATCH_FLAG, flag)
    assert worker.forward_batch_generation(batch) == "spec-result"
    assert [c[0] for c in upstream_step] == [batch] and forwards == []


# -- draft keep-warm -------------------------------------------------------------


class RecordingKeepWarm(keepwarm.NoKeepWarm):
    def __init__(self, events, fresh=None, reads_after_forward=False):
        self.events, self.fresh, self.reads_after_forward = events, fresh, reads_after_forward

    def before_plain(self, batch, new_seq_lens, loc):
        self.events.append(("before_plain", new_seq_lens.tolist(), loc.tolist()))
        return "state"

    def after_plain(self, state, batch, result):
        self.events.append(("after_plain", state, result.next_token_ids.tolist()))
        return self.fresh

    def before_spec(self, batch):
        self.events.append(("before_spec", batch))

    def on_prefill(self, batch):
        self.events.append(("on_prefill", batch))


def test_keep_warm_gets_its_inputs_before_the_forward_and_runs_after_sampling(monkeypatch):
    s = run_plain_step(monkeypatch, keep_warm=RecordingKeepWarm)
    assert [e[0] for e in s.events] == ["publish", "before_plain", "init", "forward", "after_plain"]
    loc = [s.req_to_token[2, 5].item(), s.req_to_token[0, 9].item(), s.req_to_token[1, 2].item()]
    assert s.events[1] == ("before_plain", [6, 10, 3], loc)
    assert s.events[4] == ("after_plain", "state", [7, 8, 9])
    assert getattr(s.result, ctl.RESULT_DRAFT_FLAG) is False
    assert s.result.next_draft_input.topk_p is s.draft_input.topk_p


def test_fresh_draft_state_of_a_plain_step_rides_on_its_result(monkeypatch):
    fresh = (torch.ones(3, 1), torch.tensor([[1], [2], [3]]), torch.zeros(3, 8), None)
    s = run_plain_step(monkeypatch, keep_warm=lambda ev: RecordingKeepWarm(ev, fresh, reads_after_forward=True))
    nxt = s.result.next_draft_input
    assert nxt.topk_p is fresh[0] and nxt.topk_index is fresh[1] and nxt.hidden_states is fresh[2]
    assert nxt.bonus_tokens.tolist() == [7, 8, 9]
    assert getattr(s.result, ctl.RESULT_DRAFT_FLAG) is True, "the FutureMap must relay all of it"
    # Its draft pass reads req_to_token after the target graph: fence on the whole step.
    assert s.worker.war_fastpath_runner == "draft-runner"


@pytest.mark.parametrize("mode, extend_in_batch, want", [
    ("DECODE", False, "before_spec"), ("EXTEND", False, "on_prefill"), ("DECODE", True, None)])
def test_keep_warm_hears_of_speculative_and_prefill_batches(upstream_step, mode, extend_in_batch, want):
    worker = plain_worker(spec_runner(), None, torch.zeros(1, 1))
    events = []
    worker._keep_warm = RecordingKeepWarm(events)
    batch = NS(forward_mode=up.ForwardMode[mode], is_extend_in_batch=extend_in_batch)
    setattr(batch, ctl.BATCH_FLAG, True)
    assert worker.forward_batch_generation(batch) == "spec-result"
    assert events == ([(want, batch)] if want else [])


# -- construction ----------------------------------------------------------------


@pytest.fixture
def built(parse, monkeypatch):
    """AdaptiveEAGLEWorker.__init__ on upstream's constructor stubbed to the attributes
    it sets (no draft model, no GPU); returns a builder and the rank-0 log lines."""
    logs = []
    monkeypatch.setattr(up, "log_info_on_rank0", lambda logger, msg: logs.append(msg))

    def upstream_init(self, server_args, gpu_id, ps, nccl_port, target_worker, skip=()):
        fields = dict(
            server_args=server_args, topk=server_args.speculative_eagle_topk,
            speculative_num_steps=server_args.speculative_num_steps,
            speculative_num_draft_tokens=server_args.speculative_num_draft_tokens,
            gpu_id=gpu_id, device=server_args.device, _target_worker=target_worker,
            speculative_algorithm=up.SpeculativeAlgorithm.from_string(server_args.speculative_algorithm),
            _draft_worker=NS(draft_runner="draft-runner"),
            _additional_graph_memory_usage={}, _additional_graph_time_usage={},
        )
        self.__dict__.update({k: v for k, v in fields.items() if k not in skip})

    def build(*extra, algorithm="EAGLE3", skip=()):
        argv = [a if a != "EAGLE3" else algorithm for a in eagle3_argv(*extra)]
        monkeypatch.setattr(up.EAGLEWorkerV2, "__init__",
                            lambda self, *a: upstream_init(self, *a, skip=skip))
        target = NS(model_runner=spec_runner())
        return AdaptiveEAGLEWorker(parse(argv), 0, None, 1234, target)

    return NS(build=build, logs=logs)


def test_worker_feeds_verify_results_to_its_policy_and_upstream(built, monkeypatch):
    calls = []
    monkeypatch.setattr(up.EAGLEWorkerV2, "on_verify_complete_cpu",
                        lambda self, nc, batch_size=0: calls.append((list(nc), batch_size)))
    worker = built.build("--speculative-switch-policy", "goodput")
    before = worker.controller.policy.acceptance.expected_tokens()
    worker.on_verify_complete_cpu([3, 3, 3], batch_size=3)
    assert worker.controller.policy.acceptance.expected_tokens() > before
    assert calls == [([3, 3, 3], 3)]


def test_worker_installs_its_controller(built, monkeypatch):
    from sglang_adaptive.worker import AUDIT_KV_ENV

    monkeypatch.delenv(AUDIT_KV_ENV, raising=False)
    worker = built.build("--speculative-disable-batch-threshold", "16", "--decode-log-interval", "7")
    c = worker.controller
    assert ctl.current() is c and c.active
    assert c.speculate(16) is True and c.speculate(17) is False
    assert (c.spec_width, c.log_interval, c.audit_enabled) == (4, 7, False)
    # EAGLE-3 plain graphs capture the aux hidden states the draft reads.
    assert worker._plain_capture_mode == up.CaptureHiddenMode.LAST
    assert worker._plain_state is None and worker.war_fastpath_runner == "draft-runner"
    assert built.logs == [
        "AdaptiveEAGLEWorker active: algorithm=EAGLE3, policy=threshold(speculate while "
        "batch size <= 16), steps=3, topk=1, draft_tokens=4"]


def test_a_constrained_plain_batch_samples_after_the_grammar_barrier(monkeypatch):
    """Upstream's verify order: forward unsampled, barrier (the grammars catch up on
    the batches in flight), then sampling with the mask of the advanced grammars."""
    events = []
    runner = spec_runner()
    runner.sample = lambda logits, fb: events.append(("sample", logits, runner.spec_algorithm)) or torch.tensor([3, 1])

    def forward(batch=None, forward_batch=None, is_verify=False):
        events.append(("forward", is_verify))
        return up.GenerationBatchResult(logits_output="logits")

    monkeypatch.setattr(up.ForwardBatch, "init_new", staticmethod(lambda batch, model_runner, **kw: NS()))
    worker = plain_worker(runner, forward, torch.arange(2 * 16).reshape(2, 16))
    batch = NS(spec_info=draft_input_of([4, 5]), seq_lens=torch.tensor([5, 9]),
               req_pool_indices=torch.tensor([1, 0]), seq_lens_cpu=None, seq_lens_sum=None,
               reqs=[object()] * 2, forward_mode=up.ForwardMode.DECODE, is_extend_in_batch=False,
               spec_algorithm=up.SpeculativeAlgorithm.EAGLE3, input_ids=None, out_cache_loc=None,
               has_grammar=True)
    setattr(batch, ctl.BATCH_FLAG, False)
    result = worker.forward_batch_generation(batch, on_publish=lambda lens: None,
                                             grammar_barrier=lambda: events.append(("barrier",)))
    assert events == [("forward", True), ("barrier",), ("sample", "logits", up.SpeculativeAlgorithm.NONE)]
    assert result.next_token_ids.tolist() == [3, 1]
    assert result.next_draft_input.bonus_tokens.tolist() == [3, 1]
    # Without overlap there is no barrier (nothing in flight); sampling still masks.
    events.clear()
    worker.forward_batch_generation(batch, on_publish=lambda lens: None, grammar_barrier=None)
    assert [e[0] for e in events] == ["forward", "sample"]


def test_plain_grammar_is_on_unless_turned_off(built, monkeypatch):
    from sglang_adaptive.worker import PLAIN_GRAMMAR_ENV

    assert built.build("--speculative-disable-batch-threshold", "0").controller.plain_grammar is True
    monkeypatch.setenv(PLAIN_GRAMMAR_ENV, "0")
    assert built.build("--speculative-disable-batch-threshold", "0").controller.plain_grammar is False


def test_worker_for_eagle_with_the_kv_audit(built, monkeypatch):
    from sglang_adaptive.worker import AUDIT_KV_ENV

    monkeypatch.setenv(AUDIT_KV_ENV, "1")
    worker = built.build("--speculative-disable-batch-threshold", "0", algorithm="EAGLE")
    assert worker.controller.audit_enabled is True
    # EAGLE drafts from the last hidden state only: no aux states to capture.
    assert worker._plain_capture_mode == up.CaptureHiddenMode.NULL


def test_worker_stops_when_upstream_constructor_drifted(built):
    from sglang_adaptive.upstream import UpstreamDriftError

    with pytest.raises(UpstreamDriftError,
                       match=r"EAGLEWorkerV2 instance\._additional_graph_time_usage does not exist"):
        built.build("--speculative-disable-batch-threshold", "16",
                    skip=("_additional_graph_time_usage",))
    assert not ctl.current().active


def test_cuda_graphs_add_the_plain_set_after_upstream_ones(built, monkeypatch):
    import sglang_adaptive.worker as worker_mod

    worker = built.build("--speculative-disable-batch-threshold", "16")
    events = []
    state = ModeState("plain-backend", NS(capture_bs=[4, 1, 2]),
                      up.SpeculativeAlgorithm.NONE, up.CaptureHiddenMode.LAST)

    def build_plain_state(model_runner, capture_hidden_mode, *, device, gpu_id, capture):
        events.append(("plain", model_runner, capture_hidden_mode, device, gpu_id, capture))
        return state, 1.25, 3.5

    monkeypatch.setattr(up.EAGLEWorkerV2, "init_cuda_graphs", lambda self: events.append("upstream"))
    monkeypatch.setattr(worker_mod, "build_plain_state", build_plain_state)
    kept_warm = keepwarm.FullKeepWarm(None)
    monkeypatch.setattr(keepwarm, "make_keep_warm",
                        lambda requested, w, sizes: events.append(("keep-warm", requested, w, sizes)) or kept_warm)
    worker.init_cuda_graphs()
    # Upstream's verify and draft graphs first: the plain set gets its own backend.
    assert events == ["upstream", ("plain", worker._target_worker.model_runner,
                                   up.CaptureHiddenMode.LAST, "cpu", 0, True), ("keep-warm", None, worker, [1, 2, 4])]
    assert worker._plain_state is state and worker._keep_warm is kept_warm
    assert worker._additional_graph_memory_usage == {"plain_decode": 1.25}
    assert worker._additional_graph_time_usage == {"plain_decode": 3.5}
    assert built.logs[-2:] == ["AdaptiveEAGLE plain DECODE set built: batch sizes [1, 2, 4], "
                               "capture_hidden=LAST, mem=1.250 GB, time=3.5 s",
                               "AdaptiveEAGLE draft keep-warm: full, stash=0.0 MiB, eager"]


@pytest.mark.parametrize("mode, built_plain, kept_warm", [
    ("worker-only", [True], "full"), ("backend-only", [False], "none"), ("bare", [], "none")])
def test_diagnostic_modes_leave_upstreams_controller_and_build_less(built, monkeypatch, mode, built_plain,
                                                                    kept_warm):
    """SGLANG_ADAPTIVE_DIAG: every batch speculates (the scheduler asks upstream's
    controller) while the worker holds all, some or none of its plain-mode resources."""
    import sglang_adaptive.worker as worker_mod

    monkeypatch.setenv("SGLANG_ADAPTIVE_DIAG", mode)
    worker = built.build("--speculative-disable-batch-threshold", "100000")
    assert not ctl.current().active and ctl.current() is not worker.controller
    assert built.logs[-1].endswith(f"; diagnostic SGLANG_ADAPTIVE_DIAG={mode}: every batch speculates")
    captures = []
    monkeypatch.setattr(up.EAGLEWorkerV2, "init_cuda_graphs", lambda self: None)
    monkeypatch.setattr(worker_mod, "build_plain_state", lambda *a, capture, **k: captures.append(capture) or (
        ModeState("plain-backend", None, up.SpeculativeAlgorithm.NONE, up.CaptureHiddenMode.LAST), 0.0, 0.0))
    monkeypatch.setattr(keepwarm, "make_keep_warm", lambda *a: keepwarm.FullKeepWarm(None))
    worker.init_cuda_graphs()
    assert captures == built_plain and worker._keep_warm.name == kept_warm
    assert (worker._plain_state is not None) == bool(built_plain)


def test_an_eagle_server_keeps_no_draft_warm(built, monkeypatch):
    import sglang_adaptive.worker as worker_mod

    worker = built.build("--speculative-disable-batch-threshold", "16", algorithm="EAGLE")
    monkeypatch.setattr(up.EAGLEWorkerV2, "init_cuda_graphs", lambda self: None)
    monkeypatch.setattr(worker_mod, "build_plain_state", lambda *a, **k: (
        ModeState("b", None, up.SpeculativeAlgorithm.NONE, up.CaptureHiddenMode.NULL), 0.0, 0.0))
    monkeypatch.setattr(keepwarm, "make_keep_warm", lambda *a: pytest.fail("EAGLE drafts are not kept warm"))
    worker.init_cuda_graphs()
    assert worker._keep_warm.name == "none"


def test_attention_backends_include_the_plain_one():
    """The scheduler decides the seq_lens_cpu copy from every backend a step may use."""
    worker = plain_worker(NS(attn_backend="verify-backend"), None, None)
    worker._draft_worker = NS(draft_attn_backend="draft-backend", draft_extend_attn_backend=None,
                              draft_runner=NS(attn_backend="draft-runner-backend"))
    assert worker.spec_v2_attn_backends == (
        "verify-backend", "draft-backend", "draft-runner-backend", "plain-backend")
    worker._plain_state = None  # before init_cuda_graphs
    assert worker.spec_v2_attn_backends == ("verify-backend", "draft-backend", "draft-runner-backend")


class PrefillKeepWarm(keepwarm.NoKeepWarm):
    writes_prefill = True

    def __init__(self, events):
        self.events = events

    def prefill(self, batch, aux, next_token_ids):
        self.events.append(("keep-warm prefill", aux.tolist(), next_token_ids.tolist()))
        return torch.full((2, 1), 0.5), torch.full((2, 1), 3), torch.full((2, 8), 2.0)

    def on_prefill(self, batch):
        self.events.append("keep-warm on_prefill")


@pytest.mark.parametrize("drafts", [False, True])
def test_a_prefill_runs_the_target_alone_when_the_scheduler_says_so(monkeypatch, drafts):
    events = []
    runner = spec_runner()

    def forward(batch, capture_hidden_mode=None):
        events.append(("target", batch, capture_hidden_mode))
        return up.GenerationBatchResult(logits_output=NS(hidden_states=torch.ones(3, 2)),
                                        next_token_ids=torch.tensor([7, 8]))

    monkeypatch.setattr(up.EAGLEWorkerV2, "forward_batch_generation",
                        lambda self, batch, on_publish=None, grammar_barrier=None: events.append("upstream"))
    worker = plain_worker(runner, forward, None)
    worker._keep_warm = PrefillKeepWarm(events)
    batch = NS(forward_mode=up.ForwardMode.EXTEND, is_extend_in_batch=False, seq_lens=torch.tensor([2, 1]))
    setattr(batch, ctl.BATCH_FLAG, drafts)
    result = worker.forward_batch_generation(batch, on_publish=lambda lens: events.append(("publish", lens.tolist())))
    if drafts:
        assert events == ["keep-warm on_prefill", "upstream"]
        assert worker.war_fastpath_runner == "draft-runner", "the draft's extend reads last"
        return
    # As upstream's prefill: every position's aux hidden states, the prompt length
    # published once the target is enqueued, then the draft's K/V.
    assert events == [("target", batch, up.CaptureHiddenMode.FULL), ("publish", [2, 1]),
                      ("keep-warm prefill", [[1.0, 1.0]] * 3, [7, 8])]
    nxt = result.next_draft_input
    assert nxt.bonus_tokens.tolist() == [7, 8] and nxt.topk_index.tolist() == [[3], [3]]
    assert nxt.topk_p.tolist() == [[0.5], [0.5]] and nxt.hidden_states.shape == (2, 8)
    assert result.new_seq_lens.tolist() == [2, 1]
    assert worker.war_fastpath_runner is runner, "the target reads the scheduler's buffers last"


@pytest.mark.parametrize("rejection, env, plain_prefill", [
    (False, None, True), (False, "0", False), (True, None, False)])
def test_prefills_skip_the_draft_only_where_the_keep_warm_can_write_them(built, monkeypatch, rejection, env,
                                                                          plain_prefill):
    import sglang_adaptive.worker as worker_mod

    worker = built.build("--speculative-disable-batch-threshold", "16")
    monkeypatch.setattr(up.EAGLEWorkerV2, "init_cuda_graphs", lambda self: None)
    monkeypatch.setattr(worker_mod, "build_plain_state", lambda *a, **k: (
        ModeState("b", NS(capture_bs=[1]), up.SpeculativeAlgorithm.NONE, up.CaptureHiddenMode.LAST), 0.0, 0.0))
    monkeypatch.setattr(keepwarm, "make_keep_warm", lambda *a: PrefillKeepWarm([]))
    monkeypatch.setattr(up, "get_spec", lambda: NS(speculative_use_rejection_sampling=rejection))
    if env is None:
        monkeypatch.delenv(worker_mod.PLAIN_PREFILL_ENV, raising=False)
    else:
        monkeypatch.setenv(worker_mod.PLAIN_PREFILL_ENV, env)
    worker.init_cuda_graphs()
    # Rejection sampling relays draft probabilities the keep-warm's prefill has none of.
    assert worker.controller.plain_prefill is plain_prefill
    assert built.logs[-1].endswith("; prefills while plain write the draft's K/V only") is plain_prefill
