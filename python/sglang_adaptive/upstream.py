"""Every SGLang symbol this package subclasses, calls or reads, named in one place.

An SGLang upgrade is this file's work (and ``hooks.py``'s, which lists the hooked
targets next to the functions patched onto them through SGLang's ``HookRegistry``).
Each entry is a dotted path into the pinned release: ``SYMBOLS`` are used directly
(through ``sglang_symbols``), and the tables below them name every attribute read
or written on SGLang objects. SGLang only *logs* a hook that fails to apply, so
``verify()`` runs right after ``HookRegistry.apply_hooks`` in every process and
stops start-up with one sentence naming what drifted.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import pkgutil
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata

PINNED_SGLANG_VERSION = "0.5.17"


class UpstreamDriftError(RuntimeError):
    """The installed SGLang does not match what this package was written against."""


@dataclass(frozen=True)
class Hook:
    target: str  # dotted path handed to HookRegistry
    kind: str  # HookType name: BEFORE / AFTER / AROUND / REPLACE
    impl: Callable  # the hook body, a function of this package


# Used directly: subclassed, constructed, called, or read as attributes.
SYMBOLS: dict[str, str] = {
    "ModelConfig": "sglang.srt.configs.model_config.ModelConfig",
    "mambaish_config": "sglang.srt.configs.hybrid_arch.mambaish_config",
    "EAGLEWorkerV2": "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2",
    "EagleDraftWorker": "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker",
    "TpModelWorker": "sglang.srt.managers.tp_worker.TpModelWorker",
    "DecodeCudaGraphRunner": "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner",
    "ForwardBatch": "sglang.srt.model_executor.forward_batch_info.ForwardBatch",
    "ForwardMode": "sglang.srt.model_executor.forward_batch_info.ForwardMode",
    "CaptureHiddenMode": "sglang.srt.model_executor.forward_batch_info.CaptureHiddenMode",
    "EagleDraftInput": "sglang.srt.speculative.eagle_info.EagleDraftInput",
    # Draft keep-warm (keepwarm.py): a width-1 draft extend, as upstream's after verify.
    "EagleDraftExtendInput": "sglang.srt.speculative.eagle_info.EagleDraftExtendInput",
    "prepare_for_draft_extend": "sglang.srt.speculative.eagle_worker_common.prepare_for_draft_extend",
    # A prefill without the draft's extend (keepwarm.KVKeepWarm.prefill): each request's
    # last draft input token, as upstream's draft extend of a prefill takes it.
    "eagle_prefill_tail_tokens": "sglang.srt.speculative.eagle_utils._eagle_prefill_tail_tokens",
    "get_spec": "sglang.srt.runtime_context.get_spec",
    "sample_draft_proposal": "sglang.srt.speculative.spec_utils.sample_draft_proposal",
    "renorm_draft_probs": "sglang.srt.speculative.spec_utils.renorm_draft_probs",
    "fast_topk": "sglang.srt.utils.common.fast_topk",
    "speculative_moe_backend_context": "sglang.srt.layers.moe.utils.speculative_moe_backend_context",
    "speculative_moe_a2a_backend_context": "sglang.srt.layers.moe.utils.speculative_moe_a2a_backend_context",
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
    "ServerArgs": "sglang.srt.server_args.ServerArgs",
    "Scheduler": "sglang.srt.managers.scheduler.Scheduler",
    "FutureMap": "sglang.srt.managers.overlap_utils.FutureMap",
    "GroupCoordinator": "sglang.srt.distributed.parallel_state.GroupCoordinator",
    "SchedulerMetricsReporter": "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter",
    "ScheduleBatch": "sglang.srt.managers.schedule_batch.ScheduleBatch",
    "Req": "sglang.srt.managers.schedule_batch.Req",
    "ReqKvInfo": "sglang.srt.managers.schedule_batch.ReqKvInfo",
    "ReqToTokenPool": "sglang.srt.mem_cache.memory_pool.ReqToTokenPool",
    "BasePrefixCache": "sglang.srt.mem_cache.base_prefix_cache.BasePrefixCache",
    "BaseTokenToKVPoolAllocator": "sglang.srt.mem_cache.allocator.base.BaseTokenToKVPoolAllocator",
    # The HTTP server's idle keep-alive (SGLANG_TIMEOUT_KEEP_ALIVE); the load clients in
    # testing.py close idle connections before it does.
    "envs": "sglang.srt.environ.envs",
}

# Attributes of upstream objects the worker reads or swaps; checked on the classes
# that define them so a rename fails at start-up, not on the first plain batch.
ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("EAGLEWorkerV2", "forward_batch_generation"),
    ("EAGLEWorkerV2", "init_cuda_graphs"),
    ("EAGLEWorkerV2", "war_fastpath_runner"),
    ("EAGLEWorkerV2", "spec_v2_attn_backends"),
    ("EAGLEWorkerV2", "on_verify_complete_cpu"),
    ("GroupCoordinator", "broadcast_object"),
    ("TpModelWorker", "forward_batch_generation"),
    ("TpModelWorker", "model_runner"),
    ("ForwardBatch", "init_new"),
    ("ForwardMode", "DECODE"),
    ("ForwardMode", "EXTEND"),
    ("ForwardMode", "is_decode"),
    ("CaptureHiddenMode", "NULL"),
    ("CaptureHiddenMode", "LAST"),
    ("CaptureHiddenMode", "FULL"),
    ("SpeculativeAlgorithm", "NONE"),
    ("SpeculativeAlgorithm", "is_none"),
    ("SpeculativeAlgorithm", "is_eagle3"),
    ("Phase", "DECODE"),
    ("Backend", "DISABLED"),
    ("GenerationBatchResult", "copy_to_cpu"),
    ("Req", "finished"),
    ("ModelConfig", "from_server_args"),
    ("HookRegistry", "register"),
    ("HookRegistry", "apply_hooks"),  # wrapped by plugin.register to verify the hooks
    ("HookType", "AFTER"),
    ("HookType", "AROUND"),
)


# Dataclass fields read or written on upstream objects; checked at start-up.
FIELDS: dict[str, tuple[str, ...]] = {
    "ScheduleBatch": (
        "reqs", "spec_algorithm", "spec_info", "forward_mode", "is_extend_in_batch",
        "has_grammar", "enable_overlap", "input_ids", "out_cache_loc", "req_pool_indices",
        "seq_lens", "seq_lens_cpu", "seq_lens_sum", "forward_iter",
        # A prefill without the draft's extend.
        "extend_lens", "prefix_lens", "extend_num_tokens", "multimodal_inputs", "input_embeds",
        "replace_embeds",
    ),
    "GenerationBatchResult": (
        "next_token_ids", "next_draft_input", "new_seq_lens", "accept_lens",
        "speculative_num_draft_tokens", "extra_keep_alive_refs", "logits_output", "copy_done",
        "grammar_advanced",
    ),
    "EagleDraftExtendInput": (
        "hidden_states", "num_correct_drafts", "num_accept_tokens", "num_tokens_per_req",
        "num_tokens_for_logprob_per_req",
    ),
    "EagleDraftInput": (
        "bonus_tokens", "topk_p", "topk_index", "hidden_states", "draft_probs",
        "dsa_topk_indices", "capture_hidden_mode", "num_tokens_per_req", "num_tokens_for_logprob_per_req",
    ),
    "ReqKvInfo": ("kv_allocated_len",),
    "SchedulerMetricsReporter": ("scheduler",),
    # args.check_combination reads these with getattr defaults (the raw Namespace may
    # lack them), so a renamed flag would silently skip its check without this.
    "ServerArgs": (
        "speculative_algorithm", "speculative_eagle_topk", "enable_dp_attention", "pp_size",
        "speculative_adaptive", "enable_multi_layer_eagle", "decode_log_interval",
        "enable_return_hidden_states",
    ),
}

# Instance attributes of upstream classes whose objects do not exist at start-up (a
# Req comes with the first request, the reporter and pools with the scheduler), so
# a live check would fire on the first batch, not at start-up. They are checked in
# the class source instead: assigned as ``self.<name>`` in a method of the class or
# a base, or declared in a class body. Any method, not only ``__init__``: upstream
# sets some in helpers (the reporter's counters in ``_init_metrics``, the worker's
# pool in ``alloc_memory_pool``). The pinned release ships its source.
ASSIGNED_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("Req", "kv_committed_len"),
    ("Req", "is_retracted"),
    ("Req", "kv"),
    ("Req", "grammar"),
    ("SchedulerMetricsReporter", "spec_num_forward_ct"),
    ("Scheduler", "spec_algorithm"),
    ("Scheduler", "future_map"),
    # Toggled by scheduler_hooks._bonus_tokens_only around a plain batch's relay.
    ("FutureMap", "need_topk"),
    ("FutureMap", "need_hidden_states"),
    ("FutureMap", "_forward_buf_initialized"),
    ("GroupCoordinator", "rank_in_group"),
    ("GroupCoordinator", "world_size"),
    ("EAGLEWorkerV2", "req_to_token_pool"),
    ("EagleDraftWorker", "draft_runner"),
    ("EagleDraftWorker", "draft_tp_context"),
    ("ReqToTokenPool", "req_to_token"),
    ("BasePrefixCache", "token_to_kv_pool_allocator"),
    ("BaseTokenToKVPoolAllocator", "page_size"),
    ("DecodeCudaGraphRunner", "capture_bs"),
    # Assigned by BaseRunner.__init__ and read at capture; PlainDecodeGraphRunner
    # overrides it with a property whose setter receives that assignment.
    ("DecodeCudaGraphRunner", "return_hidden_states_mode"),
    ("ModelConfig", "model_is_mrope"),
    ("ModelConfig", "hf_config"),
)

# Instance attributes set in upstream constructors; checked on the live objects
# (the worker after EAGLEWorkerV2.__init__, the target runner before capture).
# The target runner's TP group: the worker shares the step-cost table through it.
TARGET_RUNNER_ATTRIBUTES = ("tp_group",)
WORKER_ATTRIBUTES = (
    "_target_worker", "_draft_worker", "speculative_algorithm", "speculative_num_steps",
    "speculative_num_draft_tokens", "topk", "device", "gpu_id",
    "_additional_graph_memory_usage", "_additional_graph_time_usage",
)
MODEL_RUNNER_ATTRIBUTES = (
    "attn_backend", "decode_cuda_graph_runner", "spec_algorithm", "init_new_workspace",
    "_get_attention_backend",
)


# Parameters of SGLang callables the package calls by keyword, by position, or
# overrides: a rename would otherwise fail only at the first call. Checked on the
# signature (``inspect.signature`` follows hook wrappers to the original).
PARAMETERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sglang.srt.managers.overlap_utils.FutureMap._resolve_spec_extras", ("batch",)),
    ("sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.on_verify_complete_cpu",
     ("num_correct_drafts_per_req", "batch_size")),
    ("sglang.srt.distributed.parallel_state.GroupCoordinator.broadcast_object", ("obj", "src")),
    ("sglang.srt.managers.scheduler.Scheduler._relay_forward_payload", ("future_indices", "batch_result")),
    ("sglang.srt.mem_cache.allocation.alloc_for_spec_decode",
     ("tree_cache", "req_to_token_pool", "nxt_kv_lens_cpu")),
    ("sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new",
     ("batch", "model_runner", "capture_hidden_mode", "return_hidden_states_before_norm")),
    ("sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.__init__",
     ("model_runner", "attn_backend", "speculative_num_steps", "speculative_num_draft_tokens")),
    ("sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__",
     ("server_args", "gpu_id", "ps", "nccl_port", "target_worker")),
    ("sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",
     ("batch", "on_publish", "grammar_barrier")),
    ("sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
     ("batch", "forward_batch", "is_verify", "capture_hidden_mode")),
    # A constrained plain step samples itself, after the grammar barrier.
    ("sglang.srt.model_executor.model_runner.ModelRunner.sample", ("logits_output", "forward_batch")),
    ("sglang.srt.managers.scheduler_components.batch_result_processor."
     "SchedulerBatchResultProcessor.advance_grammar_fsm", ("result", "batch")),
    ("sglang.srt.managers.scheduler_components.batch_result_processor."
     "SchedulerBatchResultProcessor._accept_grammar_tokens", ("req", "tokens")),
    ("sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode", ("server_args",)),
    ("sglang.srt.speculative.eagle_worker_common.prepare_for_draft_extend",
     ("draft_extend_input", "batch", "predict", "num_draft_tokens", "draft_model_runner",
      "cuda_graph_runner", "return_hidden_states_before_norm")),
    ("sglang.srt.speculative.spec_utils.sample_draft_proposal", ("next_token_logits", "temperatures")),
    ("sglang.srt.utils.common.fast_topk", ("values", "topk", "dim")),
    ("sglang.srt.speculative.eagle_utils._eagle_prefill_tail_tokens", ("batch", "next_token_ids")),
    ("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.set_kv_buffer",
     ("layer", "loc_info", "cache_k", "cache_v")),
)


def missing_parameters(path: str, names) -> list[str]:
    params = inspect.signature(_resolve(path)).parameters
    return [n for n in names if n not in params]


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


@functools.cache
def assigned_attributes(cls: type) -> frozenset[str]:
    """Attribute names SGLang's source gives instances of ``cls``: ``self.<name>``
    assigned in a method of the class or of an SGLang base, or a name declared in
    such a class body. Parsed, not searched as text, so comments and strings do not
    count. A class whose source cannot be read contributes nothing: fail closed."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("sglang."):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        (node,) = ast.parse(textwrap.dedent(source)).body
        for stmt in node.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.ctx, ast.Store)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
            ):
                names.add(sub.attr)
    return frozenset(names)


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


def register_hooks(hooks: Iterable[Hook]) -> None:
    registry, hook_type = sglang_symbols.HookRegistry, sglang_symbols.HookType
    for hook in hooks:
        registry.register(hook.target, hook.impl, getattr(hook_type, hook.kind))


def verify(hooks: Iterable[Hook]) -> None:
    """Raise UpstreamDriftError unless SGLang is the pinned release with every hook applied."""
    version = installed_version()
    if version != PINNED_SGLANG_VERSION:
        raise UpstreamDriftError(
            f"sglang_adaptive supports sglang=={PINNED_SGLANG_VERSION} only, but sglang "
            f"{version} is installed; install the pinned release or upgrade this package."
        )
    for hook in hooks:
        if applied_hook(hook.target, hook.impl) is None:
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
    for path, names in PARAMETERS:
        missing = missing_parameters(path, names)
        if missing:
            raise UpstreamDriftError(_drift_sentence(f"{path}({missing[0]}=...)", "has no such parameter"))
    for owner, attr in ASSIGNED_ATTRIBUTES:
        cls = getattr(sglang_symbols, owner)
        if not (hasattr(cls, attr) or attr in assigned_attributes(cls)):
            raise UpstreamDriftError(
                _drift_sentence(f"{SYMBOLS[owner]}.{attr}", "is not set by its class or its bases")
            )
