"""Plain results through upstream's real process_batch_result_decode (with our hook)."""

from types import SimpleNamespace as NS

import pytest
import torch
from conftest import eagle3_argv

from sglang_adaptive import controller as ctl


@pytest.fixture()
def processor(runtime_args):
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )

    server_args = runtime_args("--skip-tokenizer-init")
    calls = []
    proc = SchedulerBatchResultProcessor(
        is_generation=True, disaggregation_mode=None, server_args=server_args,
        model_config=NS(think_end_ids=None), tree_cache=None, hisparse_coordinator=None,
        req_to_token_pool=None, decode_offload_manager=None, metrics_collector=None,
        draft_worker=None, logprob_result_processor=None, abort_request=None,
        enable_overlap=True, enable_overlap_mlx=False,
        metrics_reporter=NS(
            num_generated_tokens=0, forward_ct_decode=0,
            update_spec_metrics=lambda *a, **k: calls.append("spec_metrics"),
            report_decode_stats=lambda *a, **k: calls.append("report"),
        ),
        token_to_kv_pool_allocator=NS(free_group_begin=lambda: None, free_group_end=lambda: None),
        output_streamer=NS(stream_output=lambda reqs, logprob: calls.append("stream")),
        model_worker=NS(on_verify_complete_cpu=lambda *a, **k: calls.append("adaptive_feedback")),
    )
    return proc, calls


def make_batch(n, max_new_tokens=10, return_logprob=False):
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    reqs = []
    for i in range(n):
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True)
        params.normalize(None)
        req = Req(f"r{i}", "", [1, 2, 3], params, vocab_size=128256, return_logprob=return_logprob)
        req.kv_committed_len = 3
        reqs.append(req)
    batch = ScheduleBatch.__new__(ScheduleBatch)
    batch.__dict__.update(reqs=reqs, spec_algorithm=SpeculativeAlgorithm.EAGLE3,
                          return_logprob=return_logprob, forward_iter=1)
    return batch


def result(logprobs=None, **fields):
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.managers.utils import GenerationBatchResult

    logits = LogitsProcessorOutput(next_token_logits=None, next_token_logprobs=logprobs)
    return GenerationBatchResult(logits_output=logits, **fields)


def test_plain_result_is_one_plain_token_per_request(processor):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    proc, calls = processor
    batch = make_batch(3)
    res = result(next_token_ids=torch.tensor([7, 8, 9]), speculative_num_draft_tokens=1)
    setattr(res, ctl.RESULT_FLAG, True)
    proc.process_batch_result_decode(batch, res)
    assert [list(r.output_ids) for r in batch.reqs] == [[7], [8], [9]]
    assert [r.kv_committed_len for r in batch.reqs] == [4, 4, 4]
    # Not a verify: no verify count, no acceptance statistics, no adaptive feedback.
    assert [r.spec_verify_ct for r in batch.reqs] == [0, 0, 0]
    assert "spec_metrics" not in calls and "adaptive_feedback" not in calls
    assert batch.spec_algorithm is SpeculativeAlgorithm.EAGLE3  # restored


def test_plain_result_skips_requests_that_already_finished(processor):
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    proc, _ = processor
    batch = make_batch(2)
    # Under overlap a request that finished in step N still rides in step N+1.
    batch.reqs[0].finished_reason = FINISH_LENGTH(length=1)
    res = result(next_token_ids=torch.tensor([5, 6]), speculative_num_draft_tokens=1)
    setattr(res, ctl.RESULT_FLAG, True)
    proc.process_batch_result_decode(batch, res)
    assert [list(r.output_ids) for r in batch.reqs] == [[], [6]]
    assert [r.kv_committed_len for r in batch.reqs] == [3, 4]


def test_plain_result_logprobs_have_the_plain_shape(processor):
    proc, _ = processor
    batch = make_batch(2, return_logprob=True)
    # A DECODE forward returns one logprob per request: [bs], not [bs, accepted].
    res = result(next_token_ids=torch.tensor([5, 6]), speculative_num_draft_tokens=1,
                 logprobs=torch.tensor([-0.5, -1.5]))
    setattr(res, ctl.RESULT_FLAG, True)
    proc.process_batch_result_decode(batch, res)
    assert [r.logprob.output_token_logprobs_val for r in batch.reqs] == [[-0.5], [-1.5]]
    assert [r.logprob.output_token_logprobs_idx for r in batch.reqs] == [[5], [6]]


def test_speculative_result_is_processed_as_before(processor):
    proc, calls = processor
    batch = make_batch(2)
    res = result(
        next_token_ids=torch.tensor([11, 12, 13, 0, 21, 0, 0, 0], dtype=torch.int32),
        accept_lens=torch.tensor([3, 1], dtype=torch.int32),
        speculative_num_draft_tokens=4,
    )
    proc.process_batch_result_decode(batch, res)
    assert [list(r.output_ids) for r in batch.reqs] == [[11, 12, 13], [21]]
    assert [r.kv_committed_len for r in batch.reqs] == [6, 4]
    assert [r.spec_verify_ct for r in batch.reqs] == [1, 1]
    assert "spec_metrics" in calls and "adaptive_feedback" in calls


class Grammar:
    """What upstream's result processing calls on a request's grammar."""

    def __init__(self):
        self.accepted, self.finished = [], False

    def accept_token(self, token):
        self.accepted.append(token)

    def is_terminated(self):
        return False


def constrained_batch(n=3):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch = make_batch(n)
    batch.has_grammar, batch.forward_mode = True, ForwardMode.DECODE
    grammars = [Grammar() if i != 1 else None for i in range(n)]  # request 1 is unconstrained
    for req, grammar in zip(batch.reqs, grammars):
        req.grammar = grammar
    return batch, grammars


def plain_result(tokens):
    res = result(next_token_ids=torch.tensor(tokens), speculative_num_draft_tokens=1)
    setattr(res, ctl.RESULT_FLAG, True)
    return res


def test_the_grammar_barrier_advances_a_plain_result_once_and_processing_not_again(processor):
    proc, _ = processor
    batch, grammars = constrained_batch()
    res = plain_result([7, 8, 9])
    synced = []
    # The tokens are read once the result's copy to the host is done.
    res.copy_done = NS(synchronize=lambda: synced.append(list(grammars[0].accepted)))
    # Scheduler._advance_pending_grammar, from inside the next decode step, twice.
    proc.advance_grammar_fsm(res, batch)
    proc.advance_grammar_fsm(res, batch)
    assert grammars[0].accepted == [7] and grammars[2].accepted == [9]
    assert synced == [[]]  # before the grammars moved, and only the first time
    res.copy_done = None
    proc.process_batch_result_decode(batch, res)
    assert grammars[0].accepted == [7] and grammars[2].accepted == [9]
    assert [list(r.output_ids) for r in batch.reqs] == [[7], [8], [9]]
    # Outside that processing, accepting a token advances the grammar again.
    proc._accept_grammar_tokens(batch.reqs[0], 5)
    assert grammars[0].accepted == [7, 5]


def test_processing_advances_a_plain_result_no_barrier_saw(processor):
    proc, _ = processor
    batch, grammars = constrained_batch()
    batch.reqs[2].to_finish = None
    batch.reqs[2].finished_reason = object()  # finished in an earlier step: no token, no advance
    proc.process_batch_result_decode(batch, plain_result([7, 8, 9]))
    assert grammars[0].accepted == [7] and grammars[2].accepted == []
    assert grammars[0].finished is False


def test_a_speculative_result_takes_upstreams_grammar_advance(processor):
    proc, _ = processor
    batch, grammars = constrained_batch()
    res = result(next_token_ids=torch.tensor([7, 70, 8, 80, 9, 90]), speculative_num_draft_tokens=2,
                 accept_lens=torch.tensor([2, 1, 1]))
    proc.advance_grammar_fsm(res, batch)
    assert grammars[0].accepted == [7, 70] and grammars[2].accepted == [9]
    assert res.grammar_retained_tokens == [[7, 70], None, [9]]


def test_worker_choice(parse):
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_adaptive.worker import AdaptiveEAGLEWorker

    algo = SpeculativeAlgorithm.EAGLE3
    on = parse(eagle3_argv("--speculative-disable-batch-threshold", "16"))
    off = parse(eagle3_argv("--speculative-switch-policy", "off"))
    assert algo.create_worker(parse(eagle3_argv())) is AdaptiveEAGLEWorker  # the default policy
    assert algo.create_worker(on) is AdaptiveEAGLEWorker
    assert issubclass(AdaptiveEAGLEWorker, EAGLEWorkerV2)
    assert algo.create_worker(off) is EAGLEWorkerV2


def test_worker_choice_refuses_another_upstream_worker(parse):
    """A policy on a server where SGLang picks another worker class stops start-up."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_adaptive.upstream import UpstreamDriftError

    from sglang_adaptive.args import ATTR

    parsed = parse(eagle3_argv("--speculative-disable-batch-threshold", "16"))
    # What create_worker and the hook read; multi-layer EAGLE is on past the flag
    # check (resolved ServerArgs are read-only), so SGLang picks its multi-layer worker.
    server_args = NS(speculative_algorithm=parsed.speculative_algorithm,
                     enable_multi_layer_eagle=True, **{ATTR: getattr(parsed, ATTR)})
    with pytest.raises(UpstreamDriftError) as e:
        SpeculativeAlgorithm.EAGLE3.create_worker(server_args)
    assert str(e.value) == (
        "sglang_adaptive: --speculative-switch-policy threshold needs SGLang's EAGLEWorkerV2 "
        "for EAGLE3, but SGLang chose MultiLayerEagleWorkerV2."
    )


# -- decode stats -------------------------------------------------------------


@pytest.fixture()
def decode_stats(runtime_args, monkeypatch):
    """Upstream's real SchedulerMetricsReporter.report_decode_stats (hooked) on a
    reporter with metrics off and one log line per call; returns (report, lines)."""
    import time

    from sglang.srt.managers.scheduler_components import metrics_reporter

    runtime_args()
    lines = []
    monkeypatch.setattr(metrics_reporter, "logger", NS(info=lines.append))
    Reporter = metrics_reporter.SchedulerMetricsReporter

    def make(spec_algorithm, forward_ct, accept_tokens):
        reporter = Reporter.__new__(Reporter)
        reporter.__dict__.update(
            scheduler=NS(
                spec_algorithm=spec_algorithm, running_batch=None, waiting_queue=[], forward_ct=5,
                pool_stats_observer=NS(get_pool_stats=lambda: NS(
                    get_decode_usage_msg_parts=lambda: ["#token: 10"])),
                disaggregation_mode=None, server_args=NS(language_only=False),
                kv_events_publisher=NS(publish_kv_events=lambda: None)),
            current_scheduler_metrics_enabled=False, is_stats_logging_rank=True,
            forward_ct_decode=0, decode_log_interval=1, num_generated_tokens=4,
            last_decode_stats_tic=time.perf_counter() - 1.0, step_time_dict={},
            _graph_backend_label="cuda graph", enable_mfu_metrics=False,
            spec_num_forward_ct=forward_ct, spec_num_accept_tokens=accept_tokens,
            spec_num_cap_tokens=0, spec_num_block_accept_tokens=0,
            spec_total_num_accept_tokens=0, spec_total_num_forward_ct=0,
        )
        return reporter

    def report(reporter, function=Reporter.report_decode_stats):
        batch = NS(reqs=[object(), object()], forward_iter=3, batch_size=lambda: 2)
        function(reporter, True, running_batch=batch)

    return NS(make=make, report=report, lines=lines, Reporter=Reporter)


def test_interval_of_plain_batches_reports_as_plain_decode(decode_stats):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    d = decode_stats
    # Upstream alone divides the accepted tokens by zero speculative forwards.
    with pytest.raises(ZeroDivisionError):
        d.report(d.make(SpeculativeAlgorithm.EAGLE3, 0, 0),
                 function=d.Reporter.report_decode_stats.__wrapped__)
    reporter = d.make(SpeculativeAlgorithm.EAGLE3, 0, 0)
    d.report(reporter)
    assert len(d.lines) == 1
    assert d.lines[0].startswith("Decode batch, #running-req: 2, #token: 10, cuda graph: True")
    assert "accept" not in d.lines[0]
    assert reporter.scheduler.spec_algorithm is SpeculativeAlgorithm.EAGLE3  # restored


def test_interval_with_speculative_batches_reports_acceptance(decode_stats):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    d = decode_stats
    reporter = d.make(SpeculativeAlgorithm.EAGLE3, 2, 6)
    d.report(reporter)
    # 6 tokens over 2 verifies; 4 correct drafts of 2 x 3 proposed.
    assert "accept len: 3.00, accept rate: 0.67" in d.lines[0]
    assert (reporter.spec_total_num_forward_ct, reporter.spec_num_forward_ct) == (2, 0)
    assert reporter.scheduler.spec_algorithm is SpeculativeAlgorithm.EAGLE3


def test_decode_stats_hook_restores_the_algorithm_when_upstream_fails():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_adaptive.scheduler_hooks import around_report_decode_stats

    seen = []

    def original(reporter, *args, **kwargs):
        seen.append((reporter.scheduler.spec_algorithm, args, kwargs))
        raise RuntimeError("report failed")

    reporter = NS(scheduler=NS(spec_algorithm=SpeculativeAlgorithm.EAGLE3), spec_num_forward_ct=0)
    with pytest.raises(RuntimeError, match="report failed"):
        around_report_decode_stats(original, reporter, True, running_batch="b")
    assert seen == [(SpeculativeAlgorithm.NONE, (True,), {"running_batch": "b"})]
    assert reporter.scheduler.spec_algorithm is SpeculativeAlgorithm.EAGLE3


def test_decode_stats_pass_through_on_a_server_without_speculation(decode_stats):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    d = decode_stats
    reporter = d.make(SpeculativeAlgorithm.NONE, 0, 0)
    d.report(reporter)
    assert "accept" not in d.lines[0] and d.lines[0].startswith("Decode batch, #running-req: 2")
    assert reporter.scheduler.spec_algorithm is SpeculativeAlgorithm.NONE
