"""Every SGLang symbol this package hooks, subclasses or calls, named in one place.

An SGLang upgrade is this file's work: each entry is a dotted path into the pinned
release. ``HOOKS`` are patched through SGLang's ``HookRegistry``; ``SYMBOLS`` are
used directly (through ``sglang_symbols``). SGLang only *logs* a hook that fails
to apply, so ``verify()`` runs right after ``HookRegistry.apply_hooks`` in every
process and stops start-up with one sentence naming what drifted.
"""

from __future__ import annotations

import dataclasses
import pkgutil
from dataclasses import dataclass
from importlib import metadata
from collections.abc import Callable

PINNED_SGLANG_VERSION = "0.5.17"


class UpstreamDriftError(RuntimeError):
    """The installed SGLang does not match what this package was written against."""


@dataclass(frozen=True)
class Hook:
    target: str  # dotted path handed to HookRegistry
    kind: str  # HookType name: BEFORE / AFTER / AROUND / REPLACE
    impl: str  # "module:function" inside this package


HOOKS: tuple[Hook, ...] = (
    # Flags: add ours to the parser, read them back onto ServerArgs, validate.
    Hook("sglang.srt.server_args.ServerArgs.add_cli_args", "AFTER",
         "sglang_adaptive.args:after_add_cli_args"),
    Hook("sglang.srt.server_args.ServerArgs.from_cli_args", "AROUND",
         "sglang_adaptive.args:around_from_cli_args"),
    # Worker choice: AdaptiveEAGLEWorker for EAGLE/EAGLE3 when a policy is on.
    Hook("sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker", "AROUND",
         "sglang_adaptive.scheduler_hooks:around_create_worker"),
    # Per-batch mode: decided for the memory check, fixed at prepare_for_decode.
    Hook("sglang.srt.managers.schedule_batch.ScheduleBatch.check_decode_mem", "AROUND",
         "sglang_adaptive.scheduler_hooks:around_check_decode_mem"),
    Hook("sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode", "AROUND",
         "sglang_adaptive.scheduler_hooks:around_prepare_for_decode"),
    # KV reserve per request: the plain reserve replaces 2 x alloc_len for plain batches.
    Hook("sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode", "AROUND",
         "sglang_adaptive.scheduler_hooks:around_get_alloc_reserve_per_decode"),
    # Host cost: upstream's per-request commit loop indexes a CPU tensor element by
    # element; plain batches take this path too, a plain server's does not.
    Hook("sglang.srt.mem_cache.allocation.alloc_for_spec_decode", "AROUND",
         "sglang_adaptive.scheduler_hooks:around_alloc_for_spec_decode"),
    # Results: a plain result is processed as a plain decode result.
    Hook("sglang.srt.managers.scheduler_components.batch_result_processor."
         "SchedulerBatchResultProcessor.process_batch_result_decode", "AROUND",
         "sglang_adaptive.scheduler_hooks:around_process_batch_result_decode"),
    # Metrics: an interval with plain batches only has no acceptance to report.
    Hook("sglang.srt.managers.scheduler_components.metrics_reporter."
         "SchedulerMetricsReporter.report_decode_stats", "AROUND",
         "sglang_adaptive.scheduler_hooks:around_report_decode_stats"),
)

# Used directly: subclassed, constructed, called, or read as attributes.
SYMBOLS: dict[str, str] = {
    "EAGLEWorkerV2": "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2",
    "DecodeCudaGraphRunner": "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner",
    "ForwardBatch": "sglang.srt.model_executor.forward_batch_info.ForwardBatch",
    "ForwardMode": "sglang.srt.model_executor.forward_batch_info.ForwardMode",
    "CaptureHiddenMode": "sglang.srt.model_executor.forward_batch_info.CaptureHiddenMode",
    "EagleDraftInput": "sglang.srt.speculative.eagle_info.EagleDraftInput",
    "GenerationBatchResult": "sglang.srt.managers.utils.GenerationBatchResult",
    "SpeculativeAlgorithm": "sglang.srt.speculative.spec_info.SpeculativeAlgorithm",
    "check_cuda_graph_backend": "sglang.srt.model_executor.cuda_graph_config.check_cuda_graph_backend",
    "Phase": "sglang.srt.model_executor.cuda_graph_config.Phase",
    "Backend": "sglang.srt.model_executor.cuda_graph_config.Backend",
    "get_alloc_len_per_decode": "sglang.srt.mem_cache.allocation_sizing.get_alloc_len_per_decode",
    "get_available_gpu_memory": "sglang.srt.utils.common.get_available_gpu_memory",
    "log_info_on_rank0": "sglang.srt.utils.common.log_info_on_rank0",
    "HookRegistry": "sglang.srt.plugins.hook_registry.HookRegistry",
    "HookType": "sglang.srt.plugins.hook_registry.HookType",
    "ScheduleBatch": "sglang.srt.managers.schedule_batch.ScheduleBatch",
}

# Attributes of upstream objects the worker reads or swaps; checked on the classes
# that define them so a rename fails at start-up, not on the first plain batch.
ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("EAGLEWorkerV2", "forward_batch_generation"),
    ("EAGLEWorkerV2", "init_cuda_graphs"),
    ("EAGLEWorkerV2", "war_fastpath_runner"),
    ("EAGLEWorkerV2", "spec_v2_attn_backends"),
    ("ForwardBatch", "init_new"),
    ("GenerationBatchResult", "copy_to_cpu"),
    ("HookRegistry", "apply_hooks"),  # wrapped by plugin.register to verify the hooks
)


# Dataclass fields read or written on upstream objects; checked at start-up.
FIELDS: dict[str, tuple[str, ...]] = {
    "ScheduleBatch": (
        "reqs", "spec_algorithm", "spec_info", "forward_mode", "is_extend_in_batch",
        "has_grammar", "enable_overlap", "input_ids", "out_cache_loc", "req_pool_indices",
        "seq_lens", "seq_lens_cpu", "seq_lens_sum",
    ),
    "GenerationBatchResult": (
        "next_token_ids", "next_draft_input", "new_seq_lens", "accept_lens",
        "speculative_num_draft_tokens", "extra_keep_alive_refs",
    ),
    "EagleDraftInput": (
        "bonus_tokens", "topk_p", "topk_index", "hidden_states", "draft_probs",
        "dsa_topk_indices", "capture_hidden_mode",
    ),
}

# Instance attributes set in upstream constructors; checked on the live objects
# (the worker after EAGLEWorkerV2.__init__, the target runner before capture).
WORKER_ATTRIBUTES = (
    "_target_worker", "_draft_worker", "speculative_algorithm", "speculative_num_steps",
    "speculative_num_draft_tokens", "topk", "device", "gpu_id",
    "_additional_graph_memory_usage", "_additional_graph_time_usage",
)
MODEL_RUNNER_ATTRIBUTES = (
    "attn_backend", "decode_cuda_graph_runner", "spec_algorithm", "init_new_workspace",
    "_get_attention_backend",
)


def check_instance(obj, names, what: str) -> None:
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise UpstreamDriftError(_drift_sentence(f"{what}.{missing[0]}", "does not exist"))


class _Symbols:
    """Lazy access to ``SYMBOLS``: ``sglang_symbols.ForwardBatch``."""

    def __getattr__(self, name: str):
        try:
            path = SYMBOLS[name]
        except KeyError:
            raise AttributeError(f"{name} is not listed in sglang_adaptive.upstream.SYMBOLS") from None
        value = _resolve(path)
        setattr(self, name, value)
        return value


sglang_symbols = _Symbols()


def _resolve(path: str):
    try:
        return pkgutil.resolve_name(path)
    except (ImportError, AttributeError) as e:
        raise UpstreamDriftError(_drift_sentence(path, f"it does not resolve ({e})")) from e


def _drift_sentence(symbol: str, what: str) -> str:
    return (
        f"sglang_adaptive: upstream symbol {symbol} {what}; this package supports "
        f"sglang=={PINNED_SGLANG_VERSION}, installed sglang is {installed_version()}."
    )


def installed_version() -> str:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return "not installed"


def load_impl(hook: Hook) -> Callable:
    module, _, name = hook.impl.partition(":")
    return getattr(__import__(module, fromlist=[name]), name)


def current_attribute(target: str):
    """What ``target`` is now, unwrapping classmethod/staticmethod like HookRegistry."""
    owner_path, _, attr = target.rpartition(".")
    owner = _resolve(owner_path)
    if isinstance(owner, type) and isinstance(owner.__dict__.get(attr), (classmethod, staticmethod)):
        return owner.__dict__[attr].__func__
    if not hasattr(owner, attr):
        raise UpstreamDriftError(_drift_sentence(target, "does not exist"))
    return getattr(owner, attr)


def applied_hook(target: str, impl: Callable) -> Callable | None:
    """The hook function found in the wrapper chain of ``target``, if it is ``impl``."""
    fn = current_attribute(target)
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is impl:
                    return impl
            except ValueError:  # empty cell
                continue
        fn = getattr(fn, "__wrapped__", None)
    return None


def register_hooks() -> None:
    registry, hook_type = sglang_symbols.HookRegistry, sglang_symbols.HookType
    for hook in HOOKS:
        registry.register(hook.target, load_impl(hook), getattr(hook_type, hook.kind))


def verify() -> None:
    """Raise UpstreamDriftError unless SGLang is the pinned release with every hook applied."""
    version = installed_version()
    if version != PINNED_SGLANG_VERSION:
        raise UpstreamDriftError(
            f"sglang_adaptive supports sglang=={PINNED_SGLANG_VERSION} only, but sglang "
            f"{version} is installed; install the pinned release or upgrade this package."
        )
    for hook in HOOKS:
        if applied_hook(hook.target, load_impl(hook)) is None:
            raise UpstreamDriftError(_drift_sentence(hook.target, "was not patched by its hook"))
    for name in SYMBOLS:
        getattr(sglang_symbols, name)
    for owner, attr in ATTRIBUTES:
        if not hasattr(getattr(sglang_symbols, owner), attr):
            raise UpstreamDriftError(_drift_sentence(f"{SYMBOLS[owner]}.{attr}", "does not exist"))
    for owner, names in FIELDS.items():
        fields = {f.name for f in dataclasses.fields(getattr(sglang_symbols, owner))}
        for name in names:
            if name not in fields:
                raise UpstreamDriftError(_drift_sentence(f"{SYMBOLS[owner]}.{name}", "is not a field"))
