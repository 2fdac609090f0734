"""Grammar-constrained requests through plain batches: the trained tiny pair in fp32,
alternating every step, against the no-spec server, with xgrammar.

A batch with constrained requests runs plain (masked) decode by default
(``worker._sample_constrained``; ``SGLANG_ADAPTIVE_PLAIN_GRAMMAR=0`` keeps such
batches speculative), so the servers run with no switch set. Every constrained output must
match its regex or JSON schema and equal the no-spec server's, token for token
(greedy, fp32): a mask built from a grammar one token behind takes another token or
leaves the language. Half of the requests are unconstrained, so constrained and free
requests share plain batches. On the GPU host:

    ADAPTIVE_GPU_REQUIRED=1 python -m pytest -m gpu test/gpu/test_grammar_plain.py -v
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from suite import ENV32, FP32_ARGS, assert_modes, base_args, configs, require_gpu
from test_tiny_pair import PAIR, text_requests

from sglang_adaptive.bench.workloads import JSON_SCHEMA, matches_json_schema
from sglang_adaptive.testing import LOG_ERROR_MARKERS, Run, Server, client_session, post_generate, without_flags

pytestmark = pytest.mark.gpu

ENV = ENV32
# Every other batch plain; runs of 7 plain batches (a plain step's barrier resolving a
# plain result); without overlap (no barrier: the grammar advances in processing).
LABELS = ("plain", "alternate-1", "alternate-7", "alternate-1-no-overlap")
ADAPTIVE_LABELS = LABELS[1:]
PORT_BASE = int(os.environ.get("ADAPTIVE_GPU_PORT_BASE", "34000"))
# Long enough (20-60 tokens) that constrained requests stay in the batches for many steps.
REGEX = r"(yes|no)(, [0-9]{1,3}){4,12}\."
CONSTRAINED_MAX_TOKENS = 200


def grammar_requests(n: int = 48) -> list[dict]:
    out = []
    for i, r in enumerate(text_requests(n, seed=11, prompt=(16, 200), output=(80, 120))):
        params = dict(r["sampling_params"], ignore_eos=False)
        # A constrained request ends where its grammar does; a token limit that cut it
        # (80 tokens held 9 of a schema's 10 tags) would leave it out of its language.
        if i % 4 == 1:
            params.update(regex=REGEX, max_new_tokens=CONSTRAINED_MAX_TOKENS)
        elif i % 4 == 3:
            params.update(json_schema=json.dumps(JSON_SCHEMA), max_new_tokens=CONSTRAINED_MAX_TOKENS)
        out.append({**r, "sampling_params": params})
    return out


def matches(req: dict, text: str) -> bool:
    params = req["sampling_params"]
    if "regex" in params:
        return re.fullmatch(REGEX, text) is not None
    return matches_json_schema(text)


@pytest.fixture(scope="module")
def runs():
    require_gpu()
    reqs = grammar_requests()
    base = base_args("--model-path", str(PAIR / "target"), "--max-total-tokens", "8000", *FP32_ARGS)
    base = without_flags(base, {"--grammar-backend"}) + [
        "--grammar-backend", "xgrammar", "--constrained-json-disable-any-whitespace"]

    def serve_one(i, label, args, env):
        srv = Server(label, args, env, port=PORT_BASE + 10 * i, skip_tokenizer_init=False)
        results, error = None, None
        try:
            srv.start()

            async def serve(url=srv.url):
                async with client_session(600) as s:
                    return await asyncio.gather(*(post_generate(s, url, r) for r in reqs))

            results = asyncio.run(serve())
            srv.settle()
        except Exception as e:  # recorded; every test of this server fails on it
            error = str(e)[-3000:]
        finally:
            srv.stop()
        return label, Run(results, srv.log_text(), error)

    # Side by side (tiny fp32 servers): one at a time, the start-ups alone (about 60 s
    # each with a tokenizer) outlasted a 420 s step.
    table = configs(base, PAIR / "eagle3", labels=LABELS, env=ENV)
    with ThreadPoolExecutor(max_workers=len(table)) as pool:
        out = dict(pool.map(lambda item: serve_one(item[0], *item[1]),
                            enumerate((label, args, env) for label, (args, env, _) in table.items())))
    path = os.path.join(os.environ.get("OUT", "/tmp"), "gpu-grammar-plain.json")
    with open(path, "w") as f:
        json.dump({k: {"problems": v.problems(),
                       "texts": [r["text"] for r in v.results] if v.results else None} for k, v in out.items()},
                  f, indent=1)
    return out, reqs


def test_servers_ran_without_errors(runs):
    out, _ = runs
    for label, run in out.items():
        assert not run.problems(), (label, run.problems()[:3])
        assert not any(m in run.log for m in LOG_ERROR_MARKERS), label


@pytest.mark.parametrize("label", ADAPTIVE_LABELS)
def test_constrained_requests_ran_in_plain_batches(runs, label):
    # With the switch off, every batch holding a constrained request would speculate
    # and the schedule's switch count would fall short (assert_modes).
    out, _ = runs
    stats = assert_modes(label, out[label].check())
    assert stats["plain"] > 0 and stats["spec"] > 0, stats


@pytest.mark.parametrize("label", LABELS)
def test_every_constrained_output_is_in_its_language(runs, label):
    out, reqs = runs
    bad = [(i, r["text"]) for i, (req, r) in enumerate(zip(reqs, out[label].check().results))
           if ({"regex", "json_schema"} & set(req["sampling_params"])) and not matches(req, r["text"])]
    assert not bad, bad[:5]


@pytest.mark.parametrize("label", ADAPTIVE_LABELS)
def test_outputs_equal_the_no_spec_server(runs, label):
    out, _ = runs
    ref, got = out["plain"].check().results, out[label].check().results
    differ = [i for i, (a, b) in enumerate(zip(ref, got)) if a["text"] != b["text"]]
    assert not differ, [(i, ref[i]["text"], got[i]["text"]) for i in differ[:5]]
