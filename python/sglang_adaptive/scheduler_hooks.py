"""Scheduler hooks: the per-batch spec flag, its KV reserve, and plain results.

The decode mode is decided in the scheduler, never in the worker:

1. ``check_decode_mem`` (and each retraction candidate set) asks the controller for
   the mode of the candidate batch and checks memory with that mode's reserve.
2. ``prepare_for_decode`` (after retraction) asks again for the final batch, which
   gives the same answer as its last check, records it on the batch
   (``BATCH_FLAG``) and allocates that mode's reserve through upstream's own
   ``eagle_prepare_for_decode``: only the reserve differs, so the two modes share one
   allocation path and switching back and forth cannot leak or double-allocate.
3. The worker reads the flag and marks its result (``RESULT_FLAG``);
   ``process_batch_result_decode`` processes a plain result as a plain decode
   result: one committed token per request, no acceptance statistics.

On a server without the adaptive worker the controller answers like upstream and
every hook reduces to calling the original.
"""

from __future__ import annotations

import contextlib

from sglang_adaptive import controller as ctl
from sglang_adaptive.args import get_config
from sglang_adaptive.upstream import UpstreamDriftError, sglang_symbols as up

# Set only while the memory check or the allocation of a plain batch runs.
_reserve_override: int | None = None


class _reserve:
    """The reserve in force while the block runs. A class, not a generator context
    manager: entered twice a batch, that costs 1.8 us here, this 0.6."""

    __slots__ = ("value", "previous")

    def __init__(self, value: int | None):
        self.value = value

    def __enter__(self) -> None:
        global _reserve_override
        self.previous, _reserve_override = _reserve_override, self.value

    def __exit__(self, *exc) -> None:
        global _reserve_override
        _reserve_override = self.previous


def around_get_alloc_reserve_per_decode(original, server_args=None):
    if server_args is None and _reserve_override is not None:
        return _reserve_override
    return original(server_args)


def around_check_decode_mem(original, self, selected_indices=None):
    controller = ctl.current()
    # A retraction candidate set is checked as the batch it would leave.
    reqs = self.reqs if selected_indices is None else [self.reqs[i] for i in selected_indices]
    speculative = controller.speculate(len(reqs), self.has_grammar, controller.context(reqs))
    with _reserve(controller.kv_reserve(speculative, self.enable_overlap)):
        return original(self, selected_indices)


def around_prepare_for_decode(original, self):
    if self.spec_algorithm.is_none():
        return original(self)
    controller = ctl.current()
    context = controller.context(self.reqs)
    speculative = controller.speculate(len(self.reqs), self.has_grammar, context)
    setattr(self, ctl.BATCH_FLAG, speculative)
    with _reserve(controller.kv_reserve(speculative, self.enable_overlap)):
        original(self)
    controller.on_prepare(speculative, len(self.reqs), self.forward_iter, context)
    if not speculative:
        controller.audit_kv(self.reqs)


def after_prepare_for_extend(result, self):
    """Record on a prefill batch whether it runs the draft's extend (``BATCH_FLAG``,
    ``ModeController.prefill_drafts``). Prompts with multimodal or embedding inputs
    always do: the draft embeds them as the target did, the keep-warm writer from
    token ids alone."""
    if self.spec_algorithm.is_none():
        return result
    embeds = self.input_embeds is not None or self.replace_embeds is not None or any(
        m is not None for m in self.multimodal_inputs or ())
    setattr(self, ctl.BATCH_FLAG, embeds or ctl.current().prefill_drafts())
    return result


def after_scheduler_on_idle(result, self):
    """No step or prefill time is filed across a wait with nothing to run
    (``AdaptiveModeController.on_idle``)."""
    ctl.current().on_idle()
    return result


def around_alloc_for_spec_decode(original, tree_cache, req_to_token_pool, *, nxt_kv_lens_cpu, **kwargs):
    # Upstream ends with `for i, req in enumerate(reqs): ... int(nxt_kv_lens_cpu[i])`,
    # a tensor select and item per request: about 1 ms a step at 128 requests on the
    # H200's host, which every plain batch of this server pays and a plain server's
    # alloc_for_decode does not. With page size 1 nothing else reads the CPU tensor,
    # so that loop gets a list (same values).
    if ctl.current().active and tree_cache.token_to_kv_pool_allocator.page_size == 1:
        nxt_kv_lens_cpu = nxt_kv_lens_cpu.tolist()
    return original(tree_cache, req_to_token_pool, nxt_kv_lens_cpu=nxt_kv_lens_cpu, **kwargs)


@contextlib.contextmanager
def _bonus_tokens_only(future_map):
    """Let only the bonus token through the FutureMap while the block runs.

    A plain step reads no draft state and passes on the one it got, so gathering
    the draft extras (top-k, hidden states) for a plain batch and stashing them back
    after it writes each request's rows with their own values: skipping both leaves
    the buffers exactly as they were and saves their host launches on every plain
    step (about 0.3 ms at 128 requests).
    """
    if not future_map._forward_buf_initialized:  # the first stash sizes the buffers
        yield
        return
    saved = future_map.need_topk, future_map.need_hidden_states
    future_map.need_topk = future_map.need_hidden_states = False
    try:
        yield
    finally:
        future_map.need_topk, future_map.need_hidden_states = saved


def around_resolve_spec_extras(original, self, batch):
    if getattr(batch, ctl.BATCH_FLAG, True):
        return original(self, batch)
    with _bonus_tokens_only(self):
        return original(self, batch)


def around_relay_forward_payload(original, self, future_indices, batch_result):
    if not getattr(batch_result, ctl.RESULT_FLAG, False) or getattr(batch_result, ctl.RESULT_DRAFT_FLAG, False):
        return original(self, future_indices, batch_result)
    # Without a draft input upstream relays the sampled tokens alone.
    draft_input, batch_result.next_draft_input = batch_result.next_draft_input, None
    try:
        with _bonus_tokens_only(self.future_map):
            return original(self, future_indices, batch_result)
    finally:
        batch_result.next_draft_input = draft_input


def around_advance_grammar_fsm(original, self, result, batch):
    """Advance the grammars over a plain result's tokens, once.

    Upstream's grammar barrier (``Scheduler._advance_pending_grammar``, run inside
    the next decode step before its mask is built) calls this on every result still
    in flight; its decode branch reads ``accept_lens`` of a verified run and skips a
    plain result, whose one token per request would then be missing from the mask
    of the step after it.
    """
    if not getattr(result, ctl.RESULT_FLAG, False):
        return original(self, result, batch)
    if result.grammar_advanced or not batch.has_grammar:
        return None
    if result.copy_done is not None:
        result.copy_done.synchronize()
    for req, token in zip(batch.reqs, result.next_token_ids.tolist()):
        if req.grammar is not None and not (req.is_retracted or req.finished()):
            self._accept_grammar_tokens(req, [token])
    result.grammar_advanced = True
    return None


# Set while upstream processes a plain result whose grammars have taken its tokens.
_grammars_advanced = False


@contextlib.contextmanager
def _grammars_already_advanced():
    """Upstream's plain-decode branch advances each constrained request's grammar by
    its token; ``around_advance_grammar_fsm`` has done that for this batch."""
    global _grammars_advanced
    _grammars_advanced = True
    try:
        yield
    finally:
        _grammars_advanced = False


def around_accept_grammar_tokens(original, self, req, tokens):
    if _grammars_advanced:
        return [tokens] if isinstance(tokens, int) else list(tokens)
    return original(self, req, tokens)


def around_process_batch_result_decode(original, self, batch, result):
    if not getattr(result, ctl.RESULT_FLAG, False):
        return original(self, batch, result)
    # One token per live request, committed as _resolve_spec_v2_tokens commits a
    # verified run, but without verify counts, acceptance or adaptive feedback.
    for req in batch.reqs:
        if not (req.is_retracted or req.finished()):
            req.kv_committed_len += 1
    grammars = contextlib.nullcontext()
    if batch.has_grammar:
        self.advance_grammar_fsm(result, batch)  # unless the next step's barrier did
        grammars = _grammars_already_advanced()
    # Upstream branches on batch.spec_algorithm for the token layout, logprob shape,
    # spec metrics and grammar; a plain result takes every non-speculative branch.
    spec_algorithm = batch.spec_algorithm
    batch.spec_algorithm = up.SpeculativeAlgorithm.NONE
    try:
        with grammars:
            return original(self, batch, result)
    finally:
        batch.spec_algorithm = spec_algorithm


def around_report_decode_stats(original, self, *args, **kwargs):
    scheduler = self.scheduler
    if scheduler.spec_algorithm.is_none() or self.spec_num_forward_ct > 0:
        return original(self, *args, **kwargs)
    # Only plain batches since the last report: upstream would divide by zero
    # speculative forwards. Report the interval as the plain decode it was.
    spec_algorithm = scheduler.spec_algorithm
    scheduler.spec_algorithm = up.SpeculativeAlgorithm.NONE
    try:
        return original(self, *args, **kwargs)
    finally:
        scheduler.spec_algorithm = spec_algorithm


def around_create_worker(original, self, server_args):
    worker_cls = original(self, server_args)
    config = get_config(server_args)
    if not config.enabled:
        return worker_cls
    if worker_cls is not up.EAGLEWorkerV2:
        raise UpstreamDriftError(
            f"sglang_adaptive: --speculative-switch-policy {config.policy} needs SGLang's "
            f"EAGLEWorkerV2 for {server_args.speculative_algorithm}, but SGLang chose "
            f"{worker_cls.__name__}."
        )
    from sglang_adaptive.worker import AdaptiveEAGLEWorker

    return AdaptiveEAGLEWorker
