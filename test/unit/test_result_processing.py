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


def test_worker_choice(parse):
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_adaptive.worker import AdaptiveEAGLEWorker

    algo = SpeculativeAlgorithm.EAGLE3
    on = parse(eagle3_argv("--speculative-disable-batch-threshold", "16"))
    off = parse(eagle3_argv())
    assert algo.create_worker(on) is AdaptiveEAGLEWorker
    assert issubclass(AdaptiveEAGLEWorker, EAGLEWorkerV2)
    assert algo.create_worker(off) is EAGLEWorkerV2
