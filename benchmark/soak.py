"""Soak: an open-loop load oscillating across the switching point, with every request
kind and aborts, on SGLang's strict memory check; what it served and what it leaked.

One adaptive server (the dummy Llama-3-8B-shaped pair by default, simulated
acceptance, ``--speculative-disable-batch-threshold 16``; or the goodput policy)
gets Poisson arrivals whose rate follows a sine between ``--low`` and ``--high``
requests/s with period ``--period`` seconds, for ``--minutes``. The request mix
(``KINDS``): greedy, logprobs (top-k and token ids), ``max_new_tokens=1``,
``n=2`` parallel sampling, temperature 0.8 with penalties, stop token ids,
a client that disconnects mid-stream, and ``/abort_request`` by request id.

Before the clock starts it sends one request of each kind, one after another, and
times them: a kind's first request may pay a one-time cost (a kernel compiled on
first use) that would otherwise stall the soak's first minutes; that cost is
reported as the warm-up. Every ``--sample-every`` seconds it records the GPU memory
the server's processes hold (``nvidia-smi``; other jobs on the GPU do not count) and
the KV tokens in use (``sglang:num_used_tokens`` from ``/metrics``). At the end
it waits for the server to drain and reports, as JSON, a markdown table and a plot:
requests per kind and outcome, errors (with when they happened), how many requests
the server itself received and answered otherwise than 200 (its
``sglang:http_requests_total`` / ``http_responses_total``), the longest time with
requests in flight and none finishing, KV tokens in use at the start and at the end
(they must match), GPU memory over time, and the mode counters.

usage (GPU host, after ``source .gpu-bundle/gpu/setup-host.sh``):
  python benchmark/soak.py --minutes 20 --out $OUT/soak
  python benchmark/soak.py --minutes 20 --policy goodput --out $OUT/soak-goodput
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

from sglang_adaptive.bench import configs
from sglang_adaptive.bench.client import _one
from sglang_adaptive.bench.metrics import busy_stretches
from sglang_adaptive.testing import (
    Server,
    abort_by_rid,
    client_session,
    disconnect_midstream,
    metric_value,
    scrape_metrics as scrape,
    without_flags,
)

KINDS = ("greedy", "logprobs", "one-token", "parallel-2", "sampled-penalties", "stop-ids",
         "disconnect", "abort-request")
# How often each kind is drawn (the rest of the mass is greedy).
MIX = {"logprobs": 0.08, "one-token": 0.05, "parallel-2": 0.05, "sampled-penalties": 0.1,
       "stop-ids": 0.05, "disconnect": 0.04, "abort-request": 0.03}
STRICT_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1"}
# Warmed up before the clock: the kinds that complete (the abort kinds only cut them short).
WARM_KINDS = tuple(k for k in KINDS if k not in ("disconnect", "abort-request"))


def rate_at(t: float, low: float, high: float, period: float) -> float:
    """Requests/s at ``t``: a sine from ``low`` (t = 0) up to ``high`` and back."""
    return low + (high - low) * (1 - math.cos(2 * math.pi * t / period)) / 2


def arrivals(seconds: float, low: float, high: float, period: float, seed: int = 0) -> list[float]:
    """Poisson arrival times with the time-varying rate (thinning)."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(high)
        if t >= seconds:
            return out
        if rng.random() < rate_at(t, low, high, period) / high:
            out.append(t)


def draw_kind(rng: random.Random) -> str:
    x, acc = rng.random(), 0.0
    for kind, p in MIX.items():
        acc += p
        if x < acc:
            return kind
    return "greedy"


def make_request(kind: str, rng: random.Random, vocab: int, in_len=(16, 512), out_len=(16, 256)) -> dict:
    params = {"max_new_tokens": rng.randint(*out_len), "temperature": 0.0, "ignore_eos": True}
    req = {"input_ids": [rng.randrange(1000, vocab) for _ in range(rng.randint(*in_len))],
           "rid": f"soak-{kind}-{uuid.uuid4().hex[:12]}"}
    if kind == "logprobs":
        # No token_ids_logprob: SGLang 0.5.17's scheduler dies on a batch where some requests
        # ask for it and some do not, with or without speculation (sgl-project/sglang#35705);
        # the first soak hit it 4 minutes in. Every request of test_request_kinds asks for it.
        req.update(return_logprob=True, top_logprobs_num=3)
    elif kind == "one-token":
        params["max_new_tokens"] = 1
    elif kind == "parallel-2":
        params.update(n=2, temperature=0.7)
    elif kind == "sampled-penalties":
        params.update(temperature=0.8, top_p=0.95, frequency_penalty=0.3, presence_penalty=0.2,
                      repetition_penalty=1.1)
    elif kind == "stop-ids":
        params.update(stop_token_ids=[rng.randrange(1000, vocab) for _ in range(8)], ignore_eos=False)
    req["sampling_params"] = params
    return req


def generate_calls(metrics_text: str) -> tuple[float | None, float | None]:
    """(``/generate`` requests the server received, its ``/generate`` responses other
    than 200) from a ``/metrics`` scrape: what reached the server, whatever the client saw."""
    received = metric_value(metrics_text, "sglang:http_requests_total", endpoint="/generate")
    answered = metric_value(metrics_text, "sglang:http_responses_total", endpoint="/generate")
    ok = metric_value(metrics_text, "sglang:http_responses_total", endpoint="/generate", status_code="200")
    return received, None if answered is None else answered - (ok or 0)


def longest_stall(spans: list[tuple[float, float]]) -> float:
    """The longest time during which requests were in flight and none finished, from
    (sent, ended) spans: a stalled scheduler shows here, an idle one does not."""
    gaps = (y - x for start, _, ends in busy_stretches(spans) for x, y in zip([start, *ends], ends))
    return max(gaps, default=0.0)


def kv_tokens_in_use(metrics_text: str) -> int | None:
    """KV tokens in use from a ``/metrics`` scrape (summed over its label sets)."""
    found = metric_value(metrics_text, "sglang:num_used_tokens")
    return None if found is None else int(found)


def gpu_memory_mib(pgid: int | None = None) -> list[int]:
    """MiB in use on each GPU; with ``pgid``, one figure: what the processes of that
    process group (the soak's server) hold, so jobs beside it do not count."""
    query = "--query-gpu=memory.used" if pgid is None else "--query-compute-apps=pid,used_memory"
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        if pgid is None:
            return [int(x) for x in out.split()]
        return [sum(mib for pid, mib in parse_compute_apps(out) if _pgid(pid) == pgid)]
    except (OSError, ValueError, subprocess.SubprocessError):
        return []


def parse_compute_apps(out: str) -> list[tuple[int, int]]:
    """(pid, MiB) from ``nvidia-smi --query-compute-apps=pid,used_memory`` CSV lines."""
    rows = [line.split(",") for line in out.splitlines() if line.strip()]
    return [(int(pid), int(mib)) for pid, mib in rows]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:  # gone, or in another PID namespace
        return None


async def drive(url: str, times: list[float], kinds: list[str], reqs: list[dict], timeout: float,
                on_tick=None, tick_s: float = 5.0) -> list[tuple[str, str, float, float]]:
    """Send each request at its time; returns (kind, outcome, sent, ended) per request,
    times in seconds from the start."""
    outcomes: list[tuple[str, str, float, float]] = []
    rng = random.Random(1)
    async with client_session(timeout) as s:
        t0 = time.monotonic()

        async def one(at, kind, req):
            await asyncio.sleep(max(0.0, at - (time.monotonic() - t0)))
            sent = time.monotonic() - t0
            try:
                if kind == "disconnect":  # or "finished before the disconnect": short requests may
                    outcome = await disconnect_midstream(s, url, req, chunks=rng.randint(1, 50))
                elif kind == "abort-request":
                    status = await abort_by_rid(s, url, req, after=rng.uniform(0.05, 1.0))
                    outcome = ("aborted" if status == "200 abort" else
                               "finished before the abort" if status.startswith("200 ") else f"error: {status}")
                else:
                    rec = await _one(s, url, req)
                    outcome = "ok" if rec.error is None else f"error: {rec.error}"
            except Exception as e:  # counted, with the first ones listed in the summary
                outcome = f"error: {type(e).__name__}: {e}"[:200]
            outcomes.append((kind, outcome, round(sent, 3), round(time.monotonic() - t0, 3)))

        async def ticker():
            while True:
                await asyncio.sleep(tick_s)
                if on_tick:  # nvidia-smi and /metrics block: keep the sends on time
                    await asyncio.to_thread(on_tick, time.monotonic() - t0)

        tick = asyncio.ensure_future(ticker())
        await asyncio.gather(*(one(t, k, r) for t, k, r in zip(times, kinds, reqs)))
        tick.cancel()
    return outcomes


async def warm_up(url: str, reqs: dict[str, dict], timeout: float) -> dict[str, float | str]:
    """Each request in turn; seconds each took, or its error."""
    took: dict[str, float | str] = {}
    async with client_session(timeout) as s:
        for kind, req in reqs.items():
            t = time.monotonic()
            rec = await _one(s, url, req)
            took[kind] = round(time.monotonic() - t, 2) if rec.error is None else f"error: {rec.error}"
    return took


def summarize(outcomes, samples, kv_start, kv_end, mode_line, server_calls=(None, None),
              warmup=None) -> dict:
    """``server_calls``: the (received, answered otherwise than 200) ``/generate`` counts
    of the server over the run, from ``generate_calls`` before and after."""
    by_kind = Counter(kind for kind, *_ in outcomes)
    by_outcome = Counter(o if not o.startswith("error") else "error" for _, o, *_ in outcomes)
    errors = [f"{sent:.0f} s {k}: {o}" for k, o, sent, _ in outcomes if o.startswith("error")]
    memory = [m for _, m, _ in samples if m]
    received, not_ok = server_calls
    return {
        "requests": len(outcomes), "by_kind": dict(by_kind), "by_outcome": dict(by_outcome),
        "errors": len(errors), "first_errors": errors[:20],
        "server_received": received, "server_not_200": not_ok,
        "longest_stall_s": round(longest_stall([(a, b) for *_, a, b in outcomes]), 1),
        "warmup_s": warmup or {},
        "kv_tokens_start": kv_start, "kv_tokens_end": kv_end,
        "kv_leak": None if kv_start is None or kv_end is None else kv_end - kv_start,
        "gpu_memory_mib_first": memory[0] if memory else None,
        "gpu_memory_mib_last": memory[-1] if memory else None,
        "gpu_memory_mib_max": max((max(m) for m in memory), default=None),
        "mode_counters": mode_line, "samples": samples,
    }


def markdown(summary: dict) -> str:
    warm = ", ".join(f"{k} {v}" for k, v in summary["warmup_s"].items()) or "-"
    rows = [("requests sent", summary["requests"]), ("errors", summary["errors"]),
            ("requests the server received (its /metrics)", summary["server_received"]),
            ("server answers other than 200", summary["server_not_200"]),
            ("longest time with requests in flight and none finishing (s)", summary["longest_stall_s"]),
            ("warm-up before the clock, first request per kind (s)", warm),
            *((f"outcome: {k}", v) for k, v in sorted(summary["by_outcome"].items())),
            *((f"kind: {k}", v) for k, v in sorted(summary["by_kind"].items())),
            ("KV tokens in use at start / end", f"{summary['kv_tokens_start']} / {summary['kv_tokens_end']}"),
            ("GPU memory (MiB) first / last / max", f"{summary['gpu_memory_mib_first']} / "
             f"{summary['gpu_memory_mib_last']} / {summary['gpu_memory_mib_max']}"),
            ("mode counters at the end", summary["mode_counters"] or "-")]
    return "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def plot(summary: dict, path: Path) -> bool:
    from sglang_adaptive.bench.report import _pyplot, save

    plt = _pyplot()
    samples = summary["samples"]
    if plt is None or not samples:
        return False
    fig, (ax_m, ax_k) = plt.subplots(2, 1, figsize=(7, 5), dpi=100, sharex=True)
    ts = [t / 60 for t, _, _ in samples]
    for gpu in range(max((len(m) for _, m, _ in samples), default=0)):
        ax_m.plot(ts, [m[gpu] if len(m) > gpu else float("nan") for _, m, _ in samples],
                  label="server" if len(samples[0][1]) == 1 else f"GPU {gpu}")
    ax_m.set_ylabel("GPU memory used (MiB)")
    ax_m.legend(fontsize=8)
    ax_k.plot(ts, [k if k is not None else float("nan") for _, _, k in samples])
    ax_k.set_ylabel("KV tokens in use")
    ax_k.set_xlabel("minutes")
    for ax in (ax_m, ax_k):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--low", type=float, default=1.0, help="requests/s at the trough")
    # 20/s crosses the threshold of 16 and still lets the dummy 8B server on one H200
    # drain between peaks (benchmark/results/2026-12-01-h200-soak-20min).
    p.add_argument("--high", type=float, default=20.0, help="requests/s at the peak")
    p.add_argument("--period", type=float, default=240.0, help="seconds from trough to trough")
    p.add_argument("--policy", choices=("threshold", "goodput"), default="threshold")
    p.add_argument("--threshold", type=int, default=16)
    p.add_argument("--acc-len", type=float, default=2.5)
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mem-fraction-static", type=float, default=None,
                   help="the server's memory fraction (default: the benchmark's); lower it when GPU "
                        "tests share the GPU with the soak")
    p.add_argument("--out", default="benchmark/results/latest/soak")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    pair = configs.dummy_pair(args.acc_len)
    label = "adaptive-threshold" if args.policy == "threshold" else "adaptive-goodput"
    (config,) = configs.server_configs(pair, (label,), threshold=args.threshold)
    server_args = config.args + ["--enable-metrics"]
    if args.mem_fraction_static is not None:
        server_args = without_flags(server_args, ("--mem-fraction-static",)) + [
            "--mem-fraction-static", str(args.mem_fraction_static)]
    server = Server(f"soak-{label}", server_args, {**config.env, **STRICT_ENV},
                    log_dir=out)
    times = arrivals(60 * args.minutes, args.low, args.high, args.period, args.seed)
    rng = random.Random(args.seed)
    kinds = [draw_kind(rng) for _ in times]
    reqs = [make_request(k, rng, vocab=32000) for k in kinds]
    print(f"soak: {len(times)} requests over {args.minutes} min, {label}; log {server.log_path}", flush=True)

    samples: list = []
    # Each sample is also written as it is taken: a soak cut short (a lease that ends
    # first) still leaves its memory and KV timeline.
    progress = out / "samples.jsonl"
    progress.write_text("")

    def on_tick(t):
        samples.append((round(t, 1), gpu_memory_mib(server_pgid), kv_tokens_in_use(scrape(server.url))))
        with progress.open("a") as f:
            f.write(json.dumps(samples[-1]) + "\n")

    server.start()
    # Its own processes' memory (the server starts its own session): the GPU tests of
    # gpu-host-run's soakplus step run beside it.
    server_pgid = server.proc.pid if getattr(server, "proc", None) else None
    try:
        time.sleep(2)
        warmup = asyncio.run(warm_up(server.url, {k: make_request(k, rng, vocab=32000) for k in WARM_KINDS},
                                     timeout=1200))
        print(f"warm-up (s): {warmup}", flush=True)
        before = scrape(server.url)
        kv_start = kv_tokens_in_use(before)
        outcomes = asyncio.run(drive(server.url, times, kinds, reqs, timeout=60 * args.minutes + 600,
                                     on_tick=on_tick, tick_s=args.sample_every))
        server.settle(quiet=3.0, limit=60.0)
        time.sleep(5)  # the gauges refresh on the scheduler's next report
        final_metrics = scrape(server.url)
        kv_end = kv_tokens_in_use(final_metrics)
        calls = [(after - first) if None not in (after, first) else None
                 for after, first in zip(generate_calls(final_metrics), generate_calls(before))]
        (out / "metrics.txt").write_text(final_metrics)  # the adaptive series beside SGLang's
        log = server.log_text()
        mode = re.findall(r"AdaptiveEAGLE (decode batches: .*)", log)
    finally:
        server.stop()
    summary = summarize(outcomes, samples, kv_start, kv_end, mode[-1] if mode else None,
                        server_calls=tuple(calls), warmup=warmup)
    (out / "soak.json").write_text(json.dumps({"args": vars(args), **summary}, indent=1))
    (out / "soak.md").write_text(markdown(summary))
    plot(summary, out / "soak.png")
    print(markdown(summary))
    leaked = summary["kv_leak"] not in (0, None)
    warm_failed = any(isinstance(v, str) for v in warmup.values())
    return 1 if summary["errors"] or leaked or summary["server_not_200"] or warm_failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
