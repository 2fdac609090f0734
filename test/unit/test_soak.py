"""benchmark/soak.py: the oscillating arrivals, the request mix, the KV reading from
/metrics and the verdict table; and the whole script against a fake server."""

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))
import soak  # noqa: E402


def test_arrivals_follow_the_sine_between_low_and_high():
    times = soak.arrivals(480.0, low=1.0, high=40.0, period=240.0, seed=3)
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 480.0
    trough = sum(1 for t in times if t < 20 or 220 <= t < 260)   # around t = 0 and 240
    peak = sum(1 for t in times if 100 <= t < 140)               # around t = 120
    assert peak > 10 * trough
    # The expected count is the integral of the rate: (low + high) / 2 per second.
    assert len(times) == pytest.approx(480 * 20.5, rel=0.05)


def test_the_mix_draws_every_kind_and_shapes_its_request():
    rng = random.Random(0)
    kinds = [soak.draw_kind(rng) for _ in range(5000)]
    assert set(kinds) == set(soak.KINDS)
    assert kinds.count("greedy") / len(kinds) == pytest.approx(1 - sum(soak.MIX.values()), abs=0.03)
    one = soak.make_request("one-token", rng, vocab=32000)
    assert one["sampling_params"]["max_new_tokens"] == 1 and one["rid"].startswith("soak-one-token-")
    assert soak.make_request("parallel-2", rng, vocab=32000)["sampling_params"]["n"] == 2
    lp = soak.make_request("logprobs", rng, vocab=32000)
    assert lp["return_logprob"] and lp["top_logprobs_num"] == 3 and "token_ids_logprob" not in lp
    stop = soak.make_request("stop-ids", rng, vocab=32000)["sampling_params"]
    assert len(stop["stop_token_ids"]) == 8 and stop["ignore_eos"] is False


def test_kv_tokens_come_from_the_metrics_gauge():
    text = ('# HELP sglang:num_used_tokens ...\n'
            'sglang:num_used_tokens{engine_type="unified",model_name="m",tp_rank="0"} 123.0\n'
            'sglang:num_used_tokens_other{x="1"} 9\n')
    assert soak.kv_tokens_in_use(text) == 123
    assert soak.kv_tokens_in_use("") is None


def test_server_memory_sums_its_own_processes_only(monkeypatch):
    import os
    import subprocess

    out = "101, 5000\n202, 700\n303, 900\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=out))
    monkeypatch.setattr(os, "getpgid", lambda pid: {101: 7, 202: 7, 303: 9}[pid])
    assert soak.parse_compute_apps(out) == [(101, 5000), (202, 700), (303, 900)]
    assert soak.gpu_memory_mib(7) == [5700] and soak.gpu_memory_mib(8) == [0]


def test_summary_counts_outcomes_and_flags_a_leak():
    outcomes = [("greedy", "ok", 0.0, 1.0), ("disconnect", "disconnected", 0.5, 0.7),
                ("abort-request", "aborted", 2.0, 2.5), ("greedy", "error: HTTP 500: boom", 61.4, 61.5)]
    samples = [(5.0, [1000, 1000], 0), (10.0, [1100, 1090], 512)]
    s = soak.summarize(outcomes, samples, kv_start=0, kv_end=4, mode_line="decode batches: 9 (...)",
                       server_calls=(3, 0), warmup={"greedy": 0.4, "sampled-penalties": 118.2})
    assert s["requests"] == 4 and s["errors"] == 1 and s["first_errors"] == ["61 s greedy: error: HTTP 500: boom"]
    assert s["by_outcome"] == {"ok": 1, "disconnected": 1, "aborted": 1, "error": 1}
    assert s["kv_leak"] == 4 and s["gpu_memory_mib_max"] == 1100
    assert s["server_received"] == 3 and s["server_not_200"] == 0 and s["longest_stall_s"] == 0.7
    table = soak.markdown(s)
    assert "| KV tokens in use at start / end | 0 / 4 |" in table and "| errors | 1 |" in table
    assert "| requests the server received (its /metrics) | 3 |" in table
    assert "| warm-up before the clock, first request per kind (s) | greedy 0.4, sampled-penalties 118.2 |" in table


def test_longest_stall_counts_only_time_with_requests_in_flight():
    assert soak.longest_stall([]) == 0.0
    # Idle from 3 to 10 s is not a stall; from 12 to 130 s one request was in flight.
    spans = [(0, 1), (0.5, 3), (10, 11), (10.2, 130), (11, 12)]
    assert soak.longest_stall(spans) == 118
    # The first completion of a busy stretch counts from its first send.
    assert soak.longest_stall([(5, 50), (6, 51)]) == 45


def test_server_side_generate_counts_come_from_its_http_metrics():
    text = ('sglang:http_requests_total{endpoint="/generate",method="POST"} 12586.0\n'
            'sglang:http_requests_total{endpoint="/metrics",method="GET"} 238.0\n'
            'sglang:http_responses_total{endpoint="/generate",method="POST",status_code="200"} 12580.0\n'
            'sglang:http_responses_total{endpoint="/generate",method="POST",status_code="400"} 6.0\n'
            'sglang:http_responses_total{endpoint="/metrics",method="GET",status_code="500"} 1.0\n')
    assert soak.generate_calls(text) == (12586, 6)
    assert soak.generate_calls("") == (None, None)


class FakeSGLang:
    """A stand-in for the SGLang server that soak.main starts: /generate (streamed and
    not, ``n``), /abort_request, /metrics, in a thread of its own. It checks the
    soak's driving and reporting end to end on the CPU; what the real server does
    with each kind is the GPU tests' (test/gpu/test_request_kinds.py)."""

    STATS = "[t] AdaptiveEAGLE decode batches: 10 (plain 6, 60.0%; speculative 4), switches: 3\n"

    def __init__(self, label, args, env, log_dir, port=30000):
        import socket

        self.args, self.env, self.log_dir = args, env, Path(log_dir)
        self.aborted: set = set()
        self.seen: list = []
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log_path = self.log_dir / f"server-{label}.log"

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        import asyncio
        import threading

        from aiohttp import web

        async def generate(request):
            import json

            req = await request.json()
            self.seen.append(req)
            params = req["sampling_params"]
            n_tokens, rid = params["max_new_tokens"], req.get("rid")

            def body(count, reason):
                return {"text": "x" * count, "output_ids": list(range(count)),
                        "meta_info": {"finish_reason": {"type": reason}, "completion_tokens": count}}

            if req.get("stream"):
                resp = web.StreamResponse()
                await resp.prepare(request)
                for i in range(1, n_tokens + 1):
                    await asyncio.sleep(0.001)
                    reason = "length" if i == n_tokens else None
                    await resp.write(f"data: {json.dumps(body(i, reason))}\n\n".encode())
                await resp.write(b"data: [DONE]\n\n")
                return resp
            count = 0
            while count < n_tokens and rid not in self.aborted:  # 10 ms a token: aborts land
                await asyncio.sleep(0.01)
                count += 1
            one = body(count, "abort" if rid in self.aborted else "length")
            return web.json_response([one, one] if params.get("n", 1) > 1 else one)

        async def abort(request):
            self.aborted.add((await request.json())["rid"])
            return web.Response()

        async def metrics(request):
            n = len(self.seen)
            return web.Response(text='sglang:num_used_tokens{model_name="m",tp_rank="0"} 0.0\n'
                                f'sglang:http_requests_total{{endpoint="/generate",method="POST"}} {n}\n'
                                'sglang:http_responses_total{endpoint="/generate",method="POST",'
                                f'status_code="200"}} {n}\n')

        app = web.Application()
        app.add_routes([web.post("/generate", generate), web.post("/abort_request", abort),
                        web.get("/metrics", metrics)])
        self.loop = asyncio.new_event_loop()
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.log_path.write_text(self.STATS)

    def settle(self, **kwargs):
        pass

    def log_text(self):
        return self.log_path.read_text()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def test_soak_drives_every_kind_and_reports_against_a_fake_server(tmp_path, monkeypatch):
    servers = []

    def make(*args, **kwargs):
        servers.append(FakeSGLang(*args, **kwargs))
        return servers[-1]

    monkeypatch.setattr(soak, "Server", make)
    monkeypatch.setattr(soak.time, "sleep", lambda s: None)  # soak's start-up and drain pauses (nothing else sleeps)
    rc = soak.main(["--minutes", "0.1", "--low", "20", "--high", "80", "--period", "6", "--sample-every", "0.5",
                    "--mem-fraction-static", "0.3", "--out", str(tmp_path)])
    summary = __import__("json").loads((tmp_path / "soak.json").read_text())
    assert rc == 0, summary["first_errors"]
    (server,) = servers
    assert "--enable-metrics" in server.args and server.env["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY"] == "1"
    assert server.args.count("--mem-fraction-static") == 1  # replaced, not added twice
    assert server.args[server.args.index("--mem-fraction-static") + 1] == "0.3"
    # One /generate per request, aborted ones too, after one warm-up request per kind.
    assert summary["requests"] == len(server.seen) - len(soak.WARM_KINDS) > 100
    assert summary["server_received"] == summary["requests"] and summary["server_not_200"] == 0
    assert set(summary["warmup_s"]) == set(soak.WARM_KINDS)
    assert all(isinstance(v, float) for v in summary["warmup_s"].values()), summary["warmup_s"]
    assert [r["rid"].split("-")[1] for r in server.seen[:len(soak.WARM_KINDS)]] == [
        k.split("-")[0] for k in soak.WARM_KINDS]
    assert summary["longest_stall_s"] < 5
    assert set(summary["by_kind"]) == set(soak.KINDS), summary["by_kind"]
    assert summary["errors"] == 0 and summary["kv_leak"] == 0
    assert summary["by_outcome"].get("aborted", 0) > 0 and summary["by_outcome"].get("disconnected", 0) > 0
    assert summary["mode_counters"].startswith("decode batches: 10 (plain 6")
    assert len(summary["samples"]) >= 5 and all(kv == 0 for _, _, kv in summary["samples"])
    written = [__import__("json").loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert written == [list(x) for x in summary["samples"]]  # as they were taken, for a soak cut short
    assert "sglang:num_used_tokens" in (tmp_path / "metrics.txt").read_text()
    assert "| errors | 0 |" in (tmp_path / "soak.md").read_text()
