"""Every request kind through plain batches: the trained tiny pair, alternating every
step, against the no-spec server, in fp32 (exact) with SGLang's strict memory check.

Per kind, under ``alternate-1`` (every other decode batch plain):
- greedy with logprobs (top-k and token-id logprobs), stop token ids, EOS, and
  ``max_new_tokens=1``: the no-spec server's tokens, token for token, and its
  logprobs within fp32 rounding;
- ``n=2`` sampling at temperature 0.8 with frequency, presence and repetition
  penalties: every sample complete, no error;
- a client that disconnects mid-stream and ``/abort_request`` by request id: the
  request ends, the server stays healthy and serves exact tokens afterwards;
- retraction under KV pressure (a small KV pool): requests are retracted and still
  return the no-spec server's tokens.
No server may log an error, and the strict memory check (which stops the server on
a leaked KV slot when it goes idle) stays quiet. On the GPU host:

    ADAPTIVE_GPU_REQUIRED=1 python -m pytest -m gpu test/gpu/test_request_kinds.py -v
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter

import pytest
from suite import ENV32, FP32_ARGS, assert_modes, base_args, configs, require_gpu
from test_tiny_pair import PAIR, text_requests

from sglang_adaptive.testing import (
    LOG_ERROR_MARKERS,
    Server,
    abort_by_rid,
    client_session,
    disconnect_midstream,
    mismatching_requests,
    post_generate,
    run_configs,
)

pytestmark = pytest.mark.gpu

LABELS = ("plain", "alternate-1")
GREEDY_KINDS = ("logprobs", "stop-ids", "eos", "one-token")
LOGPROB_TOL = 1e-3  # fp32, different kernels for the same token (verify rows, decode rows)
PORT_BASE = int(os.environ.get("ADAPTIVE_GPU_PORT_BASE", "33000"))


def kind_requests(n: int = 32) -> dict[str, list[dict]]:
    base = text_requests(n, seed=7, prompt=(16, 300), output=(8, 120))
    rng = random.Random(7)

    def with_params(req, **params):
        return {**req, "sampling_params": {**req["sampling_params"], **params}}

    out = {
        "logprobs": [{**r, "return_logprob": True, "top_logprobs_num": 3, "token_ids_logprob": [5, 17, 42]}
                     for r in base],
        # The prompt's most frequent token: likely soon in a continuation of the same code.
        # (ignore_eos would turn stop token ids off too: _check_token_based_finish.)
        "stop-ids": [with_params(r, ignore_eos=False, stop_token_ids=[Counter(r["input_ids"]).most_common(1)[0][0]])
                     for r in base],
        "eos": [with_params(r, ignore_eos=False, max_new_tokens=200) for r in base],
        "one-token": [with_params(r, max_new_tokens=1) for r in base],
        "sampled": [with_params(r, n=2, temperature=0.8, top_p=0.95, frequency_penalty=0.5,
                                presence_penalty=0.3, repetition_penalty=1.1) for r in base[:16]],
    }
    for kind in ("disconnect", "abort"):
        out[kind] = [{**with_params(r, max_new_tokens=400), "rid": f"{kind}-{i}-{rng.randrange(1 << 30)}"}
                     for i, r in enumerate(base[:8])]
    out["after-aborts"] = base[:16]
    return out


async def serve_kinds(url: str, reqs: dict[str, list[dict]]) -> dict:
    out = {}
    async with client_session(600) as s:
        for kind in (*GREEDY_KINDS, "sampled"):
            out[kind] = await asyncio.gather(*(post_generate(s, url, r) for r in reqs[kind]))
        out["disconnect"] = await asyncio.gather(*(disconnect_midstream(s, url, r) for r in reqs["disconnect"]))
        out["abort"] = await asyncio.gather(*(abort_by_rid(s, url, r, after=0.3) for r in reqs["abort"]))
        await asyncio.sleep(3)  # the aborted requests drain; the idle memory check runs
        out["after-aborts"] = await asyncio.gather(*(post_generate(s, url, r) for r in reqs["after-aborts"]))
    return out


@pytest.fixture(scope="module")
def runs():
    require_gpu()
    reqs = kind_requests()
    base = base_args("--model-path", str(PAIR / "target"), "--max-total-tokens", "8000", *FP32_ARGS)
    out = {}
    for i, (label, (args, env, _)) in enumerate(configs(base, PAIR / "eagle3", labels=LABELS, env=ENV32).items()):
        srv = Server(label, args, env, port=PORT_BASE + 10 * i)
        try:
            srv.start()
            out[label] = {"results": asyncio.run(serve_kinds(srv.url, reqs))}
            srv.settle()
        except Exception as e:  # recorded; every test of this server fails on it
            out[label] = {"error": str(e)[-3000:]}
        finally:
            srv.stop()
        out[label]["log"] = srv.log_text()
    # Retraction: a KV pool far smaller than what 32 requests of up to 400 tokens need.
    small = base_args("--model-path", str(PAIR / "target"), "--max-total-tokens", "1500", *FP32_ARGS)
    pressure = text_requests(48, seed=9, prompt=(64, 160), output=(200, 300))
    table = {f"retract-{k}": (a, e, 32) for k, (a, e, _) in
             configs(small, PAIR / "eagle3", labels=LABELS, env=ENV32).items()}
    out.update({k: {"run": v} for k, v in run_configs(table, pressure).items()})
    path = os.path.join(os.environ.get("OUT", "/tmp"), "gpu-request-kinds.json")
    with open(path, "w") as f:
        json.dump({k: {"error": v.get("error"), "problems": problems(v)} for k, v in out.items()}, f, indent=1)
    return out


def problems(entry: dict) -> list[str]:
    if "run" in entry:
        return entry["run"].problems()
    found = [f"server error: {entry['error']}"] if entry.get("error") else []
    return found + [f"{m!r} in the server log" for m in LOG_ERROR_MARKERS if m in entry.get("log", "")]


def results(runs, label: str) -> dict:
    assert not problems(runs[label]), problems(runs[label])[:3]
    return runs[label]["results"]


def test_the_switching_server_alternated(runs):
    from sglang_adaptive.testing import Run

    entry = runs["alternate-1"]
    assert not problems(entry), problems(entry)[:3]
    assert_modes("alternate-1", Run([], entry["log"], None))


@pytest.mark.parametrize("kind", GREEDY_KINDS)
def test_greedy_kinds_return_the_no_spec_tokens(runs, kind):
    ref, got = results(runs, "plain")[kind], results(runs, "alternate-1")[kind]
    ids = lambda rs: [r["output_ids"] for r in rs]  # noqa: E731
    assert not mismatching_requests(ids(ref), ids(got)), mismatching_requests(ids(ref), ids(got))[:5]
    if kind == "one-token":
        assert all(len(r["output_ids"]) == 1 for r in got)
    if kind == "stop-ids":
        stopped = sum(r["meta_info"]["finish_reason"]["type"] == "stop" for r in got)
        assert stopped > 0, "no request met its stop token: the kind tested nothing"


def test_logprobs_match_the_no_spec_server(runs):
    ref, got = results(runs, "plain")["logprobs"], results(runs, "alternate-1")["logprobs"]
    for a, b in zip(ref, got):
        for field in ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs"):
            ra, rb = a["meta_info"][field], b["meta_info"][field]
            assert len(ra) == len(rb) == len(a["output_ids"]), field
            for pa, pb in zip(ra, rb):
                flat_a = pa if isinstance(pa[0], list) else [pa]
                flat_b = pb if isinstance(pb[0], list) else [pb]
                assert [x[1] for x in flat_a] == [x[1] for x in flat_b], field  # token ids
                assert all(abs(x[0] - y[0]) <= LOGPROB_TOL for x, y in zip(flat_a, flat_b)), field


def test_sampled_parallel_requests_complete(runs):
    got = results(runs, "alternate-1")["sampled"]
    reqs = kind_requests()["sampled"]
    for req, body in zip(reqs, got):
        samples = body if isinstance(body, list) else [body]
        assert len(samples) == 2
        assert all(len(s["output_ids"]) == req["sampling_params"]["max_new_tokens"] for s in samples)


def test_aborts_end_their_requests_and_the_server_stays_exact(runs):
    got = results(runs, "alternate-1")
    assert got["disconnect"].count("disconnected") >= 6, got["disconnect"]
    assert all(a.startswith("200 abort") for a in got["abort"]), got["abort"]
    ref = results(runs, "plain")["after-aborts"]
    ids = lambda rs: [r["output_ids"] for r in rs]  # noqa: E731
    assert not mismatching_requests(ids(ref), ids(got["after-aborts"]))


def test_retraction_under_kv_pressure_keeps_the_tokens(runs):
    ref, got = runs["retract-plain"]["run"].check(), runs["retract-alternate-1"]["run"].check()
    retracted = sum(r["meta_info"].get("num_retractions", 0) for r in got.results)
    assert retracted > 0, "the KV pool never ran short: no retraction tested"
    assert not mismatching_requests(ref.ids, got.ids), mismatching_requests(ref.ids, got.ids)[:5]
