"""The GPU-test harness's bookkeeping, with the server and the client stubbed."""

import math
import threading
import time

import pytest

from sglang_adaptive import testing


@pytest.fixture
def fake_servers(monkeypatch):
    seen = {"ports": {}, "live": 0, "max_live": 0}
    lock = threading.Lock()

    class FakeServer:
        def __init__(self, label, args, env, port):
            self.label, self.args, self.port = label, args, port
            self.url = f"http://127.0.0.1:{port}"

        def start(self):
            if self.label == "broken":
                raise RuntimeError("server exited")
            with lock:
                seen["ports"][self.label] = self.port
                seen["live"] += 1
                seen["max_live"] = max(seen["max_live"], seen["live"])
            time.sleep(0.05)

        def settle(self):
            with lock:
                seen.setdefault("settled", []).append(self.label)

        def stop(self):
            with lock:
                if self.label in seen["ports"]:
                    seen["live"] -= 1

        def log_text(self):
            return f"log of {self.label}"

    def fake_generate(url, reqs, concurrency):
        return [{"output_ids": [r, concurrency]} for r in reqs]

    monkeypatch.setattr(testing, "Server", FakeServer)
    monkeypatch.setattr(testing, "generate", fake_generate)
    return seen


CONFIGS = {"a": (["--x"], {}, 1), "b": ([], {}, 2), "c": ([], {}, 3), "broken": ([], {}, 4)}


@pytest.mark.parametrize("parallel", [1, 3])
def test_every_configuration_runs_once_in_order(fake_servers, parallel):
    runs = testing.run_configs(CONFIGS, [10, 11], parallel=parallel)
    assert list(runs) == list(CONFIGS)
    assert runs["b"].ids == [[10, 2], [11, 2]] and runs["b"].log == "log of b"
    assert runs["broken"].error == "server exited" and runs["broken"].results is None
    # One port per configuration, so overlapping servers never collide.
    assert len(set(fake_servers["ports"].values())) == 3
    assert fake_servers["max_live"] == min(parallel, 3)


def test_port_base_moves_every_port_and_servers_settle_before_they_stop(fake_servers, monkeypatch):
    monkeypatch.setenv(testing.PORT_BASE_ENV, "32000")
    testing.run_configs({"a": ([], {}, 1), "b": ([], {}, 1)}, [10])
    assert sorted(fake_servers["ports"].values()) == [32000, 32010]
    assert sorted(fake_servers["settled"]) == ["a", "b"]


def test_settle_waits_for_the_log_to_stop_growing(tmp_path):
    srv = testing.Server("s", [], log_dir=tmp_path)
    srv.log_path.write_text("x")

    def grow():
        for _ in range(5):
            time.sleep(0.1)
            with open(srv.log_path, "a") as f:
                f.write("line\n")

    writer = threading.Thread(target=grow)
    t0 = time.time()
    writer.start()
    srv.settle(quiet=0.3, limit=5)
    writer.join()
    assert srv.log_path.read_text().count("line") == 5  # returned only after the last write
    assert 0.75 <= time.time() - t0 < 3


def test_requests_for_overrides_one_configuration(fake_servers):
    runs = testing.run_configs({"a": ([], {}, 1), "b": ([], {}, 1)}, [10], requests_for={"b": [20]})
    assert runs["a"].ids == [[10, 1]] and runs["b"].ids == [[20, 1]]


def _ref(ids, tops):
    return {"output_ids": ids, "meta_info": {"output_top_logprobs": [[(lp, t, None) for t, lp in top.items()]
                                                                    for top in tops]}}


def test_divergences_measure_the_reference_gap_at_the_first_difference():
    tops = [{5: -0.1, 6: -3.0}, {7: -0.70, 8: -0.75, 9: -4.0}, {1: -0.2, 2: -2.0}]
    ref = [_ref([5, 7, 1], tops), _ref([5, 7, 1], tops), _ref([5, 7, 1], tops), _ref([5, 7, 1], tops)]
    got = [[5, 7, 1],   # equal: no divergence
           [5, 8, 2],   # flips a near-tie at token 1; what follows is another text
           [6, 7, 1],   # takes a token the reference ranks 2.9 nats lower
           [5, 3, 1]]   # takes a token outside the reference's top-k
    div = testing.divergences(ref, got)
    assert [(d.request, d.token) for d in div] == [(1, 1), (2, 0), (3, 1)]
    assert abs(div[0].gap - 0.05) < 1e-9 and abs(div[1].gap - 2.9) < 1e-9
    assert div[2].gap == float("inf")


def test_beyond_ties_accepts_near_ties_only_and_only_a_few():
    tops = [{5: -0.1, 6: -3.0}, {7: -0.7000, 8: -0.7003, 9: -4.0}, {1: -0.2, 2: -2.0}]
    ref = [_ref([5, 7, 1], tops)] * 3
    assert testing.beyond_ties(ref, [[5, 7, 1], [5, 8, 2], [5, 7, 1]], tie_gap=1e-3, max_ties=1) == []
    # Two near-ties where one is allowed; a clear loser; a shorter output.
    assert testing.beyond_ties(ref, [[5, 8, 2], [5, 8, 2], [5, 7, 1]], tie_gap=1e-3, max_ties=1) == [
        "2 requests diverge at ties, more than 1"]
    (wide,) = testing.beyond_ties(ref, [[6, 7, 1], [5, 7, 1], [5, 7, 1]], tie_gap=1e-3, max_ties=1)
    assert wide.startswith("request 0 leaves the reference at token 0 with a gap of 2.9")
    (short,) = testing.beyond_ties(ref, [[5, 7], [5, 7, 1], [5, 7, 1]], tie_gap=1e-3, max_ties=1)
    assert "gap of inf" in short


def test_with_top_logprobs_keeps_the_request():
    (r,) = testing.with_top_logprobs([{"input_ids": [1], "sampling_params": {"temperature": 0.0}}], k=2)
    assert r["input_ids"] == [1] and r["return_logprob"] and r["top_logprobs_num"] == 2


# Decode lines as SGLang 0.5.17 logs them (timestamps and throughput trimmed).
_LINE = ("[2026-11-29 14:28:03] Decode batch, #running-req: {}, #token: 5720, token usage: 0.71, {}"
         "cuda graph: True, gen throughput (token/s): 28.00, #queue-req: {}\n")
LOG = (_LINE.format(1, "", 0) + _LINE.format(28, "", 4)
       + _LINE.format(25, "accept len: 2.38, accept rate: 0.46, ", 11) + _LINE.format(32, "", 0))


def test_memory_bound_concurrency_averages_batches_with_a_queue():
    run = testing.Run(results=[], log=LOG)
    assert run.peak_running() == 32
    assert run.memory_bound_concurrency() == 26.5  # (28 + 25) / 2: only batches with requests waiting
    assert testing.Run(results=[], log=LOG.replace("#queue-req: 4", "#queue-req: 0")
                       .replace("#queue-req: 11", "#queue-req: 0")).memory_bound_concurrency() == 0.0


def test_mismatching_requests_lists_the_requests_that_differ():
    assert testing.mismatching_requests([[1, 2], [3], [4, 5]], [[1, 2], [3, 0], [4, 6]]) == [1, 2]


def test_spec_accept_length_weighs_only_speculative_batches():
    log = LOG + _LINE.format(5, "accept len: 1.00, accept rate: 0.00, ", 0)
    run = testing.Run(results=[], log=log)
    assert run.spec_accept_length() == pytest.approx((25 * 2.38 + 5 * 1.0) / 30)
    assert math.isnan(testing.Run(results=[], log=_LINE.format(3, "", 0)).spec_accept_length())


def test_servers_side_by_side_get_their_own_rendezvous_port():
    a, b = testing.Server("a", []), testing.Server("b", [], port=30010)
    ports = [cmd[cmd.index("--nccl-port") + 1] for cmd in (a.command(), b.command())]
    assert ports[0] != ports[1] and str(a.port) not in ports and str(b.port) not in ports
    given = testing.Server("c", ["--nccl-port", "4000"]).command()
    assert given.count("--nccl-port") == 1
    # Token ids by default; a grammar server keeps its tokenizer.
    assert "--skip-tokenizer-init" in a.command()
    assert "--skip-tokenizer-init" not in testing.Server("g", [], skip_tokenizer_init=False).command()


def test_abort_and_disconnect_clients_against_a_stand_in_server():
    """The GPU request-kind test and the soak script abort requests through these."""
    import asyncio

    from aiohttp import web

    aborted = set()

    async def generate(request):
        req = await request.json()
        if req.get("stream"):
            resp = web.StreamResponse()
            await resp.prepare(request)
            for i in range(20):
                await resp.write(f'data: {{"output_ids": [{i}]}}\n\n'.encode())
                await asyncio.sleep(0.01)
            await resp.write(b"data: [DONE]\n\n")
            return resp
        for _ in range(50):  # finishes after 0.5 s unless aborted
            if req.get("rid") in aborted:
                return web.json_response({"meta_info": {"finish_reason": {"type": "abort"}}})
            await asyncio.sleep(0.01)
        return web.json_response({"meta_info": {"finish_reason": {"type": "length"}}})

    async def abort(request):
        aborted.add((await request.json())["rid"])
        return web.json_response({})

    async def main():
        app = web.Application()
        app.add_routes([web.post("/generate", generate), web.post("/abort_request", abort)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            async with testing.client_session(30) as s:
                return (await testing.disconnect_midstream(s, url, {}, chunks=3),
                        await testing.disconnect_midstream(s, url, {}, chunks=100),
                        await testing.abort_by_rid(s, url, {"rid": "a"}, after=0.1),
                        await testing.post_generate(s, url, {"rid": "c"}))
        finally:
            await runner.cleanup()

    cut, finished, aborted_status, plain = asyncio.run(main())
    assert cut == "disconnected" and finished == "finished before the disconnect"
    assert aborted_status == "200 abort"
    assert plain["meta_info"]["finish_reason"]["type"] == "length"


def test_client_keepalive_sits_below_sglangs_server_keepalive(monkeypatch):
    from sglang_adaptive.upstream import sglang_symbols

    server_default = getattr(type(sglang_symbols.envs), testing.SERVER_KEEP_ALIVE_ENV).default
    assert server_default == testing.SERVER_KEEP_ALIVE_DEFAULT_S
    monkeypatch.delenv(testing.SERVER_KEEP_ALIVE_ENV, raising=False)
    assert testing.client_keepalive_s() == server_default / 2
    monkeypatch.setenv(testing.SERVER_KEEP_ALIVE_ENV, "8")
    assert testing.client_keepalive_s() == 4


def test_client_does_not_send_on_a_connection_the_server_closed(monkeypatch):
    """uvicorn (SGLang's HTTP server) closes an idle connection after its keep-alive;
    a client that keeps it longer sends the next request into the closed socket."""
    import asyncio
    import socket

    import aiohttp
    import uvicorn

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, timeout_keep_alive=1, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    monkeypatch.setenv(testing.SERVER_KEEP_ALIVE_ENV, "1")

    async def two_requests(make_session):
        async with make_session() as s:
            await testing.post_generate(s, url, {})
            # Blocks the loop past the server's keep-alive, so the close is not yet
            # seen when the next request picks a pooled connection: the race, made certain.
            time.sleep(1.5)
            try:
                await testing.post_generate(s, url, {})
                return "ok"
            except aiohttp.ClientError as e:
                return type(e).__name__

    try:
        aiohttp_default = asyncio.run(two_requests(
            lambda: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))))
        ours = asyncio.run(two_requests(lambda: testing.client_session(30)))
    finally:
        server.should_exit = True
        thread.join(10)
    assert aiohttp_default != "ok"  # the setup reproduces the race
    assert ours == "ok"
