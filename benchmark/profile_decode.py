"""Profile steady decode under load and summarise where the GPU time goes.

Starts one server configuration, drives it with a closed loop at a fixed
concurrency, records ``--steps`` forward steps with SGLang's own profiler
(``/start_profile``), stops the server and writes a small JSON summary: the span of
the profiled window, how much of it the GPU was busy (union of kernel intervals),
the mean gap between consecutive CUDA-graph launches, and the top kernels by time.
Comparing the summary of two configurations (a plain server and the adaptive
worker in plain mode, say) separates a GPU-work difference (kernel totals) from a
pipeline stall (lower busy share).

usage (GPU host, from the repo root):
  python benchmark/profile_decode.py --label plain -- <server args>
  python benchmark/profile_decode.py --label adaptive-plain -- <server args> \\
      --speculative-disable-batch-threshold 0
  add --stream to drive it with streaming requests (the benchmark suite's client)
  or name a benchmark configuration on the dummy 8B pair instead of server args:
  python benchmark/profile_decode.py --label eagle3 --config eagle3 --acc-len 3.5 \\
      --concurrency 64 --output-len 384 --output-len-min 128
  (--pair tiny: on the tiny trained pair, real acceptance)
Output: $OUT/profile-LABEL.json (and the raw trace under --trace-dir, default $OUT/trace-LABEL/).
The summary's ``batches`` splits the profiled scheduler iterations by kind (extend or
decode; ``-plain`` where the adaptive worker ran its plain path): host time per
iteration, the GPU time of the kernels it launched, how far the GPU was behind when
it started, and the host calls that wait for the GPU with the SGLang function that
made them.
"""

from __future__ import annotations

import argparse
import bisect
import glob
import gzip
import json
import os
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

from sglang_adaptive.bench import client, configs
from sglang_adaptive.bench.workloads import Closed
from sglang_adaptive.testing import Server, generate, make_requests


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def _thread(e):
    return e.get("pid"), e.get("tid")


def _main_thread(events):
    """The thread that holds most of these events (the scheduler's launching thread)."""
    return Counter(map(_thread, events)).most_common(1)[0][0]


def _interval(starts, ends, ts):
    """Index of the sorted, disjoint interval [starts[i], ends[i]) holding ``ts``, or None."""
    i = bisect.bisect_right(starts, ts) - 1
    return i if i >= 0 and ts < ends[i] else None


def summarise(trace_path: str, top: int = 15) -> dict:
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    launch_events = [e for e in events if e.get("name") == "cudaGraphLaunch"]
    if not kernels:
        return {"error": "no kernel events in the trace"}
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in kernels)
    busy, cur_start, cur_end = 0.0, *spans[0]
    for start, end in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    window = spans[-1][1] - spans[0][0]
    per_kernel = defaultdict(float)
    for e in kernels:
        per_kernel[e["name"][:120]] += e["dur"]
    launches = sorted(e["ts"] for e in launch_events)
    gaps = [b - a for a, b in zip(launches, launches[1:])]
    summary = {
        "window_ms": round(window / 1e3, 3),
        "gpu_busy_share": round(busy / window, 4),
        "kernel_time_ms": round(sum(e["dur"] for e in kernels) / 1e3, 3),
        "graph_launches": len(launches),
        "mean_launch_gap_ms": round(sum(gaps) / len(gaps) / 1e3, 3) if gaps else None,
        "top_kernels_ms": {k: round(v / 1e3, 3) for k, v in
                           sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]},
    }
    summary.update(per_step(events, launch_events, kernels, top))
    summary["batches"] = per_batch(events, kernels, top)
    return summary


# CUDA runtime calls that can block the host until the GPU catches up (a copy to or
# from pageable memory, or an explicit wait).
WAITS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
         "cudaMemcpyAsync", "cudaMemcpy", "cudaStreamWaitEvent")


def _frame(name: str) -> str:
    # "sglang/srt/managers/scheduler.py(1234): run_batch" -> "scheduler.py:run_batch"
    path, _, func = name.partition(": ")
    return f"{path.rsplit('/', 1)[-1].split('(')[0]}:{func}" if func else name


def per_batch(events, kernels, top: int) -> dict:
    """Per scheduler iteration (``Scheduler.run_batch`` on the launching thread, seen
    through the profiler's Python frames), by kind: medians of its host time, of the
    GPU time of the kernels it launched (matched by correlation id), of the lag from
    its start to its first kernel's start (the GPU still busy with earlier batches),
    and of its waiting calls (``WAITS``), with the innermost SGLang frame around each
    wait over 0.1 ms and their total milliseconds over all iterations of the kind; and
    the SGLang functions that took the most host time per iteration (inclusive, mean),
    which shows where a host-bound iteration goes."""
    py = [e for e in events if e.get("cat") == "python_function" and "dur" in e]
    runs = [e for e in py if e["name"].endswith(": run_batch") and "scheduler" in e["name"]]
    if not runs:
        return {}
    tid = _main_thread(runs)
    same = lambda e: _thread(e) == tid  # noqa: E731
    runs = sorted((e for e in runs if same(e)), key=lambda e: e["ts"])
    starts, ends = [e["ts"] for e in runs], [e["ts"] + e["dur"] for e in runs]
    owner = lambda e: _interval(starts, ends, e["ts"])  # noqa: E731

    inside = defaultdict(list)
    for e in py:
        if same(e) and (i := owner(e)) is not None:
            inside[i].append(e)
    kernel_by_corr = defaultdict(list)
    for k in kernels:
        corr = (k.get("args") or {}).get("correlation")
        if corr is not None:
            kernel_by_corr[corr].append(k)
    host = defaultdict(list)
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and same(e) and (i := owner(e)) is not None:
            host[i].append(e)
    kinds = defaultdict(lambda: {"n": 0, "host": [], "gpu": [], "lag": [], "wait": [], "waits": defaultdict(float),
                                 "frames": defaultdict(float), "calls": defaultdict(int)})
    for i, run in enumerate(runs):
        names = [f["name"] for f in inside[i]]
        extend = any(n.endswith(": forward_extend") for n in names)
        kind = "extend" if extend else "decode"
        if any(n.endswith(("_forward_plain", "_prefill_plain")) for n in names):
            kind += "-plain"
        d = kinds[kind]
        d["n"] += 1
        d["host"].append(run["dur"])
        for f in inside[i]:
            if "sglang" in f["name"] and f is not run:
                d["frames"][_frame(f["name"])] += f["dur"]
                d["calls"][_frame(f["name"])] += 1
        launched = [k for h in host[i] for k in kernel_by_corr.get((h.get("args") or {}).get("correlation"), ())]
        d["gpu"].append(sum(k["dur"] for k in launched))
        d["lag"].append(min(k["ts"] for k in launched) - run["ts"] if launched else 0.0)
        waited = 0.0
        for h in host[i]:
            if h["name"] not in WAITS:
                continue
            waited += h["dur"]
            if h["dur"] < 100:
                continue
            frames = [f for f in inside[i] if f["ts"] <= h["ts"] < f["ts"] + f["dur"] and "sglang" in f["name"]]
            where = _frame(max(frames, key=lambda f: (f["ts"], -f["dur"]))["name"]) if frames else "?"
            d["waits"][f"{where} {h['name']}"] += h["dur"]
        d["wait"].append(waited)
    ms = lambda us: round(us / 1e3, 3)  # noqa: E731
    ranked = {kind: sorted(d["frames"], key=lambda k: -d["frames"][k])[:top] for kind, d in kinds.items()}
    return {kind: {"iterations": d["n"], "median_host_ms": ms(_median(d["host"])),
                   "median_gpu_ms": ms(_median(d["gpu"])), "median_gpu_lag_ms": ms(_median(d["lag"])),
                   "median_wait_ms": ms(_median(d["wait"])),
                   "waits_total_ms": {k: ms(v) for k, v in
                                      sorted(d["waits"].items(), key=lambda kv: -kv[1])[:top]},
                   "host_ms_per_iteration": {k: ms(d["frames"][k] / d["n"]) for k in ranked[kind]},
                   # the same frames: a function one configuration calls and the other
                   # does not shows here even where its time is small
                   "calls_per_iteration": {k: round(d["calls"][k] / d["n"], 2) for k in ranked[kind]}}
            for kind, d in sorted(kinds.items())}


def per_step(events, launch_events, kernels, top: int) -> dict:
    """Median per decode step (between graph launches of the launching thread):
    host time in each CUDA runtime call and aten op, eager kernels, GPU busy time.
    Steps longer than twice the median (prefills in between) are left out."""
    if len(launch_events) < 3:
        return {}
    main = _main_thread(launch_events)
    launches = sorted(e["ts"] for e in launch_events if _thread(e) == main)
    steps = list(zip(launches, launches[1:]))
    med = _median([b - a for a, b in steps])
    steps = [(a, b) for a, b in steps if b - a <= 2 * med]
    host = [e for e in events if _thread(e) == main and "dur" in e
            and e.get("cat") in ("cuda_runtime", "cpu_op", "cuda_driver")]
    by_step = [defaultdict(float) for _ in steps]
    counts = [defaultdict(int) for _ in steps]
    gpu = [0.0] * len(steps)
    starts, ends = [a for a, _ in steps], [b for _, b in steps]
    for e in host:
        if (i := _interval(starts, ends, e["ts"])) is not None:
            key = f"{e['cat']}:{e['name'][:80]}"
            by_step[i][key] += e["dur"]
            counts[i][key] += 1
    for e in kernels:
        if (i := _interval(starts, ends, e["ts"])) is not None:
            gpu[i] += e["dur"]
    names = {k for d in by_step for k in d}
    med_time = {k: _median([d.get(k, 0.0) for d in by_step]) for k in names}
    med_count = {k: _median([c.get(k, 0) for c in counts]) for k in names}
    ranked = sorted(names, key=lambda k: -med_time[k])[: 2 * top]
    return {
        "decode_steps": len(steps),
        "median_step_ms": round(med / 1e3, 3),
        "median_gpu_kernel_ms_per_step": round(_median(gpu) / 1e3, 3),
        "host_per_step_ms": {k: [round(med_time[k] / 1e3, 3), med_count[k]] for k in ranked},
        "eager_launches_per_step": sum(v for k, v in med_count.items()
                                       if "LaunchKernel" in k),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", required=True)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--num", type=int, default=512)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--output-len-min", type=int, default=None,
                   help="output lengths drawn uniformly from [this, --output-len] (default: all equal)")
    p.add_argument("--config", default=None,
                   help="a benchmark configuration (sglang_adaptive.bench.configs) on --pair's models, "
                        "instead of server args")
    p.add_argument("--acc-len", type=float, default=2.5, help="with --config: simulated acceptance")
    p.add_argument("--pair", choices=("dummy", "tiny"), default="dummy",
                   help="with --config: the dummy 8B pair (simulated acceptance) or the tiny trained pair")
    p.add_argument("--top", type=int, default=15, help="how many kernels, waits and host frames to list")
    p.add_argument("--trace-dir", default=None, help="where the raw trace goes (default $OUT/trace-LABEL)")
    p.add_argument("--warmup-s", type=float, default=6.0, help="load time before profiling")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--stream", action="store_true",
                   help="drive with the benchmark's streaming client (one output chunk a step "
                        "per request, as interactive clients receive them)")
    p.add_argument("server_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    server_args, env = [x for x in a.server_args if x != "--"], {}
    if a.config:
        pair = configs.tiny_pair() if a.pair == "tiny" else configs.dummy_pair(a.acc_len)
        (cfg,) = configs.server_configs(pair, [a.config])
        server_args, env = cfg.args + server_args, cfg.env
    out = Path(os.environ.get("OUT", "/tmp"))
    trace_dir = Path(a.trace_dir) if a.trace_dir else out / f"trace-{a.label}"
    trace_dir.mkdir(parents=True, exist_ok=True)
    reqs = make_requests(a.num, vocab=configs.prompt_vocab(a.pair), in_range=(a.input_len, a.input_len),
                         out_range=(a.output_len_min or a.output_len, a.output_len))
    with Server(a.label, server_args, env, log_dir=out) as srv:
        done: dict = {}

        def drive():
            t0 = time.time()
            if a.stream:
                records, _, seconds = client.run(srv.url, Closed(a.concurrency, a.num), reqs)
                done["tok_per_s"] = sum(r.output_tokens for r in records if r.error is None) / seconds
                return
            results = generate(srv.url, reqs, a.concurrency)
            done["tok_per_s"] = sum(r["meta_info"]["completion_tokens"] for r in results) / (time.time() - t0)

        load = threading.Thread(target=drive, daemon=True)
        load.start()
        time.sleep(a.warmup_s)
        body = json.dumps({"output_dir": str(trace_dir), "num_steps": a.steps,
                           "activities": ["CPU", "GPU"]}).encode()
        req = urllib.request.Request(srv.url + "/start_profile", data=body,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=600).read()
        load.join()
        deadline = time.time() + 120  # the profiler writes its trace after the last step
        while not glob.glob(str(trace_dir / "*.trace.json*")) and time.time() < deadline:
            time.sleep(2)
    traces = sorted(glob.glob(str(trace_dir / "*.trace.json*")))
    summary = {"label": a.label, "concurrency": a.concurrency, "steps": a.steps, "stream": a.stream,
               "trace": traces[-1] if traces else None,
               # the whole closed loop, profiled steps included (they run slower)
               "output_tok_per_s": round(done.get("tok_per_s", float("nan")), 1)}
    summary.update(summarise(traces[-1], a.top) if traces else {"error": "no trace written"})
    (out / f"profile-{a.label}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
