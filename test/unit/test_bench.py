"""The benchmark suite without a GPU: workloads, the streaming client against a fake
SGLang /generate endpoint, summaries, mode counters from a server log, the
orchestrator end to end (fake servers), and the report from stored rows."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from aiohttp import web

from sglang_adaptive import decisions
from sglang_adaptive.bench import __main__ as bench, client, configs, metrics, pinning, report
from sglang_adaptive.bench.workloads import Closed, Open, Phased, parse_phases


# -- workloads ----------------------------------------------------------------

def test_open_loop_arrivals_are_poisson_and_reproducible():
    w = Open(rate=50.0, num_requests=4000, seed=3)
    times = w.arrival_times()
    assert times == Open(rate=50.0, num_requests=4000, seed=3).arrival_times()
    assert times[0] == 0.0 and all(b >= a for a, b in zip(times, times[1:]))
    assert times[-1] / (len(times) - 1) == pytest.approx(1 / 50.0, rel=0.06)


def test_phases():
    w = Phased(parse_phases("10:2, 5:64,10:2"))
    assert w.phases == ((10.0, 2), (5.0, 64), (10.0, 2))
    assert [w.phase_at(t) for t in (0, 9.9, 10, 14.9, 15, 24.9, 25)] == [0, 0, 1, 1, 2, 2, None]
    for bad in ("10", "0:4", "5:-1", ""):
        with pytest.raises(ValueError):
            parse_phases(bad)


# -- summaries and the mode log ------------------------------------------------

def test_summary_of_records():
    recs = [client.Record(start=0.0, first=0.1, end=1.1, output_tokens=101, verify_ct=40),
            client.Record(start=0.0, first=0.3, end=2.3, output_tokens=101, verify_ct=60),
            client.Record(start=0.0, error="HTTP 500")]
    s = metrics.summarize(recs, seconds=2.0)
    assert s["requests"] == 3 and s["errors"] == 1
    assert s["output_tok_per_s"] == 101.0
    assert s["ttft_p50_ms"] == pytest.approx(200.0) and s["ttft_p99_ms"] == pytest.approx(298.0)
    assert s["tpot_p50_ms"] == pytest.approx(15.0)  # (10 ms + 20 ms) / 2
    assert s["tokens_per_verify"] == pytest.approx(2.02)
    assert s["latency_max_s"] == pytest.approx(2.3) and s["in_flight_s"] == pytest.approx(2.3)


def test_in_flight_seconds_is_the_union_of_the_request_spans():
    assert metrics.in_flight_seconds([]) == 0.0
    # Two overlapping requests, an idle second, one more: 3 + 1 seconds in flight.
    assert metrics.in_flight_seconds([(0, 2), (1, 3), (4, 5)]) == pytest.approx(4.0)
    assert metrics.in_flight_seconds([(4, 5), (0, 3), (1, 2)]) == pytest.approx(4.0)


def _stamp(t):
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def mode_log(t0, points):
    return "".join(
        f"[{_stamp(t0 + dt)}] AdaptiveEAGLE decode batches: {p + s} (plain {p}, 0.0%; "
        f"speculative {s}), switches: {w}\n" for dt, p, s, w in points)


def test_plain_share_and_timeline_from_the_log():
    t0 = float(int(time.time()))
    log = mode_log(t0, [(0, 0, 10, 0), (3, 0, 20, 0), (5, 30, 20, 1), (8, 60, 20, 1), (12, 60, 40, 2)])
    samples = metrics.mode_samples(log + "[x] unrelated line\n")
    assert len(samples) == 5
    # Servers with several GPUs tag the prefix with the rank.
    tp_log = log.replace("] AdaptiveEAGLE", " TP0] AdaptiveEAGLE")
    assert metrics.mode_samples(tp_log) == samples
    w = metrics.mode_between(samples[:2], samples[:4])
    assert w == {"plain_share": 1.0, "switches": 1, "decode_batches": 60}
    assert metrics.mode_between([], samples[:1]) == {"plain_share": 0.0, "switches": 0, "decode_batches": 10}
    tl = metrics.mode_timeline(samples, t0, 12, bin_s=4)
    assert tl == [[0.0, 0.0], [4.0, 1.0], [8.0, 0.0]]
    assert metrics.mode_between([], []) == {}


def test_a_point_counts_its_batches_by_reason_from_the_servers_counters(monkeypatch):
    """Without the decision log a row still says why the goodput server ran its batches:
    the difference of its cumulative reasons lines (as ``decision_counts`` names them)."""
    from sglang_adaptive.controller import format_reasons

    def line(counts):
        return f"[{_stamp(t0)}] AdaptiveEAGLE decode batches by reason: {format_reasons(counts)}\n"

    t0 = float(int(time.time()))
    before = line({(True, "explore"): 7, (True, "goodput"): 100})
    after = line({(True, "explore"): 7, (True, "goodput"): 150, (False, "forced"): 2, (True, "probe"): 1})
    assert metrics.decisions_between(before, before + after) == {"plain forced": 2, "spec goodput": 50,
                                                                 "spec probe": 1}
    assert metrics.decisions_between("", before.replace("] Adaptive", " TP0] Adaptive")) == {
        "spec explore": 7, "spec goodput": 100}
    assert metrics.decisions_between("", "[x] unrelated\n") == {}
    logs = iter([before, before + after])
    monkeypatch.setattr(bench.client, "run", lambda url, w, reqs: ([], t0 + 0.5, 17.0))
    monkeypatch.setattr(bench.metrics, "summarize", lambda records, seconds: {"output_tok_per_s": 1.0})
    a = bench.parse_args(["--closed", "1", "--rates", "", "--phases", ""])
    row = bench.measure("adaptive-goodput", "u", bench.workloads(a)[0], a, lambda: next(logs), 0)
    assert row["decisions"] == {"plain forced": 2, "spec goodput": 50, "spec probe": 1}


def test_a_point_counts_the_batches_logged_while_it_ran_not_those_of_its_first_second(monkeypatch):
    """The warm-up's last batches (plain: exploring) and the point's first ones (all
    speculative) share a one-second log stamp; the point ran no plain batch."""
    t0 = float(int(time.time()))
    warm = mode_log(t0, [(0, 0, 10, 0), (0, 40, 10, 1), (0, 47, 20, 2)])
    point = mode_log(t0, [(0, 47, 30, 2), (10, 47, 1200, 2), (17, 47, 2470, 2)])
    logs = iter([warm, warm + point])
    monkeypatch.setattr(bench.client, "run", lambda url, w, reqs: ([], t0 + 0.5, 17.0))
    monkeypatch.setattr(bench.metrics, "summarize", lambda records, seconds: {"output_tok_per_s": 1.0})
    a = bench.parse_args(["--closed", "1", "--rates", "", "--phases", ""])
    row = bench.measure("adaptive-goodput", "u", bench.workloads(a)[0], a, lambda: next(logs), 0)
    assert (row["plain_share"], row["switches"], row["decode_batches"]) == (0.0, 0, 2450)


def decode_line(bs, tput, prefix="[2026-12-01 19:45:21]", accept=None):
    # SGLang writes accept len / rate where a batch of the window speculated.
    spec = "" if accept is None else f"accept len: {accept:.2f}, accept rate: 0.60, "
    return (f"{prefix} Decode batch, #running-req: {bs}, #token: 16512, token usage: 0.03, {spec}cuda graph: True, "
            f"gen throughput (token/s): {tput}, #queue-req: 0\n")


def counters_line(plain, spec, prefix="[2026-12-01 19:45:21]"):
    return (f"{prefix} AdaptiveEAGLE decode batches: {plain + spec} (plain {plain}, 50.0%; "
            f"speculative {spec}), switches: 3\n")


def test_steady_decode_counts_whole_plain_windows_at_the_batch_size():
    log = "".join([
        decode_line(30, 1.0), counters_line(10, 0),
        decode_line(32, 2.0), counters_line(20, 0),   # the window before ended at 30: ramping
        decode_line(32, 100.0), counters_line(30, 0),  # steady
        decode_line(32, 300.0), counters_line(40, 0),  # steady
        decode_line(32, 9.0), counters_line(49, 1),    # a speculative batch around it
        decode_line(32, 9.0), counters_line(59, 1),    # the one before it held it
        decode_line(32, 200.0), counters_line(69, 1),  # steady again
        decode_line(64, 7.0), counters_line(79, 1),
    ])
    assert metrics.steady_decode(log, 32) == {"steady_decode_tok_per_s": 200.0, "steady_windows": 3}
    assert metrics.steady_decode(log, 64) == {}, "its window before ran another size"
    # Several ranks: SGLang logs decode lines on rank 0 only, each rank its counters.
    tp = log.replace("] Decode", " TP0] Decode").replace("] AdaptiveEAGLE", " TP0] AdaptiveEAGLE")
    assert metrics.steady_decode(tp, 32)["steady_windows"] == 3
    # A static server logs no counters: every whole window counts.
    static = "".join(decode_line(32, t) for t in (5.0, 6.0, 7.0, 8.0))
    assert metrics.steady_decode(static, 32) == {"steady_decode_tok_per_s": 7.0, "steady_windows": 3}


def test_steady_decode_reads_speculative_windows_apart_from_plain_ones():
    # Adaptive: a window is speculative when the plain count did not move around it and
    # the window before it; its speed goes under its own key, never into the plain one.
    log = "".join([
        counters_line(0, 0), decode_line(32, 1.0), counters_line(10, 0),
        decode_line(32, 100.0), counters_line(20, 0),             # plain
        decode_line(32, 50.0, accept=2.8), counters_line(20, 10),  # the window before was plain
        decode_line(32, 400.0, accept=2.8), counters_line(20, 20),  # speculative
        decode_line(32, 600.0, accept=2.8), counters_line(20, 30),  # speculative
        decode_line(32, 70.0, accept=2.8), counters_line(25, 35),  # mixed
        decode_line(32, 500.0, accept=2.8), counters_line(25, 45),  # the window before was mixed
    ])
    assert metrics.steady_decode(log, 32) == {"steady_decode_tok_per_s": 100.0, "steady_windows": 1,
                                              "steady_spec_decode_tok_per_s": 500.0, "steady_spec_windows": 2}
    # Static EAGLE-3 logs no counters: its windows are speculative by their accept len.
    eagle3 = "".join(decode_line(32, t, accept=2.8) for t in (5.0, 6.0, 7.0, 8.0))
    assert metrics.steady_decode(eagle3, 32) == {"steady_spec_decode_tok_per_s": 7.0, "steady_spec_windows": 3}
    # A static server's window is counted only where the one before it ran the same way.
    mixed = "".join([decode_line(32, 5.0), decode_line(32, 6.0, accept=2.8), decode_line(32, 7.0),
                     decode_line(32, 8.0)])
    assert metrics.steady_decode(mixed, 32) == {"steady_decode_tok_per_s": 8.0, "steady_windows": 1}


def prefill_line(new_seq, running, prefix="[2026-12-06 06:56:37]", iters=""):
    return (f"{prefix} Prefill batch{iters}, #new-seq: {new_seq}, #new-token: {256 * new_seq}, #cached-token: 0, "
            f"token usage: 0.01, #running-req: {running}, #queue-req: 0, #pending-token: 0, cuda graph: False, "
            f"input throughput (token/s): 55278.14\n")


def test_prefill_batches_counts_the_prefill_lines():
    # A wave of 4 in one batch, then one split 1 + 3, between decode lines.
    log = "".join([prefill_line(4, 0), decode_line(4, 9.0), prefill_line(1, 0), prefill_line(3, 1),
                   decode_line(4, 9.0)])
    assert metrics.prefill_batches(log) == {"prefill_batches": 3}
    # With forward iterations logged, and a TP rank's prefix.
    assert metrics.prefill_batches(prefill_line(2, 0, iters=" [812]")) == {"prefill_batches": 1}
    assert metrics.prefill_batches(prefill_line(2, 0, prefix="[2026-12-06 06:56:37 TP0]")) == {"prefill_batches": 1}
    assert metrics.prefill_batches(decode_line(4, 9.0)) == {}


def test_a_closed_point_reads_its_own_log_lines(monkeypatch):
    before = "".join(decode_line(32, t) for t in (1.0, 1.0, 1.0)) + prefill_line(32, 0) * 3
    point = prefill_line(1, 0) + "".join(decode_line(32, t) for t in (50.0, 60.0, 70.0)) + prefill_line(31, 1)
    logs = iter([before, before + point])
    monkeypatch.setattr(bench.client, "run", lambda url, w, reqs: ([], 0.0, 1.0))
    monkeypatch.setattr(bench.metrics, "summarize", lambda records, seconds: {"output_tok_per_s": 1.0})
    a = bench.parse_args(["--closed", "32", "--rates", "", "--phases", ""])
    row = bench.measure("plain", "u", bench.workloads(a)[0], a, lambda: next(logs), 0)
    assert (row["steady_decode_tok_per_s"], row["steady_windows"]) == (65.0, 2)
    assert row["prefill_batches"] == 2


# -- a fake SGLang /generate ------------------------------------------------------

class FakeSGLang:
    """Streams ``max_new_tokens`` token ids, one chunk per decode step of ``step_s``;
    every third request is 'speculative' (2 tokens per verify)."""

    def __init__(self, step_s=0.002):
        self.step_s, self.n, self.peak, self.live = step_s, 0, 0, 0
        self.log = []
        self.out_lens = []  # max_new_tokens of every request, in arrival order
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        self.runner = web.AppRunner(app)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        self.ready.wait(10)

    def _serve(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    async def generate(self, request):
        body = await request.json()
        assert body["stream"] is True and body["input_ids"]
        self.n += 1
        self.live += 1
        self.peak = max(self.peak, self.live)
        n_out = body["sampling_params"]["max_new_tokens"]
        self.out_lens.append(n_out)
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(n_out):
            await asyncio.sleep(self.step_s)
            meta = {"completion_tokens": i + 1, "spec_verify_ct": (i + 2) // 2 if self.n % 3 == 0 else 0}
            await resp.write(b"data: " + json.dumps({"output_ids": [7], "meta_info": meta}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        self.live -= 1
        return resp


@pytest.fixture(scope="module")
def fake():
    return FakeSGLang()


def reqs(n, out=5):
    return [{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": out}} for _ in range(n)]


def test_closed_loop_keeps_concurrency_and_reads_the_stream(fake):
    peak_before = fake.peak = 0
    records, start, seconds = client.run(fake.url, Closed(4, 12), reqs(12))
    assert len(records) == 12 and all(r.error is None for r in records)
    assert all(r.output_tokens == 5 and r.start <= r.first <= r.end for r in records)
    assert fake.peak == 4 and peak_before == 0
    assert start <= records[0].start and seconds > 0


def test_open_loop_sends_on_schedule(fake):
    w = Open(rate=200.0, num_requests=20, seed=1)
    records, start, seconds = client.run(fake.url, w, reqs(20))
    sent = sorted(r.start - start for r in records)
    assert all(abs(s - a) < 0.05 for s, a in zip(sent, w.arrival_times()))


def test_throughput_timeline_spreads_tokens_over_each_stream():
    t0 = 1000.0
    records = [client.Record(start=t0, first=t0 + 0.5, end=t0 + 2.5, output_tokens=200),  # 100 tok/s
               client.Record(start=t0, first=None, end=t0 + 1.2, output_tokens=7),        # one chunk
               client.Record(start=t0, end=t0 + 1.0, error="HTTP 500")]
    tl = metrics.throughput_timeline(records, t0, 3.0)
    assert tl == [[0.0, 50.0], [1.0, 107.0], [2.0, 50.0], [3.0, 0.0]]
    assert sum(v for _, v in tl) == 207


def test_phase_summary_counts_each_request_in_the_phase_it_was_sent_in():
    t0 = 1000.0
    # Phase 1 (0-2 s): two 100 tok/s streams; phase 2 (2-4 s): one 50 tok/s stream sent
    # at 2.5 s, plus the second phase-1 request, which streams into phase 2. That one was
    # sent as phase 1 ended by the sender's clock, which starts after ``t0``: its wall-clock
    # send time (2.01 s) lies in phase 2, but it belongs to the phase it was sent in.
    records = [client.Record(start=t0, first=t0, end=t0 + 1.0, output_tokens=101, phase=0),
               client.Record(start=t0 + 2.01, first=t0 + 1.0, end=t0 + 3.0, output_tokens=201, phase=0),
               client.Record(start=t0 + 2.5, first=t0 + 2.5, end=t0 + 3.5, output_tokens=51, phase=1),
               client.Record(start=t0 + 0.5, end=t0 + 0.6, error="HTTP 500", phase=0)]
    one, two = metrics.phase_summary(records, t0, ((2.0, 1), (2.0, 8)))
    assert (one["requests"], one["tpot_p50_ms"], one["per_request_tok_per_s"]) == (2, 10.0, 100.0)
    assert (two["requests"], two["tpot_p50_ms"], two["per_request_tok_per_s"]) == (1, 20.0, 50.0)
    # Streamed tokens per phase: 101 + 100.5 in the first, 100.5 + 51 in the second.
    assert one["output_tok_per_s"] == pytest.approx(100.75, abs=0.1)
    assert two["output_tok_per_s"] == pytest.approx(75.75, abs=0.1)
    assert (one["seconds"], one["concurrency"], two["concurrency"]) == (2.0, 1, 8)


def test_phased_load_follows_its_phases(fake):
    fake.peak = 0
    w = Phased(((0.3, 1), (0.3, 6), (0.2, 1)))
    records, start, seconds = client.run(fake.url, w, lambda i: reqs(1, out=3)[0])
    assert fake.peak >= 6 and seconds >= 0.8
    early = [r for r in records if r.start - start < 0.25]
    assert 1 <= len(early) <= 20  # one at a time in the first phase
    # Every request carries the phase it was sent in, in sending order.
    phases = [r.phase for r in sorted(records, key=lambda r: r.start)]
    assert set(phases) == {0, 1, 2} and phases == sorted(phases)


def test_connection_errors_are_recorded():
    records, _, _ = client.run("http://127.0.0.1:9", Closed(2, 2), reqs(2))
    assert all(r.error for r in records)


# -- the orchestrator, end to end with fake servers --------------------------------

def test_orchestrator_runs_every_config_and_load(fake, tmp_path, capsys, monkeypatch):
    started, ports = [], []
    monkeypatch.setenv("ADAPTIVE_GPU_PORT_BASE", "31000")  # a second sweep beside the first

    class FakeServer:
        def __init__(self, label, args, env, log_dir, port, skip_tokenizer_init):
            assert skip_tokenizer_init, "no structured output asked: token ids only"
            self.label, self.args, self.env = label, args, env
            ports.append(port)
            self.url = fake.url
            self.t0 = time.time()

        def start(self):
            if self.label == "upstream-adaptive":
                raise RuntimeError("server exited")
            started.append(self.label)

        def stop(self):
            pass

        def log_text(self):
            if self.label != "adaptive-threshold":
                return ""
            # The log grows between reads (the bench reads it before and after a point),
            # 5 plain batches to 1 speculative.
            self.reads = getattr(self, "reads", 0) + 1
            return mode_log(int(self.t0) - 2, [(k, 5 * k, k, k // 10) for k in range(6 * self.reads)])

    before = len(fake.out_lens)
    rc = bench.main(["--pair", "dummy", "--closed", "1,4", "--rates", "50", "--open-seconds", "0.2",
                     "--phases", "0.3:1,0.3:6", "--out-len", "4", "--in-len", "3",
                     "--out", str(tmp_path)], server_factory=FakeServer)
    # Each started server first gets an unmeasured warm-up at the peak load (6, the
    # phased load's): 12 requests of bench.WARMUP_OUT_LEN tokens, before any measured one.
    sent = fake.out_lens[before:]
    warm = [i for i, n in enumerate(sent) if n == bench.WARMUP_OUT_LEN]
    assert len(warm) == 12 * 4 and sent[:12] == [bench.WARMUP_OUT_LEN] * 12
    assert rc == 1  # one configuration failed; the others are reported
    assert started == ["plain", "eagle3", "adaptive-threshold", "adaptive-goodput"]
    assert set(ports) == {31000}
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["label"], r["workload"]) for r in rows] == [
        (label, kind) for label in started for kind in ("closed", "closed", "open", "phased")]
    adaptive = [r for r in rows if r["label"] == "adaptive-threshold"]
    assert all(r["plain_share"] == pytest.approx(5 / 6, abs=1e-3) for r in adaptive)
    # Plain tokens have no verify: a per-request ratio would overstate acceptance.
    assert all(r["tokens_per_verify"] is None for r in adaptive)
    assert all(r["tokens_per_verify"] is not None for r in rows if r["label"] == "eagle3")
    assert all("plain_share" not in r for r in rows if r["label"] == "plain")
    phased = adaptive[-1]
    assert phased["throughput_timeline"] and phased["mode_timeline"]
    assert [(p["seconds"], p["concurrency"]) for p in phased["phase_summary"]] == [(0.3, 1), (0.3, 6)]
    assert sum(p["requests"] for p in phased["phase_summary"]) == phased["requests"] - phased["errors"]
    assert (tmp_path / "report.md").read_text().count("###") >= 3
    assert (tmp_path / "mode_over_time.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr()
    assert "[3/5 upstream-adaptive] FAILED: server exited" in out.err
    assert "[4/5 adaptive-threshold] closed c=4" in out.out


def test_dry_run_prints_the_plan(capsys):
    assert bench.main(["--dry-run", "--configs", "plain,adaptive-threshold", "--threshold", "8"]) == 0
    text = capsys.readouterr().out
    assert "--speculative-disable-batch-threshold 8" in text and "SGLANG_SIMULATE_ACC_LEN=2.5" in text
    assert "load: phased 15s@2,15s@96,15s@2" in text
    with pytest.raises(ValueError, match="unknown configuration"):
        bench.main(["--dry-run", "--configs", "plain,nope"])


def test_every_configuration_shares_the_common_flags():
    plan = configs.server_configs(configs.tiny_pair(), threshold=4)
    base = configs.common_args(configs.tiny_pair(), 128)
    assert [c.label for c in plan] == list(configs.LABELS)
    assert all(c.args[:len(base)] == base for c in plan)
    assert plan[0].env == {} and "--load-format" not in plan[0].args  # real weights


def test_k25_pair_serves_the_users_flags_at_tensor_parallel():
    pair = configs.k25_pair(acc_len=2.5, tp=2)
    plain, eagle3 = configs.server_configs(pair, ("plain", "eagle3"), max_bs=128)
    args = plain.args
    # The pair's attention backend replaces the common triton one: one backend flag.
    assert args.count("--attention-backend") == 1
    assert args[args.index("--attention-backend") + 1] == "flashinfer"
    assert args[args.index("--tp") + 1] == "2"
    assert "--disable-custom-all-reduce" in args and "--enable-flashinfer-allreduce-fusion" in args
    assert plain.env == {} and eagle3.env == {"SGLANG_SIMULATE_ACC_LEN": "2.5"}
    assert (pair.shape, pair.acceptance) == ("k25-tp2", 2.5)


def test_k25_deep_target_differs_from_the_shipped_one_in_depth_only():
    pair = configs.k25_pair(tp=2, layers=16)
    assert (pair.name, pair.shape) == ("k25-l16-tp2", "k25-l16-tp2")
    assert bench.pair_of(bench.parse_args(["--pair", "k25", "--k25-layers", "16"])).target == pair.target
    deep = json.loads((pair.target / "config.json").read_text())
    shallow = json.loads((configs.k25_pair().target / "config.json").read_text())
    assert (deep.pop("num_hidden_layers"), shallow.pop("num_hidden_layers")) == (16, 4)
    assert deep == shallow and pair.draft == configs.k25_pair().draft
    with pytest.raises(ValueError, match="ships with \\[4, 16\\] layers, not 8"):
        configs.k25_pair(layers=8)


def test_without_flags_drops_each_flag_with_its_value():
    from sglang_adaptive.testing import without_flags

    assert without_flags(["--a", "1", "--b", "2", "--c", "3"], ["--b"]) == ["--a", "1", "--c", "3"]
    assert without_flags(["--a", "1"], ["--x"]) == ["--a", "1"]


def test_rows_carry_shape_and_acceptance(monkeypatch):
    monkeypatch.setattr(bench.client, "run", lambda url, w, reqs: ([], 0.0, 1.0))
    monkeypatch.setattr(bench.metrics, "summarize", lambda records, seconds: {"output_tok_per_s": 1.0})
    a = bench.parse_args(["--pair", "k25"])
    pair = bench.pair_of(a)
    w = bench.workloads(bench.parse_args(["--closed", "1", "--rates", "", "--phases", ""]))[0]
    spec = bench.measure("eagle3", "u", w, a, lambda: "", 0, pair=pair)
    plain = bench.measure("plain", "u", w, a, lambda: "", 0, pair=pair)
    assert (spec["shape"], spec["acceptance"]) == ("k25-tp2", 2.5)
    assert (plain["shape"], plain["acceptance"]) == ("k25-tp2", None)


def test_output_lengths_spread_over_the_asked_range_and_rows_say_so(monkeypatch):
    a = bench.parse_args(["--closed", "8", "--rates", "", "--phases", "", "--out-len", "128",
                          "--out-len-min", "32"])
    w = bench.workloads(a)[0]
    lengths = [r["sampling_params"]["max_new_tokens"] for r in bench.requests_for(w, a, seed=0)]
    assert min(lengths) >= 32 and max(lengths) <= 128 and len(set(lengths)) > len(lengths) // 2
    monkeypatch.setattr(bench.client, "run", lambda url, w, reqs: ([], 0.0, 1.0))
    monkeypatch.setattr(bench.metrics, "summarize", lambda records, seconds: {"output_tok_per_s": 1.0})
    assert bench.measure("plain", "u", w, a, lambda: "", 0)["out_len_range"] == [32, 128]
    fixed = bench.parse_args(["--closed", "8", "--rates", "", "--phases", "", "--out-len", "128"])
    lengths = {r["sampling_params"]["max_new_tokens"] for r in bench.requests_for(w, fixed, seed=0)}
    assert lengths == {128}
    assert "out_len_range" not in bench.measure("plain", "u", w, fixed, lambda: "", 0)


@pytest.mark.parametrize("value", ["0", "129"])
def test_an_output_length_range_outside_one_to_out_len_is_refused(value, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--out-len", "128", "--out-len-min", value])
    assert f"--out-len-min must be within [1, --out-len=128], got {value}" in capsys.readouterr().err


# -- the report from stored rows ----------------------------------------------------

def test_report_from_stored_rows(tmp_path):
    rows = [
        {"label": "plain", "workload": "closed", "concurrency": 1, "output_tok_per_s": 100, "tpot_p50_ms": 10.0},
        {"label": "eagle3", "workload": "closed", "concurrency": 1, "output_tok_per_s": 180, "tpot_p50_ms": 5.0},
        {"label": "adaptive-threshold", "workload": "closed", "concurrency": 1, "output_tok_per_s": 171,
         "tpot_p50_ms": 5.5, "plain_share": 0.0},
        {"label": "plain", "workload": "open", "rate": 4.0, "output_tok_per_s": 90, "tpot_p50_ms": 11.0},
        {"label": "adaptive-threshold", "workload": "phased", "phases": [[1, 2], [1, 8]],
         "output_tok_per_s": 150, "tpot_p50_ms": 6, "tpot_p99_ms": 9, "ttft_p50_ms": 20, "ttft_p99_ms": 40,
         "plain_share": 0.25, "switches": 3, "throughput_timeline": [[0, 10], [1, 20]],
         "mode_timeline": [[0, 0.0], [1, 0.5]]},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    loaded = report.load_rows(path)
    text = report.markdown(loaded)
    assert "| 1 | 100.0 | 180.0 | 171.0 | 0.95 (eagle3) |" in text       # tok/s ratio
    assert "| 1 | 10.00 | 5.00 | 5.50 | 0.91 (eagle3) |" in text        # TPOT: best / this
    assert "| 4 | 90.0 |" in text
    assert "| adaptive-threshold | 150.0 | 6 / 9 | 20 / 40 | 25% | 3 |" in text
    written = report.write(loaded, tmp_path / "out")
    names = {p.name for p in written}
    assert {"report.md", "throughput.png", "tpot.png", "mode_over_time.png"} <= names


def test_report_judges_a_phased_load_by_issue_13s_ratios():
    def row(label, total, low, high, low2):
        return {"label": label, "workload": "phased", "phases": [[15, 2], [15, 96], [15, 2]],
                "output_tok_per_s": total, "phase_summary": [
                    {"seconds": 15, "concurrency": c, "requests": 9, "tpot_p50_ms": 1e3 / v,
                     "per_request_tok_per_s": v, "output_tok_per_s": v * c}
                    for c, v in ((2, low), (96, high), (2, low2))]}

    text = report.markdown([row("plain", 1000, 100, 50, 100), row("eagle3", 900, 200, 40, 200),
                            row("adaptive-goodput", 990, 196, 50, 202)])
    assert "| 15 s at 2 | 15 s at 96 | 15 s at 2 |" in text
    assert "| eagle3 | 400 / 200 | 3840 / 40 | 400 / 200 |" in text
    # The high phase is not a low phase: 50 / 40 would read 1.250.
    assert ("adaptive-goodput: total ÷ no-spec 0.990; low phases per request ÷ static EAGLE-3 "
            "0.980, 1.010") in text


def test_report_reads_loadgen_rows_as_closed_loop():
    from pathlib import Path

    old = Path(__file__).resolve().parents[2] / "benchmark/results/2026-11-29-h200-publish-fix/compare.jsonl"
    rows = report.load_rows(old)
    assert {r["workload"] for r in rows} == {"closed"}
    table = report.ratio_table(rows)
    assert "| 128 | 10732.9 | 5965.4 | 3036.9 | 10633.4 | 0.28 (plain) | 0.99 (plain) |" in table


def test_keep_warm_strategies_serve_each_switching_configuration_once_each():
    plan = configs.server_configs(configs.dummy_pair(), ("plain", "adaptive-threshold"), threshold=0,
                                  keep_warm=("none", "kv"))
    assert [(c.label, c.strategy) for c in plan] == [
        ("plain", None), ("adaptive-threshold-none", "none"), ("adaptive-threshold-kv", "kv")]
    for c in plan[1:]:
        assert c.args[-2:] == ["--speculative-draft-keep-warm", c.strategy]
        assert c.args[c.args.index("--speculative-disable-batch-threshold") + 1] == "0"


# -- structured-output mix (issue 15) -------------------------------------------------


def test_a_json_share_constrains_every_nth_request_and_lets_it_stop():
    from sglang_adaptive.bench.workloads import JSON_SCHEMA, with_json_schema

    base = reqs(20)
    for r in base:
        r["sampling_params"]["ignore_eos"] = True
    mixed = with_json_schema(base, 0.1)
    constrained = [i for i, r in enumerate(mixed) if "json_schema" in r["sampling_params"]]
    assert constrained == [0, 10]
    assert json.loads(mixed[10]["sampling_params"]["json_schema"]) == JSON_SCHEMA
    assert mixed[10]["sampling_params"]["ignore_eos"] is False and mixed[1]["sampling_params"]["ignore_eos"]
    assert "json_schema" not in base[0]["sampling_params"], "the input requests stay as they were"
    assert with_json_schema(base, 0.0) is base


@pytest.mark.parametrize("text, ok", [
    ('{"ok":true,"n":7,"tags":["alpha","beta","gamma","alpha"]}', True),
    ('{"ok":true,"n":7,"tags":["alpha","beta","gamma"]}', False),  # minItems 4
    ('{"ok":1,"n":7,"tags":["alpha","beta","gamma","beta"]}', False),
    ('{"ok":true,"n":true,"tags":["alpha","beta","gamma","beta"]}', False),
    ('{"ok":true,"n":1000,"tags":["alpha","beta","gamma","beta"]}', False),
    ('{"ok":true,"n":7,"tags":["alpha","beta","gamma","delta"]}', False),
    ('{"ok":true,"n":7,"tags":["alpha","beta","gamma","beta"],"x":1}', False),
    ('{"ok":true,"n":7,"tags":["alpha","beta","gamma","beta"]', False),
])
def test_json_outputs_are_checked_against_the_schema(text, ok):
    from sglang_adaptive.bench.client import Record

    assert metrics.json_validity([Record(0.0, constrained=True, text=text),
                                  Record(0.0, text="free text")]) == {"json_requests": 1, "json_valid": int(ok)}


def test_structured_output_serves_xgrammar_with_the_tokenizer_and_plain_grammar_on():
    plan = configs.server_configs(configs.tiny_pair(), ("plain", "adaptive-threshold"), threshold=8,
                                  keep_warm=("kv",), grammar=True)
    for c in plan:
        assert c.tokenizer and c.args.count("--grammar-backend") == 1
        assert c.args[c.args.index("--grammar-backend") + 1] == "xgrammar"
    # Plain batches take constrained requests by default: no environment turns it on.
    assert plan[0].env == {} and plan[1].env == configs.tiny_pair().spec_env
    with pytest.raises(SystemExit):
        bench.parse_args(["--json-share", "0.1"])  # the dummy pair has no tokenizer
    assert bench.parse_args(["--pair", "tiny", "--json-share", "0.1"]).json_share == 0.1


def test_each_configuration_runs_the_policy_its_label_names(parse):
    """With this package installed EAGLE-3 switches by default: the static reference
    must ask for upstream's worker, or every comparison would be goodput against goodput."""
    from conftest import TARGET

    from sglang_adaptive.args import get_config

    expected = {"eagle3": "off", "adaptive-threshold": "threshold",
                "adaptive-goodput": "goodput", "adaptive-never-plain": "threshold",
                "adaptive-worker-only": "threshold", "adaptive-backend-only": "threshold",
                "adaptive-bare": "threshold"}
    pair = configs.dummy_pair(models=TARGET.parent)  # the repo's, also for a mutant's copy
    for server in configs.server_configs(pair, labels=tuple(expected)):
        argv = [*server.args, "--device", "cpu"]
        argv[argv.index("--attention-backend") + 1] = "torch_native"
        assert get_config(parse(argv)).policy == expected[server.label], server.label
    diag = {s.label: s.env.get("SGLANG_ADAPTIVE_DIAG") for s in configs.server_configs(pair, labels=tuple(expected))}
    assert diag == {**dict.fromkeys(expected), "adaptive-worker-only": "worker-only",
                    "adaptive-backend-only": "backend-only", "adaptive-bare": "bare"}


def test_rounds_serve_the_configurations_in_turn_on_fresh_servers(fake, tmp_path, capsys):
    started = []

    class FakeServer:
        def __init__(self, label, args, env, log_dir, port, skip_tokenizer_init):
            self.label, self.url = label, fake.url
            flag = "--speculative-cost-table-path"
            self.table = args[args.index(flag) + 1] if flag in args else None
            self.decisions = env.get(decisions.ENV)

        def start(self):
            started.append(self.label)
            if self.table:  # as the server writes it at its syncs
                Path(self.table).write_text(json.dumps({"seconds_per_step": {"plain": {"1": 0.002}},
                                                        "server": self.label}))

        def stop(self):
            pass

        def log_text(self):
            if self.decisions:  # the batches since the last read (the bench reads before and after a point)
                with open(self.decisions, "a") as f:
                    for ran, decided, why in [(True, True, "goodput")] * 2 + [(False, False, "refresh"),
                                                                              (True, False, "goodput")]:
                        f.write(json.dumps({"speculative": ran, "decided": decided, "why": why}) + "\n")
            return ""

    rc = bench.main(["--configs", "plain,adaptive-goodput", "--rounds", "2", "--closed", "2", "--rates", "",
                     "--phases", "", "--warmup", "0", "--out-len", "4", "--in-len", "3", "--out", str(tmp_path),
                     "--decision-log"], server_factory=FakeServer)
    assert rc == 0
    assert started == ["plain-round1", "adaptive-goodput-round1", "plain-round2", "adaptive-goodput-round2"]
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["label"], r["round"]) for r in rows] == [("plain", 1), ("adaptive-goodput", 1),
                                                        ("plain", 2), ("adaptive-goodput", 2)]
    # Each goodput row counts the batches logged while its point ran, not those before it.
    assert [r.get("decisions") for r in rows] == [None, {"plain refresh": 1, "spec forced": 1, "spec goodput": 2}] * 2
    assert sorted(p.name for p in tmp_path.glob("decisions-*")) == [
        "decisions-adaptive-goodput-round1.jsonl", "decisions-adaptive-goodput-round2.jsonl"]
    assert "over rounds" in (tmp_path / "report.md").read_text()
    # Only the goodput servers keep a table, each its own, read after every point.
    tables = [json.loads(x) for x in (tmp_path / "cost-tables.jsonl").read_text().splitlines()]
    assert [(t["label"], t["round"], t["concurrency"], t["table"]["server"]) for t in tables] == [
        ("adaptive-goodput", 1, 2, "adaptive-goodput-round1"), ("adaptive-goodput", 2, 2, "adaptive-goodput-round2")]
    assert "[4/4 adaptive-goodput-round2] closed c=2" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0", "--dry-run"])


def test_pin_cpus_pins_each_server_once_it_is_ready_and_rows_say_so(fake, tmp_path, capsys, monkeypatch):
    events = []

    class FakeServer:
        def __init__(self, label, args, env, log_dir, port, skip_tokenizer_init):
            self.label, self.url = label, fake.url
            self.proc = None
            # Alone on the GPU a server keeps SGLang's default idle loop.
            assert "--sleep-on-idle" not in args

        def start(self):
            events.append(("start", self.label))
            self.proc = type("Proc", (), {"pid": 4000 + len(events)})()

        def stop(self):
            pass

        def log_text(self):
            return ""

    class FakePinner:
        def __init__(self, slots):
            assert slots == 1, "servers in turn share one scheduler core"

        def check(self, schedulers):
            events.append(("check", schedulers))

        def pin_server(self, pid, slot):
            events.append(("pin", pid))
            return pinning.Plan((frozenset({7}),), frozenset({0, 1, 2}))

    # /proc/stat as read before and after each point: 100 jiffies pass on CPU 7 and
    # 100 on CPU 0, of which the hypervisor takes 10 on CPU 7.
    reads = iter(range(100))
    monkeypatch.setattr(bench.hostload, "cpu_times", lambda: (lambda n: {
        "cpu": (200 * n, 10 * n), "cpu0": (100 * n, 0), "cpu7": (100 * n, 10 * n)})(next(reads)))
    argv = ["--configs", "plain,eagle3", "--closed", "2", "--rates", "", "--phases", "", "--warmup", "0",
            "--out-len", "4", "--in-len", "3", "--out", str(tmp_path), "--pin-cpus"]
    assert bench.main(argv, server_factory=FakeServer, pinner_factory=FakePinner) == 0
    assert events == [("check", 1), ("start", "plain"), ("pin", 4002), ("start", "eagle3"), ("pin", 4004)]
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r.get("pinned") for r in rows] == [True, True]
    assert [(r["host_steal"], r["scheduler_cpu_steal"]) for r in rows] == [(0.05, 0.1)] * 2
    assert "[1/2 plain] pinned: scheduler CPUs 7; everything else on 3 CPUs" in capsys.readouterr().out

    # Too few cores: one sentence, and no server started.
    events.clear()
    refuse = lambda slots: pinning.Pinner(cpus={0, 1}, siblings_of=lambda c: {c}, slots=slots)  # noqa: E731
    assert bench.main(argv, server_factory=FakeServer, pinner_factory=refuse) == 2
    assert events == [] and "--pin-cpus needs 3 physical cores" in capsys.readouterr().err


def test_interleave_serves_every_configuration_at_once_and_takes_slices_in_turn(fake, tmp_path, capsys,
                                                                                monkeypatch):
    events, runs = [], []

    class FakeServer:
        def __init__(self, label, args, env, log_dir, port, skip_tokenizer_init):
            self.label, self.port, self.url = label, port, f"fake://{label}"
            self.proc = type("Proc", (), {"pid": port})()
            self.memory = [args[i + 1] for i, x in enumerate(args) if x == "--mem-fraction-static"]
            self.sleeps = args.count("--sleep-on-idle")

        def start(self):
            assert self.sleeps == 1, "a server waiting its turn would poll at 100% of a core"
            events.append(("start", self.label, self.port, self.memory))
            if self.label == "adaptive-threshold":
                raise RuntimeError("server exited")
            events.append(("up", self.label))

        def stop(self):
            events.append(("stop", self.label))

        def log_text(self):
            return ""

    class FakePinner:
        def __init__(self, slots):
            events.append(("slots", slots))

        def check(self, schedulers):
            pass

        def pin_server(self, pid, slot):
            events.append(("pin", pid, slot))
            return pinning.Plan((frozenset({9 + slot}),), frozenset({0, 1}))

    real_run = client.run

    def run(url, w, reqs):
        assert all(e[0] != "stop" for e in events), "measured while a server was down"
        runs.append((url.removeprefix("fake://"), w.concurrency, w.num_requests, reqs[0]["input_ids"]))
        return real_run(fake.url, w, reqs)

    monkeypatch.setattr(bench.client, "run", run)
    rc = bench.main(["--configs", "plain,eagle3,adaptive-threshold,adaptive-goodput", "--closed", "2",
                     "--requests-per-client", "16", "--interleave", "8", "--rates", "", "--phases", "",
                     "--warmup", "0", "--out-len", "4", "--in-len", "3", "--out", str(tmp_path), "--pin-cpus",
                     "--port", "31000"], server_factory=FakeServer, pinner_factory=FakePinner)
    assert rc == 1  # adaptive-threshold did not start; the other three are measured
    assert events[0] == ("slots", 4)
    # One start at a time, each once the one before is up (and pinned to its own
    # core), each holding 0.6 / 4 of the GPU: its fraction of what the earlier left.
    assert events[1:10] == [
        ("start", "plain", 31000, ["0.15"]), ("up", "plain"), ("pin", 31000, 0),
        ("start", "eagle3", 31010, ["0.176"]), ("up", "eagle3"), ("pin", 31010, 1),
        ("start", "adaptive-threshold", 31020, ["0.214"]),
        ("start", "adaptive-goodput", 31030, ["0.273"]), ("up", "adaptive-goodput")]
    assert events[10] == ("pin", 31030, 3)
    # Before each slice the live servers' cores rotate by one: each serves every slice
    # count on every core, so a slower core slows every configuration alike.
    repins = [e[1:] for e in events[11:] if e[0] == "pin"]
    assert repins == [(pid, [0, 1, 3][(k + s) % 3]) for s in range(4) for k, pid in enumerate((31000, 31010, 31030))]
    # 32 requests at c=2: 4 slices of 8 (4 waves each, not the 8 asked), the order
    # rotating by one, every server sent the same requests within a slice.
    live = ["plain", "eagle3", "adaptive-goodput"]
    assert [r[0] for r in runs] == [live[(s + i) % 3] for s in range(4) for i in range(3)]
    assert {(r[1], r[2]) for r in runs} == {(2, 8)}
    prompts = [r[3] for r in runs]
    assert all(prompts[3 * s] == prompts[3 * s + i] for s in range(4) for i in range(3))
    assert len({tuple(prompts[3 * s]) for s in range(4)}) == 4
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == live
    assert all(r["slices"] == 4 and len(r["slice_tok_per_s"]) == 4 and r["requests"] == 32 and r["pinned"]
               for r in rows)
    assert all(len(r["slice_host_steal"]) == 4 and "host_steal" in r and "scheduler_cpu_steal" in r for r in rows)
    assert [r["slice_scheduler_cpus"] for r in rows] == [
        [[9], [10], [12], [9]], [[10], [12], [9], [10]], [[12], [9], [10], [12]]]
    assert sorted(e[1] for e in events if e[0] == "stop") == sorted([*live, "adaptive-threshold"])
    assert "[round 1 adaptive-threshold] FAILED: server exited" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--rates", "4"], "--interleave measures closed-loop points only"),
    (["--interleave", "-1"], "--interleave takes a number of slices >= 1"),
])
def test_interleave_refuses_what_it_cannot_measure(extra, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--interleave", "4", "--phases", "", *extra])
    assert message in capsys.readouterr().err


def test_a_slice_holds_at_least_four_waves():
    assert bench.slices_of(Closed(64, 1024), 8) == 4
    assert bench.slices_of(Closed(1, 48), 8) == 8
    assert bench.slices_of(Closed(8, 16), 8) == 1
