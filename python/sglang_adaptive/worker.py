"""AdaptiveEAGLEWorker: EAGLE/EAGLE3 speculation or true plain decode, per decode batch.

The scheduler decides the mode (``scheduler_hooks``) and records it on the batch;
this worker only follows it. A speculative batch runs upstream's
``EAGLEWorkerV2.forward_batch_generation`` unchanged. A plain batch runs the target
once, in DECODE mode, through its own CUDA graph set (``plain_graph``): no draft
model, no verify tree, no verify sampling.

Spec-v2 conventions a plain step keeps (see docs/design.md):
- ``batch.seq_lens`` = S is the length *before* the bonus token; the bonus token is
  the input, written to KV slot ``req_to_token[req, S]`` (gathered on the GPU: under
  the overlap scheduler S is only known there), at position S.
- ``on_publish`` fires exactly once with ``new_seq_lens = S + 1``, before the
  forward is enqueued (the lengths do not depend on its output).
- The result carries a full ``EagleDraftInput``: the sampled token as the next bonus
  token, and the draft state (top-k, draft hidden state) it received, passed on
  unchanged, so the FutureMap keeps its shapes and the next speculative step has a
  valid, if older, draft input; what the plain step does for the draft (write its
  K/V, or run its extend) is ``keepwarm``'s, chosen by --speculative-draft-keep-warm.
"""

from __future__ import annotations

import copy
import logging
import os

import torch

from sglang_adaptive import controller as ctl, decisions, keepwarm, telemetry, upstream
from sglang_adaptive.args import DIAG_ENV, diag_mode, get_config
from sglang_adaptive.plain_graph import ModeState, build_plain_state, captured_batch_sizes, installed
from sglang_adaptive.policy import make_policy
from sglang_adaptive.upstream import sglang_symbols as up

logger = logging.getLogger(__name__)

AUDIT_KV_ENV = "SGLANG_ADAPTIVE_AUDIT_KV"
# "0" keeps batches with grammar-constrained requests speculative instead of decoding
# them plain with the grammar mask (the default since test/gpu/test_grammar_plain.py
# passed on a GPU): a way back if a grammar backend misbehaves in plain batches.
PLAIN_GRAMMAR_ENV = "SGLANG_ADAPTIVE_PLAIN_GRAMMAR"
# "0" runs the draft's extend at every prefill, as upstream, also while decode runs
# plain (where by default the keep-warm writes the prompt's draft K/V instead).
PLAIN_PREFILL_ENV = "SGLANG_ADAPTIVE_PLAIN_PREFILL"


class AdaptiveEAGLEWorker(up.EAGLEWorkerV2):
    def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, ps, nccl_port, target_worker)
        upstream.check_instance(self, upstream.WORKER_ATTRIBUTES, "EAGLEWorkerV2 instance")
        config = get_config(server_args)
        runner = self._target_worker.model_runner
        upstream.check_instance(runner, upstream.TARGET_RUNNER_ATTRIBUTES, "target ModelRunner instance")
        tp_group = runner.tp_group
        self.controller = ctl.AdaptiveModeController(
            make_policy(config, num_steps=self.speculative_num_steps),
            spec_width=up.get_alloc_len_per_decode(server_args),
            log_interval=server_args.decode_log_interval,
            audit_kv=os.environ.get(AUDIT_KV_ENV, "0") == "1",
            # Rank 0's step costs on every rank: the ranks must decide alike.
            share=lambda table: tp_group.broadcast_object(table, src=0),
            cost_table_path=config.cost_table_path,
            writes_table=tp_group.rank_in_group == 0,
            telemetry=telemetry.make_telemetry(server_args, tp_group.rank_in_group),
            decisions=decisions.make_decision_log(tp_group.rank_in_group == 0),
            plain_grammar=os.environ.get(PLAIN_GRAMMAR_ENV, "1") != "0",
        )
        self._diag = diag_mode()
        if not self._diag:
            ctl.install(self.controller)
        # EAGLE-3 drafts from the target's packed aux hidden states; keep the plain
        # graphs able to hand them over (draft continuity builds on it).
        self._plain_capture_mode = (
            up.CaptureHiddenMode.LAST
            if self.speculative_algorithm.is_eagle3()
            else up.CaptureHiddenMode.NULL
        )
        self._plain_state: ModeState | None = None
        self._keep_warm_request = config.keep_warm
        # Built with the graphs (init_cuda_graphs): the draft model and pools exist then.
        self._keep_warm: keepwarm.NoKeepWarm = keepwarm.NoKeepWarm()
        # The runner whose read-done event fences the scheduler's next writes: the
        # draft runner after a speculative step (draft-extend reads last), the
        # target runner after a plain one.
        self._war_runner = self._draft_worker.draft_runner
        up.log_info_on_rank0(
            logger,
            f"AdaptiveEAGLEWorker active: algorithm={server_args.speculative_algorithm}, "
            f"policy={self.controller.policy.describe()}, steps={self.speculative_num_steps}, "
            f"topk={self.topk}, draft_tokens={self.speculative_num_draft_tokens}"
            + (f"; diagnostic {DIAG_ENV}={self._diag}: every batch speculates" if self._diag else ""),
        )

    # -- graphs ---------------------------------------------------------------

    def init_cuda_graphs(self):
        super().init_cuda_graphs()
        if self._diag == "bare":
            return
        self._plain_state, mem_gib, seconds = build_plain_state(
            self._target_worker.model_runner,
            self._plain_capture_mode,
            device=self.device,
            gpu_id=self.gpu_id,
            capture=self._diag != "backend-only",
        )
        self._additional_graph_memory_usage["plain_decode"] = mem_gib
        self._additional_graph_time_usage["plain_decode"] = seconds
        up.log_info_on_rank0(
            logger,
            f"AdaptiveEAGLE plain DECODE set built: batch sizes "
            f"{captured_batch_sizes(self._plain_state)}, capture_hidden="
            f"{self._plain_capture_mode.name}, mem={mem_gib:.3f} GB, time={seconds:.1f} s",
        )
        if self._diag == "backend-only":
            return
        # EAGLE (not EAGLE-3) drafts read the target's last hidden state, which the plain
        # graphs do not keep (args.check_combination refuses an explicit strategy there).
        if self.speculative_algorithm.is_eagle3():
            self._keep_warm = keepwarm.make_keep_warm(
                self._keep_warm_request, self, captured_batch_sizes(self._plain_state))
        # Rejection sampling carries draft probabilities the keep-warm's prefill leaves out.
        self.controller.plain_prefill = (
            self._keep_warm.writes_prefill and os.environ.get(PLAIN_PREFILL_ENV, "1") != "0"
            and not up.get_spec().speculative_use_rejection_sampling)
        up.log_info_on_rank0(
            logger,
            f"AdaptiveEAGLE draft keep-warm: {self._keep_warm.name}, "
            f"stash={self._keep_warm.stash_bytes / 2**20:.1f} MiB, {self._keep_warm.describe_graphs()}"
            + ("; prefills while plain write the draft's K/V only" if self.controller.plain_prefill else ""),
        )

    @property
    def war_fastpath_runner(self):
        return self._war_runner

    @property
    def spec_v2_attn_backends(self) -> tuple:
        plain = (self._plain_state.attn_backend,) if self._plain_state is not None else ()
        return super().spec_v2_attn_backends + plain

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):
        # Upstream's acceptance feed, called in result processing of every
        # speculative batch with the accepted drafts per request already on the host.
        self.controller.on_verify(num_correct_drafts_per_req)
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)

    # -- forward --------------------------------------------------------------

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        decode = batch.forward_mode.is_decode() and not batch.is_extend_in_batch
        if decode and not getattr(batch, ctl.BATCH_FLAG, True):
            return self._forward_plain(batch, on_publish, grammar_barrier)
        if (batch.forward_mode == up.ForwardMode.EXTEND and not batch.is_extend_in_batch
                and not getattr(batch, ctl.BATCH_FLAG, True)):
            return self._prefill_plain(batch, on_publish)
        self._war_runner = self._draft_worker.draft_runner
        if decode:
            self._keep_warm.before_spec(batch)
        elif batch.forward_mode.is_extend():
            self._keep_warm.on_prefill(batch)
        return super().forward_batch_generation(
            batch, on_publish=on_publish, grammar_barrier=grammar_barrier
        )

    def _prefill_plain(self, batch, on_publish):
        """A prefill of the target alone (``ModeController.prefill_drafts``): the
        keep-warm writes the draft's K/V of the prompt instead of the draft's extend.
        The spec-v2 conventions of upstream's prefill hold: the target captures every
        position's aux hidden states, the next step expects the prompt's length, and
        it is published once the target is enqueued."""
        runner = self._target_worker.model_runner
        self._war_runner = runner  # the keep-warm reads no scheduler buffer after it
        result = self._target_worker.forward_batch_generation(batch, capture_hidden_mode=up.CaptureHiddenMode.FULL)
        result.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        topk_p, topk_index, hidden = self._keep_warm.prefill(
            batch, result.logits_output.hidden_states, result.next_token_ids)
        result.next_draft_input = up.EagleDraftInput(
            topk_p=topk_p, topk_index=topk_index, hidden_states=hidden, bonus_tokens=result.next_token_ids,
            num_tokens_per_req=1, num_tokens_for_logprob_per_req=1,
        )
        return result

    def _forward_plain(self, batch, on_publish, grammar_barrier=None):
        runner = self._target_worker.model_runner
        keep_warm = self._keep_warm
        self._war_runner = self._draft_worker.draft_runner if keep_warm.reads_after_forward else runner
        draft_input = batch.spec_info
        seq_lens = batch.seq_lens
        new_seq_lens = seq_lens + 1
        # Publish before the forward. The scheduler's next prepare blocks on the host
        # until the step's publish has executed (FutureMap.resolve_seq_lens_cpu). A
        # verify step publishes after verify because its lengths depend on
        # acceptance; a plain step's are known now.
        if on_publish is not None:
            on_publish(new_seq_lens)

        # The plain decode runs on a shallow copy of the batch: the scheduler keeps
        # reading its own batch inside the same _forward_isolation block, and
        # run_batch publishes ``seq_lens + 1`` itself when it finds spec_algorithm
        # NONE there. Rewriting the scheduler's batch made every plain step publish
        # twice (S+1, then S+2), so each request skipped a position per step under
        # the overlap scheduler.
        plain = copy.copy(batch)
        plain.input_ids = draft_input.bonus_tokens.to(torch.int64)
        plain.out_cache_loc = self.req_to_token_pool.req_to_token[
            batch.req_pool_indices, seq_lens
        ].to(torch.int64)
        plain.seq_lens = new_seq_lens
        if batch.seq_lens_cpu is not None:
            plain.seq_lens_cpu = batch.seq_lens_cpu + 1
        if batch.seq_lens_sum is not None:
            plain.seq_lens_sum = batch.seq_lens_sum + len(batch.reqs)
        plain.forward_mode = up.ForwardMode.DECODE
        plain.spec_info = None
        plain.spec_algorithm = up.SpeculativeAlgorithm.NONE
        # The one field run_batch does read back after the worker: with the unified
        # KV pool it hands the forward's write set (out_cache_loc) to the allocator.
        # _forward_isolation restores it afterwards, as for a verify step.
        batch.out_cache_loc = plain.out_cache_loc
        warm = keep_warm.before_plain(batch, new_seq_lens, plain.out_cache_loc)

        with installed(runner, self._plain_state):
            forward_batch = up.ForwardBatch.init_new(
                plain,
                runner,
                capture_hidden_mode=self._plain_state.capture_hidden_mode,
                return_hidden_states_before_norm=False,
            )
            if batch.has_grammar:
                result = self._sample_constrained(forward_batch, grammar_barrier)
            else:
                result = self._target_worker.forward_batch_generation(
                    batch=None, forward_batch=forward_batch
                )
        fresh = keep_warm.after_plain(warm, batch, result)
        topk_p, topk_index, hidden, probs = fresh or (
            draft_input.topk_p, draft_input.topk_index, draft_input.hidden_states, draft_input.draft_probs)
        result.next_draft_input = up.EagleDraftInput(
            bonus_tokens=result.next_token_ids.to(torch.int32),
            topk_p=topk_p,
            topk_index=topk_index,
            hidden_states=hidden,
            draft_probs=probs if probs is not None else draft_input.draft_probs,
            dsa_topk_indices=draft_input.dsa_topk_indices,
            capture_hidden_mode=draft_input.capture_hidden_mode,
        )
        # The FutureMap relays a plain result's bonus tokens only, unless it carries
        # fresh draft state (scheduler_hooks.around_relay_forward_payload).
        setattr(result, ctl.RESULT_DRAFT_FLAG, fresh is not None)
        result.new_seq_lens = new_seq_lens
        result.speculative_num_draft_tokens = 1
        # Under overlap the scheduler pins these two iterations (out_cache_loc etc.).
        result.extra_keep_alive_refs = [forward_batch]
        setattr(result, ctl.RESULT_FLAG, True)
        return result

    def _sample_constrained(self, forward_batch, grammar_barrier):
        """A plain decode of a batch with grammar-constrained requests, ordered as
        upstream's verify orders it: the forward first, unsampled (``is_verify``);
        then the grammar barrier advances every request's grammar over the tokens of
        the batches still in flight, overlapping the forward; then sampling builds
        the vocab mask from the advanced grammars and applies it."""
        result = self._target_worker.forward_batch_generation(
            batch=None, forward_batch=forward_batch, is_verify=True
        )
        if grammar_barrier is not None:  # None without overlap: nothing is in flight
            grammar_barrier()
        result.next_token_ids = self._target_worker.model_runner.sample(
            result.logits_output, forward_batch
        )
        return result
