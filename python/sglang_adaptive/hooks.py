"""The SGLang functions this package patches, each with the function patched onto it.

Registered through SGLang's ``HookRegistry`` by ``plugin.register`` and checked by
``upstream.verify`` (each hook found, by identity, in its target's wrapper chain).
The targets are dotted paths into the pinned release, as ``HookRegistry`` takes them.
"""

from __future__ import annotations

from sglang_adaptive import args, scheduler_hooks, telemetry
from sglang_adaptive.upstream import Hook

HOOKS: tuple[Hook, ...] = (
    # Flags: add ours to the parser, read them back onto ServerArgs, validate.
    Hook("sglang.srt.server_args.ServerArgs.add_cli_args", "AFTER",
         args.after_add_cli_args),
    Hook("sglang.srt.server_args.ServerArgs.from_cli_args", "AROUND",
         args.around_from_cli_args),
    # The same flags as keyword arguments: sglang.Engine(**kwargs) builds ServerArgs(**kwargs).
    Hook("sglang.srt.server_args.ServerArgs.__init__", "AROUND", args.around_server_args_init),
    # Worker choice: AdaptiveEAGLEWorker for EAGLE/EAGLE3 when a policy is on.
    Hook("sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker", "AROUND",
         scheduler_hooks.around_create_worker),
    # Per-batch mode: decided for the memory check, fixed at prepare_for_decode.
    Hook("sglang.srt.managers.schedule_batch.ScheduleBatch.check_decode_mem", "AROUND",
         scheduler_hooks.around_check_decode_mem),
    Hook("sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode", "AROUND",
         scheduler_hooks.around_prepare_for_decode),
    # Prefill mode: whether a prefill runs the draft's extend or only the target.
    Hook("sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend", "AFTER",
         scheduler_hooks.after_prepare_for_extend),
    # Step costs: an interval that spans an idle wait is no step's or prefill's cost.
    Hook("sglang.srt.managers.scheduler.Scheduler.on_idle", "AFTER", scheduler_hooks.after_scheduler_on_idle),
    # KV reserve per request: the plain reserve replaces 2 x alloc_len for plain batches.
    Hook("sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode", "AROUND",
         scheduler_hooks.around_get_alloc_reserve_per_decode),
    # Host cost: upstream's per-request commit loop indexes a CPU tensor element by
    # element; plain batches take this path too, a plain server's does not.
    Hook("sglang.srt.mem_cache.allocation.alloc_for_spec_decode", "AROUND",
         scheduler_hooks.around_alloc_for_spec_decode),
    # FutureMap relay: a plain batch moves its bonus token only; the draft extras
    # stay in their buffers untouched (gathering and stashing them back is an identity).
    Hook("sglang.srt.managers.overlap_utils.FutureMap._resolve_spec_extras", "AROUND",
         scheduler_hooks.around_resolve_spec_extras),
    Hook("sglang.srt.managers.scheduler.Scheduler._relay_forward_payload", "AROUND",
         scheduler_hooks.around_relay_forward_payload),
    # Results: a plain result is processed as a plain decode result.
    Hook("sglang.srt.managers.scheduler_components.batch_result_processor."
         "SchedulerBatchResultProcessor.process_batch_result_decode", "AROUND",
         scheduler_hooks.around_process_batch_result_decode),
    # Grammar: the barrier before a decode step's mask advances plain results too.
    Hook("sglang.srt.managers.scheduler_components.batch_result_processor."
         "SchedulerBatchResultProcessor.advance_grammar_fsm", "AROUND",
         scheduler_hooks.around_advance_grammar_fsm),
    # ... and processing that plain result then leaves its grammars where they are.
    Hook("sglang.srt.managers.scheduler_components.batch_result_processor."
         "SchedulerBatchResultProcessor._accept_grammar_tokens", "AROUND",
         scheduler_hooks.around_accept_grammar_tokens),
    # Metrics: an interval with plain batches only has no acceptance to report.
    Hook("sglang.srt.managers.scheduler_components.metrics_reporter."
         "SchedulerMetricsReporter.report_decode_stats", "AROUND",
         scheduler_hooks.around_report_decode_stats),
    # Per-request counters: acceptance of a partly plain request counts its
    # speculative steps only.
    Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager._calculate_spec_decoding_metrics", "AROUND",
         telemetry.around_calculate_spec_decoding_metrics),
)
