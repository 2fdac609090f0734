"""Serve a target/draft pair in every mode, drive each with the same loads, report.

For each configuration (no speculation, static EAGLE-3, upstream
--speculative-adaptive, this package's threshold policy) one server is started,
waited for, driven through every workload and stopped before the next starts:

  closed   a closed-loop concurrency sweep (--closed)
  open     an open-loop Poisson request-rate sweep (--rates)
  phased   a time-varying closed loop, phases of low and high concurrency (--phases)

Writes OUT/results.jsonl (one row per configuration x load point, appended as it
goes), OUT/report.md, PNG plots and the server logs; a goodput server's step-cost
table after each point goes to OUT/cost-tables.jsonl, and with --decision-log its
reason for each decode batch's mode to OUT/decisions-NAME.jsonl (rows count them).

examples (GPU host):
  python -m sglang_adaptive.bench --out benchmark/results/latest
  python -m sglang_adaptive.bench --pair tiny --closed 1,8,32 --rates "" --phases ""
  python -m sglang_adaptive.bench --pair custom --target T --draft D --threshold 8
  python -m sglang_adaptive.bench --dry-run        # print the plan, start nothing
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sglang_adaptive import decisions
from sglang_adaptive.bench import client, configs, hostload, metrics, pinning, report
from sglang_adaptive.bench.workloads import (
    Closed,
    Open,
    Phased,
    parse_floats,
    parse_ints,
    parse_phases,
    with_json_schema,
)
from sglang_adaptive.testing import PORT_BASE_ENV, Server, make_requests, without_flags


# Low concurrencies get at least this many requests: with 8 at concurrency 1 the
# TTFT p50 of static EAGLE-3 and of the adaptive server speculating every batch
# differed by 15 ms on the H200, with 24 by 3 ms: sampling noise.
MIN_CLOSED_REQUESTS = 24

# A slice of an interleaved point holds at least this many waves of requests: fewer,
# and filling and draining the batch would be most of it.
MIN_SLICE_WAVES = 4

# Interleaved servers share one GPU: together their static memory (weights and KV
# pool) takes this share of it; the rest is for their CUDA graphs and activations.
INTERLEAVE_GPU_SHARE = 0.6


def memory_fraction(k: int, n: int) -> float:
    """--mem-fraction-static of the k-th of n servers started one after another on one
    GPU. SGLang applies it to the memory free when the server starts, so each holds
    INTERLEAVE_GPU_SHARE / n of the GPU only if its fraction grows by what the k
    earlier servers took."""
    share = INTERLEAVE_GPU_SHARE / n
    return round(share / (1 - k * share), 3)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m sglang_adaptive.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", choices=("dummy", "k25", "tiny", "custom"), default="dummy",
                   help="dummy: shipped Llama-3-8B-shaped configs, random weights, simulated "
                        "acceptance (default); k25: the Kimi-K2.5-shaped MLA + MoE configs with the "
                        "users' flags at --tp (default 2); tiny: the trained fixture pair; "
                        "custom: --target/--draft")
    p.add_argument("--tp", type=int, default=2, help="tensor parallel size of the k25 pair")
    p.add_argument("--k25-layers", type=int, choices=sorted(configs.K25_LAYERS), default=4,
                   help="depth of the k25 target: 4 (default) or 16, where a decode step is long "
                        "enough to hide the scheduler's host work (shape k25-l16-tp2)")
    p.add_argument("--target")
    p.add_argument("--draft")
    p.add_argument("--configs", default=",".join(configs.LABELS))
    p.add_argument("--threshold", type=int, default=16, help="adaptive-threshold's batch size")
    p.add_argument("--steps", type=int, default=3, help="speculative steps (topk 1, steps+1 draft tokens)")
    p.add_argument("--acc-len", type=float, default=2.5, help="simulated acceptance (dummy pair)")
    p.add_argument("--keep-warm", default="",
                   help="draft keep-warm strategies (none,kv,full): serve each switching "
                        "configuration once per strategy (default: the server's default only)")
    p.add_argument("--json-share", type=float, default=0.0,
                   help="share of requests constrained to a JSON schema (structured output with "
                        "xgrammar; needs a pair with a tokenizer: tiny or custom); rows gain "
                        "json_share, json_requests and json_valid")
    p.add_argument("--max-bs", type=int, default=128)
    p.add_argument("--closed", default="1,8,32,128", help="concurrencies; empty to skip")
    p.add_argument("--requests-per-client", type=int, default=4,
                   help=f"closed loop: requests per concurrency slot (at least {MIN_CLOSED_REQUESTS} in all)")
    p.add_argument("--rates", default="4,16,48", help="open loop, requests/s; empty to skip")
    p.add_argument("--open-seconds", type=float, default=8.0, help="open loop: requests = rate x this")
    p.add_argument("--phases", default="15:2,15:96,15:2",
                   help="time-varying load, SECONDS:CONCURRENCY,...; empty to skip")
    p.add_argument("--rounds", type=int, default=1,
                   help="serve the configurations this many times in turn (a, b, a, b, ...), each time "
                        "on a fresh server; rows carry `round`, the report shows medians and the "
                        "spread (servers running the same mode at c=128 differed by up to 7%%: "
                        "benchmark/results/2026-12-01-h200-goodput-8waves)")
    p.add_argument("--warmup", type=int, default=1,
                   help="unmeasured closed-loop passes at the largest load before measuring (0: none): "
                        "the first server on a fresh host compiles kernels for new prefill shapes "
                        "on first use and would look slower than the servers after it")
    p.add_argument("--in-len", type=int, default=256)
    p.add_argument("--out-len", type=int, default=256)
    p.add_argument("--out-len-min", type=int, default=None,
                   help="output lengths drawn uniformly from [this, --out-len] (default: all --out-len). "
                        "With one length a closed loop's requests finish together, their successors "
                        "prefill in one batch on a no-spec server and in many small ones on a "
                        "speculating server, whose requests finish steps apart "
                        "(benchmark/results/2026-12-02-h200-goodput-mid); real traffic has neither")
    p.add_argument("--vocab", type=int, default=None, help="prompt token ids below this (default: by pair)")
    p.add_argument("--out", default="benchmark/results/latest")
    p.add_argument("--port", type=int, default=int(os.environ.get(PORT_BASE_ENV, "30000")),
                   help=f"server port (default: env {PORT_BASE_ENV}, else 30000); sweeps run side by "
                        "side on one host, one per GPU (CUDA_VISIBLE_DEVICES), need distinct ports")
    p.add_argument("--decision-log", action="store_true",
                   help="goodput servers log why each decode batch ran in its mode (OUT/decisions-NAME.jsonl; "
                        "about 70 us a batch on the H100's host, so leave it off where throughput is judged); "
                        "rows count the reasons per point")
    p.add_argument("--pin-cpus", action="store_true",
                   help="pin each scheduler process to a physical core of its own and everything else "
                        "(the server's other processes, this client) to the other cores: a host-bound pair's "
                        "speed then depends on the code, not on where the OS ran the scheduler "
                        "(bench/pinning.py); rows carry pinned: true")
    p.add_argument("--interleave", type=int, default=0, metavar="SLICES",
                   help="serve every configuration at once (each on its own port, with --pin-cpus on its own "
                        "core) and measure each closed-loop point in up to SLICES slices taken in turn, the "
                        "same requests for every configuration within a slice (each slice at least "
                        f"{MIN_SLICE_WAVES} waves), with --pin-cpus the schedulers' cores rotating each slice: "
                        "a host whose speed drifts over seconds, or a slower core, then slows every "
                        "configuration alike. Closed loop only; the servers start one after another, together "
                        f"holding {INTERLEAVE_GPU_SHARE:.0%} of the GPU in equal shares, so for pairs that fit "
                        "so (the tiny pair); rows carry slices and slice_tok_per_s")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    if a.pair == "custom" and not (a.target and a.draft):
        p.error("--pair custom needs --target and --draft")
    if a.json_share and a.pair not in ("tiny", "custom"):
        p.error("--json-share needs a pair with a tokenizer (--pair tiny or custom)")
    if not 0 <= a.json_share <= 1:
        p.error(f"--json-share must be within [0, 1], got {a.json_share}")
    if a.rounds < 1:
        p.error(f"--rounds must be >= 1, got {a.rounds}")
    if a.interleave < 0:
        p.error(f"--interleave takes a number of slices >= 1, got {a.interleave}")
    if a.interleave and (a.rates.strip() or a.phases.strip()):
        p.error('--interleave measures closed-loop points only: add --rates "" --phases ""')
    if a.out_len_min is not None and not 1 <= a.out_len_min <= a.out_len:
        p.error(f"--out-len-min must be within [1, --out-len={a.out_len}], got {a.out_len_min}")
    return a


def workloads(a) -> list:
    out = [Closed(c, max(MIN_CLOSED_REQUESTS, a.requests_per_client * c)) for c in parse_ints(a.closed)]
    out += [Open(r, max(8, int(r * a.open_seconds)), seed=i) for i, r in enumerate(parse_floats(a.rates))]
    if a.phases.strip():
        out.append(Phased(parse_phases(a.phases)))
    return out


def pair_of(a) -> configs.Pair:
    if a.pair == "dummy":
        return configs.dummy_pair(a.acc_len)
    if a.pair == "k25":
        return configs.k25_pair(a.acc_len, a.tp, layers=a.k25_layers)
    if a.pair == "tiny":
        return configs.tiny_pair()
    return configs.custom_pair(a.target, a.draft)


def prompt_vocab(a) -> int:
    return a.vocab or configs.prompt_vocab(a.pair)


def out_range(a) -> tuple[int, int]:
    return (a.out_len if a.out_len_min is None else a.out_len_min, a.out_len)


def requests_for(workload, a, seed: int):
    vocab = prompt_vocab(a)
    def batch(n, s):
        return with_json_schema(make_requests(n, seed=s, vocab=vocab, in_range=(a.in_len, a.in_len),
                                              out_range=out_range(a)), a.json_share)
    if isinstance(workload, Phased):
        rng = random.Random(seed)
        return lambda i: batch(1, rng.randrange(1 << 30))[0]
    return batch(workload.num_requests, seed)


WARMUP_OUT_LEN = 32


def warm_up(url: str, a) -> None:
    """The largest closed or phased load, at a short output length: the prefill and
    decode shapes of a full batch get compiled, and an adaptive server's step-cost
    table and acceptance estimate start from the warm-up, as a server that has been
    up a while would. Open-loop loads and single-request prefills are not warmed."""
    peaks = list(parse_ints(a.closed))
    if a.phases.strip():
        peaks += [c for _, c in parse_phases(a.phases)]
    peak = max(peaks, default=1)
    for i in range(a.warmup):
        reqs = make_requests(2 * peak, seed=1000 + i, vocab=prompt_vocab(a), in_range=(a.in_len, a.in_len),
                             out_range=(WARMUP_OUT_LEN, WARMUP_OUT_LEN))
        client.run(url, Closed(peak, len(reqs)), reqs)


def describe(w) -> str:
    if isinstance(w, Closed):
        return f"closed c={w.concurrency} ({w.num_requests} requests)"
    if isinstance(w, Open):
        return f"open {w.rate:g} req/s ({w.num_requests} requests)"
    return "phased " + ",".join(f"{s:g}s@{c}" for s, c in w.phases)


class PointLog:
    """Where a point's lines begin in its server's log and decision log, and the host's
    CPU counters then: the rows read what was logged and stolen while the point ran."""

    def __init__(self, log_text, decisions_log: Path | None = None, cpus: frozenset | None = None):
        self.log_text, self.decisions_log, self.cpus = log_text, decisions_log, cpus
        self.before = log_text()
        self.decided_before = decisions_log.stat().st_size if decisions_log and decisions_log.exists() else 0
        self.cpu_before = hostload.cpu_times()


def measure(label: str, url: str, w, a, log_text, seed: int, pair: configs.Pair | None = None,
            strategy: str | None = None, decisions_log: Path | None = None, cpus: frozenset | None = None) -> dict:
    opened = PointLog(log_text, decisions_log, cpus)
    records, start, seconds = client.run(url, w, requests_for(w, a, seed))
    return point_row(label, w, a, opened, records, start, seconds, pair, strategy)


def point_row(label: str, w, a, opened: PointLog, records, start: float, seconds: float,
              pair: configs.Pair | None = None, strategy: str | None = None) -> dict:
    row = {"label": label, **w.point, **metrics.summarize(records, seconds)}
    if strategy is not None:
        row["strategy"] = strategy
    if a.json_share:
        row.update(json_share=a.json_share, **metrics.json_validity(records))
    if a.out_len_min is not None:
        row["out_len_range"] = list(out_range(a))
    if pair is not None:
        row.update(shape=pair.shape or pair.name,
                   acceptance=pair.acceptance if label != "plain" else None)
    cpu_after = hostload.cpu_times()
    row["host_steal"] = hostload.steal_share(opened.cpu_before, cpu_after)
    if opened.cpus:
        row["scheduler_cpu_steal"] = hostload.steal_share(opened.cpu_before, cpu_after, opened.cpus)
    log_after = opened.log_text()
    decisions_log = opened.decisions_log
    if decisions_log is not None and decisions_log.exists():
        with decisions_log.open("rb") as f:  # whole lines only: the server writes a line at a time
            f.seek(opened.decided_before)
            row["decisions"] = metrics.decision_counts(f.read().decode().splitlines())
    else:  # without the decision log, from the server's reason counters
        counted = metrics.decisions_between(opened.before, log_after)
        if counted:
            row["decisions"] = counted
    samples = metrics.mode_samples(log_after)
    row.update(metrics.mode_between(metrics.mode_samples(opened.before), samples))
    if isinstance(w, Closed):  # its batch size is the concurrency between wave edges
        point_log = log_after[len(opened.before):]
        row.update(metrics.steady_decode(point_log, w.concurrency))
        row.update(metrics.prefill_batches(point_log))
    if row.get("plain_share"):  # plain tokens count in the total but have no verify
        row["tokens_per_verify"] = None
    if isinstance(w, Phased):
        row["throughput_timeline"] = metrics.throughput_timeline(records, start, seconds)
        row["mode_timeline"] = metrics.mode_timeline(samples, start, seconds) if samples else []
        row["phase_summary"] = metrics.phase_summary(records, start, w.phases)
    return row


def slices_of(w: Closed, wanted: int) -> int:
    return max(1, min(wanted, w.num_requests // (MIN_SLICE_WAVES * w.concurrency)))


@dataclass
class Live:
    """One configuration's server, with the files it writes for the bench."""
    label: str
    name: str
    srv: object
    strategy: str | None
    decided: Path | None  # its decision log (--decision-log)
    table: Path | None  # its step-cost table
    cpus: frozenset | None = None  # its scheduler's CPUs, once pinned
    slot: int = 0  # its share of the pinning plan (--interleave: one per server)


def measure_interleaved(live: list[Live], w: Closed, a, seed: int, pair: configs.Pair | None = None,
                        pinner=None) -> list[dict]:
    """One closed-loop point on every live server, in slices taken in turn (the order
    rotating by one each slice), the same requests for every server within a slice:
    a host whose speed drifts over seconds slows every configuration alike. Pinned,
    the schedulers' cores rotate by one each slice too: a slower core slows every
    configuration alike. Each row sums its server's slices."""
    n = slices_of(w, a.interleave)
    part = Closed(w.concurrency, w.num_requests // n)
    # The steal on every server's core: each runs on all of them in turn.
    cpus = frozenset().union(*(x.cpus for x in live)) if pinner is not None else None
    opened = [PointLog(x.srv.log_text, x.decided, cpus) for x in live]
    records = [[] for _ in live]
    seconds, per_slice, starts = [0.0] * len(live), [[] for _ in live], [None] * len(live)
    steal, cores = [[] for _ in live], [[] for _ in live]
    for s in range(n):
        if pinner is not None:
            for k, x in enumerate(live):
                plan = pinner.pin_server(x.srv.proc.pid, live[(k + s) % len(live)].slot)
                cores[k].append(sorted(plan.scheduler_cpus))
        reqs = requests_for(part, a, seed * 1000 + s)
        for k in [(s + i) % len(live) for i in range(len(live))]:
            cpu_before = hostload.cpu_times()
            recs, start, secs = client.run(live[k].srv.url, part, reqs)
            steal[k].append(hostload.steal_share(cpu_before, hostload.cpu_times()))
            records[k] += recs
            seconds[k] += secs
            starts[k] = starts[k] or start
            per_slice[k].append(round(metrics.summarize(recs, secs)["output_tok_per_s"], 1))
    rows = []
    for k, x in enumerate(live):
        row = point_row(x.label, w, a, opened[k], records[k], starts[k], seconds[k], pair, x.strategy)
        row.update(slices=n, slice_tok_per_s=per_slice[k], slice_host_steal=steal[k])
        if pinner is not None:
            row["slice_scheduler_cpus"] = cores[k]
        rows.append(row)
    return rows


def schedulers_of(a) -> int:
    """Scheduler processes a server of the pair runs: one per tensor-parallel rank."""
    return a.tp if a.pair == "k25" else 1


class Sweep:
    """A run's output: rows to results.jsonl as they come, the goodput servers' cost
    tables after each point, and a progress line per point."""

    def __init__(self, a, out: Path, pinned: bool):
        self.a, self.out, self.pinned = a, out, pinned
        self.rows: list[dict] = []
        self.results = out / "results.jsonl"
        self.results.write_text("")

    def server(self, cfg, rnd: int, port: int, server_factory, memory: float | None = None) -> Live:
        """``memory``: the server's --mem-fraction-static, where it shares the GPU."""
        # Each server's files keep its round in the name.
        name = cfg.label if self.a.rounds == 1 else f"{cfg.label}-round{rnd}"
        # The table the policy decided with, after each point: how its prices moved.
        table = self.out / f"cost-table-{name}.json" if cfg.decides_by_costs else None
        args = [*cfg.args, "--speculative-cost-table-path", str(table)] if table else list(cfg.args)
        if memory is not None:
            args = [*without_flags(args, ["--mem-fraction-static"]), "--mem-fraction-static", str(memory)]
        if self.a.interleave and "--sleep-on-idle" not in args:
            # An idle SGLang scheduler polls at 100% of its core (thread_sampler): each server
            # waiting its turn would keep a core busy while the measured one runs host-bound.
            args.append("--sleep-on-idle")
        # Why each batch ran in its mode (--decision-log): rows count the reasons per point.
        decided = self.out / f"decisions-{name}.jsonl" if self.a.decision_log and cfg.decides_by_costs else None
        env = {**cfg.env, decisions.ENV: str(decided)} if decided else cfg.env
        srv = server_factory(name, args, env, log_dir=self.out, port=port, skip_tokenizer_init=not cfg.tokenizer)
        return Live(cfg.label, name, srv, cfg.strategy, decided, table)

    def add(self, tag: str, row: dict, w, rnd: int, x: Live) -> None:
        if self.a.rounds > 1:
            row["round"] = rnd
        if self.pinned:
            row["pinned"] = True
        self.rows.append(row)
        with self.results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if x.table is not None and x.table.exists():
            with (self.out / "cost-tables.jsonl").open("a") as f:
                f.write(json.dumps({"label": row["label"], "round": rnd, **w.point,
                                    "table": json.loads(x.table.read_text())}) + "\n")
        share = row.get("plain_share")
        print(f"[{tag}] {describe(w)}: {row['output_tok_per_s']:.1f} tok/s, "
              f"TPOT p50 {row['tpot_p50_ms']} ms, TTFT p50 {row['ttft_p50_ms']} ms"
              + (f", plain share {share:.0%}" if share is not None else "")
              + (f", {row['errors']} errors" if row["errors"] else ""), flush=True)


def ready(tag: str, x: Live, a, pinner, t0: float) -> None:
    print(f"[{tag}] ready after {time.time() - t0:.0f} s", flush=True)
    if pinner is not None:
        plan = pinner.pin_server(x.srv.proc.pid, x.slot)
        x.cpus = plan.scheduler_cpus
        print(f"[{tag}] pinned: {plan.describe()}", flush=True)
    if a.warmup:
        t1 = time.time()
        warm_up(x.srv.url, a)
        print(f"[{tag}] warmed up in {time.time() - t1:.0f} s", flush=True)


def run_in_turn(plan, loads, a, pair, sweep: Sweep, server_factory, pinner, failed: list) -> None:
    # Rounds interleave (a, b, a, b): a drift of the host over the run touches every
    # configuration alike.
    served = [(r, cfg) for r in range(1, a.rounds + 1) for cfg in plan]
    for i, (rnd, cfg) in enumerate(served, 1):
        x = sweep.server(cfg, rnd, a.port, server_factory)
        srv, name = x.srv, x.name
        tag = f"{i}/{len(served)} {name}"
        t0 = time.time()
        try:
            srv.start()
            ready(tag, x, a, pinner, t0)
            for j, w in enumerate(loads):
                sweep.add(tag, measure(cfg.label, srv.url, w, a, srv.log_text, seed=j, pair=pair,
                                       strategy=cfg.strategy, decisions_log=x.decided, cpus=x.cpus), w, rnd, x)
        except Exception as e:  # one broken configuration does not lose the others
            failed.append(name)
            print(f"[{tag}] FAILED: {e}", file=sys.stderr, flush=True)
        finally:
            srv.stop()


def run_interleaved(plan, loads, a, pair, sweep: Sweep, server_factory, pinner, failed: list) -> None:
    """Every configuration's server up at once (own port, with --pin-cpus own core),
    each point measured in slices taken in turn (measure_interleaved)."""
    for rnd in range(1, a.rounds + 1):
        servers = [sweep.server(cfg, rnd, a.port + 10 * k, server_factory, memory=memory_fraction(k, len(plan)))
                   for k, cfg in enumerate(plan)]
        live = []
        try:
            # One after another: a server sizes its KV pool from the memory free while it
            # starts, and starts that overlap count each other's allocations as free.
            for k, x in enumerate(servers):
                t0 = time.time()
                try:
                    x.srv.start()
                    x.slot = k
                    ready(f"round {rnd} {x.name}", x, a, pinner, t0)
                    live.append(x)
                except Exception as e:
                    failed.append(x.name)
                    print(f"[round {rnd} {x.name}] FAILED: {e}", file=sys.stderr, flush=True)
            for j, w in enumerate(loads):
                if not live:
                    break
                for x, row in zip(live, measure_interleaved(live, w, a, seed=j, pair=pair, pinner=pinner)):
                    sweep.add(f"round {rnd} {x.name}", row, w, rnd, x)
        except Exception as e:  # a point that broke loses this round's later points, not the run
            failed.extend(x.name for x in live)
            print(f"[round {rnd}] FAILED: {e}", file=sys.stderr, flush=True)
        finally:
            for x in servers:
                x.srv.stop()


def main(argv=None, server_factory=Server, pinner_factory=pinning.Pinner) -> int:
    a = parse_args(argv)
    pair = pair_of(a)
    plan = configs.server_configs(pair, [x for x in a.configs.split(",") if x],
                                  threshold=a.threshold, steps=a.steps, max_bs=a.max_bs,
                                  keep_warm=tuple(x for x in a.keep_warm.split(",") if x),
                                  grammar=a.json_share > 0)
    loads = workloads(a)
    out = Path(a.out)
    rounds = f" x {a.rounds} rounds" if a.rounds > 1 else ""
    rounds += (f", servers up at once (each with --sleep-on-idle), points in up to {a.interleave} slices taken "
               "in turn" if a.interleave else "")
    print(f"pair {pair.name}: {len(plan)} configurations x {len(loads)} load points{rounds} -> {out}", flush=True)
    for cfg in plan:
        print(f"  {cfg.label}: {cfg.command()}")
    for w in loads:
        print(f"  load: {describe(w)}")
    if a.dry_run:
        return 0
    pinner = None
    if a.pin_cpus:
        try:
            pinner = pinner_factory(slots=len(plan) if a.interleave else 1)
            pinner.check(schedulers_of(a))
        except pinning.PinningError as e:
            print(e, file=sys.stderr)
            return 2
    out.mkdir(parents=True, exist_ok=True)
    sweep = Sweep(a, out, pinner is not None)
    failed: list[str] = []
    run = run_interleaved if a.interleave else run_in_turn
    run(plan, loads, a, pair, sweep, server_factory, pinner, failed)
    rows = sweep.rows
    for path in report.write(rows, out):
        print(f"wrote {path}")
    print((out / "report.md").read_text())
    if failed:
        print(f"failed configurations: {', '.join(failed)} (server logs in {out})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
