"""Host-time diagnostic: where the scheduler's CPU time goes, per decode batch size.

Off unless ``SGLANG_ADAPTIVE_HOST_TIMING`` names a directory. Then each scheduler
process wraps the functions in ``TARGETS`` (after the plugin's hooks, so a hook's
own cost counts) with a perf_counter accumulator and writes
``DIR/hosttime-<pid>.json`` every second of decoding: per function, calls and seconds,
keyed by the size of the decode batch the scheduler was running at the time.

Why it exists: a decode step of a small model at TP 2 takes 2-3 ms of GPU time, so
the scheduler loop's host work, not the GPU, sets the pace, and a plain batch of a
speculative server must not cost more host time than a batch of a plain server.
Comparing two servers' files (``benchmark/hosttime_report.py``) names the function
that costs the difference. Wrapping costs about a microsecond per call.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import json
import os
import sys
import time
from collections import defaultdict

ENV = "SGLANG_ADAPTIVE_HOST_TIMING"
DUMP_EVERY_S = 1.0

# module:qualname. Module-level functions are also replaced wherever another
# module imported them by name.
TARGETS = (
    "sglang.srt.managers.scheduler:Scheduler.process_input_requests",
    "sglang.srt.managers.scheduler:Scheduler.get_next_batch_to_run",
    "sglang.srt.managers.scheduler:Scheduler.update_running_batch",
    "sglang.srt.managers.scheduler:Scheduler.run_batch",
    "sglang.srt.managers.scheduler:Scheduler.process_batch_result",
    "sglang.srt.managers.scheduler:Scheduler.launch_batch_sample_if_needed",
    "sglang.srt.managers.scheduler:Scheduler._apply_war_barrier",
    "sglang.srt.managers.scheduler:Scheduler._relay_forward_payload",
    "sglang.srt.managers.schedule_batch:ScheduleBatch.prepare_for_decode",
    "sglang.srt.managers.schedule_batch:ScheduleBatch.check_decode_mem",
    "sglang.srt.managers.schedule_batch:ScheduleBatch.copy",
    "sglang.srt.managers.schedule_batch:ScheduleBatch.filter_batch",
    "sglang.srt.managers.overlap_utils:FutureMap.resolve_seq_lens_cpu",
    "sglang.srt.managers.overlap_utils:FutureMap.publish",
    "sglang.srt.managers.overlap_utils:resolve_forward_inputs",
    "sglang.srt.managers.utils:GenerationBatchResult.copy_to_cpu",
    "sglang.srt.managers.scheduler_components.batch_result_processor:"
    "SchedulerBatchResultProcessor.process_batch_result_decode",
    "sglang.srt.managers.scheduler_components.batch_result_processor:"
    "SchedulerBatchResultProcessor._resolve_spec_v2_tokens",
    "sglang.srt.managers.scheduler_components.output_streamer:SchedulerOutputStreamer.stream_output",
    "sglang.srt.speculative.eagle_utils:eagle_prepare_for_decode",
    "sglang.srt.mem_cache.allocation:alloc_for_spec_decode",
    "sglang.srt.mem_cache.allocation:alloc_for_decode",
    "sglang.srt.managers.tp_worker:TpModelWorker.forward_batch_generation",
    "sglang.srt.speculative.eagle_worker_v2:EAGLEWorkerV2.forward_batch_generation",
    "sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker.draft",
    "sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker._draft_extend_for_decode",
    "sglang.srt.speculative.eagle_worker_v2:EAGLEWorkerV2.verify",
    "sglang_adaptive.worker:AdaptiveEAGLEWorker._forward_plain",
    "sglang_adaptive.worker:AdaptiveEAGLEWorker._prefill_plain",
    "sglang_adaptive.controller:AdaptiveModeController.speculate",
    "sglang_adaptive.controller:AdaptiveModeController.on_prepare",
    "sglang_adaptive.controller:AdaptiveModeController.on_verify",
    "sglang_adaptive.controller:AdaptiveModeController.context",
    "sglang_adaptive.controller:AdaptiveModeController.sync",
    "sglang_adaptive.controller:write_cost_table",
    "sglang_adaptive.policy:GoodputPolicy.speculate",
    "sglang_adaptive.policy:GoodputPolicy.on_launch",
    "sglang_adaptive.policy:GoodputPolicy.on_verify",
    "sglang_adaptive.decisions:DecisionLog.record",
    "sglang_adaptive.keepwarm:KVKeepWarm.before_plain",
    "sglang_adaptive.keepwarm:KVKeepWarm.after_plain",
    "sglang_adaptive.keepwarm:KVKeepWarm.before_spec",
    "sglang_adaptive.keepwarm:DeferredWrites.flush",
    "sglang_adaptive.keepwarm:DraftPass.__call__",
    "sglang.srt.model_executor.forward_batch_info:ForwardBatch.init_new",
    "sglang.srt.model_executor.model_runner:ModelRunner.forward",
    "sglang.srt.model_executor.model_runner:ModelRunner.sample",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.execute",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner.load_batch",
    "torch.cuda:Event.synchronize",
    "torch.cuda:Stream.synchronize",
    "torch.cuda:synchronize",
)

# (bucket, function) -> [calls, seconds, longest call's seconds]: the longest call tells
# a one-off (a kernel compiled on first use) from a cost every call pays.
_stats: dict = defaultdict(lambda: [0, 0.0, 0.0])
_state = {"bs": "idle", "last_dump": 0.0, "dir": None}


def _bucket_from_batch(batch) -> str:
    if batch is None:
        return "idle"
    mode = batch.forward_mode
    if mode.is_decode():
        return f"decode-{len(batch.reqs)}"
    return "extend" if mode.is_extend() else mode.name.lower()


def _wrap(name, fn):
    stats = _stats
    state = _state
    perf = time.perf_counter
    is_run_batch = name.endswith("Scheduler.run_batch")

    def timed(*args, **kwargs):
        if is_run_batch:
            state["bs"] = _bucket_from_batch(args[1] if len(args) > 1 else kwargs.get("batch"))
        t0 = perf()
        try:
            return fn(*args, **kwargs)
        finally:
            cell = stats[(state["bs"], name)]
            dt = perf() - t0
            cell[0] += 1
            cell[1] += dt
            cell[2] = max(cell[2], dt)
            if is_run_batch and t0 - state["last_dump"] > DUMP_EVERY_S:
                state["last_dump"] = t0
                dump()

    timed.__wrapped__ = fn
    timed.__name__ = getattr(fn, "__name__", name)
    timed.__qualname__ = getattr(fn, "__qualname__", name)
    return timed


def _on_gc(phase: str, info: dict) -> None:
    # Garbage-collection pauses, as if they were one more function ("gc.gen<N>"): a
    # loop that allocates more Python objects per step pays them inside whichever
    # function happened to allocate, which reads as every function getting slower.
    if phase == "start":
        _state["gc_t0"] = time.perf_counter()
        return
    t0 = _state.pop("gc_t0", None)
    if t0 is not None:
        cell = _stats[(_state["bs"], f"gc.gen{info.get('generation', '?')}")]
        dt = time.perf_counter() - t0
        cell[0] += 1
        cell[1] += dt
        cell[2] = max(cell[2], dt)


def dump() -> None:
    out: dict = {"pid": os.getpid(), "buckets": {}}
    for (bucket, name), (calls, seconds, longest) in list(_stats.items()):
        out["buckets"].setdefault(bucket, {})[name] = {"calls": calls, "s": seconds, "max_s": longest}
    path = os.path.join(_state["dir"], f"hosttime-{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, path)


def install(directory: str) -> list[str]:
    """Wrap every target that exists; return the ones that do not."""
    _state["dir"] = directory
    os.makedirs(directory, exist_ok=True)
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)
    missing = []
    for target in TARGETS:
        module_name, qualname = target.split(":")
        try:
            module = importlib.import_module(module_name)
            owner = module
            *path, attr = qualname.split(".")
            for part in path:
                owner = getattr(owner, part)
            original = inspect.getattr_static(owner, attr)
        except (ImportError, AttributeError):
            missing.append(target)
            continue
        if isinstance(original, (staticmethod, classmethod)):
            timed = type(original)(_wrap(target, original.__func__))
        else:
            timed = _wrap(target, original)
        setattr(owner, attr, timed)
        if not path:  # a function: replace the by-name imports too
            for other in list(sys.modules.values()):
                try:
                    if getattr(other, attr, None) is original:
                        setattr(other, attr, timed)
                except Exception:  # lazy or odd modules: not where it was imported
                    continue
    return missing


def maybe_install() -> None:
    directory = os.environ.get(ENV)
    if directory and _state["dir"] is None:
        missing = install(directory)
        if missing:
            print(f"sglang_adaptive.hosttime: not found: {missing}", file=sys.stderr)
