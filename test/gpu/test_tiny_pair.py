"""The trained tiny pair on a real GPU: real weights through SGLang's loader, real
acceptance on held-out prompts, and the core-worker suite (suite.py) against it.
On the GPU host (its servers are small: run them side by side):

    ADAPTIVE_GPU_PARALLEL=10 python -m pytest -m gpu test/gpu/test_tiny_pair.py -v
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
from suite import *  # noqa: F401,F403  (the shared tests, collected against this pair)
from suite import DEBUG_ENV, base_args, collect, configs

from sglang_adaptive.testing import mismatching_requests

pytestmark = pytest.mark.gpu

PAIR = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-pair"
NUM = int(os.environ.get("ADAPTIVE_GPU_NUM", "200"))


def text_requests(n: int, seed: int = 1) -> list[dict]:
    """Prompts cut from held-out standard-library modules (``heldout_tokens.bin``: the
    first 32768 tokens of the top-level modules t*.py .. z*.py, which the pair was not
    trained on, tokenized when the pair was made), mixed prompt and output lengths,
    greedy. Committed tokens, so every host sends the same requests."""
    import array

    ids = array.array("H")
    ids.frombytes((PAIR / "heldout_tokens.bin").read_bytes())
    if sys.byteorder != "little":
        ids.byteswap()
    ids = ids.tolist()
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        length = rng.randint(16, 400)
        start = rng.randrange(0, len(ids) - length)
        reqs.append({"input_ids": ids[start:start + length],
                     "sampling_params": {"max_new_tokens": rng.randint(8, 200),
                                         "temperature": 0.0, "ignore_eos": True}})
    return reqs


@pytest.fixture(scope="module")
def runs():
    # Real weights: SGLang's own loader, no --load-format dummy. 1024-token context,
    # so a small KV budget keeps 32 concurrent requests under memory pressure too.
    base = base_args("--model-path", str(PAIR / "target"), "--max-total-tokens", "8000")
    table = configs(base, PAIR / "eagle3")
    # Batch-invariant kernels (upstream's deterministic inference) remove the rounding
    # differences between batch compositions, so the adaptive worker's plain steps must
    # then reproduce the plain server bit for bit, near-ties included. The fp32 LM head
    # removes the ties that bf16 logits create (1.7% of positions are exact ties in bf16).
    det = ["--enable-deterministic-inference", "--enable-fp32-lm-head"]
    add_variant(table, "deterministic", base + det, DEBUG_ENV, ("plain", "threshold-0"))
    # Issue 4's "greedy outputs equal the no-spec server's token for token" needs fp32:
    # in bf16, verify (extend attention, 4 tokens a request) and decode (decode
    # attention) round differently, so even upstream's static EAGLE-3 flips near-ties,
    # with deterministic kernels too (eagle3-deterministic: 70 of 200 requests on the
    # H200). Deterministic inference is what lets fp32 start at all (SGLang's CUDA
    # rmsnorm has no fp32 kernel, its batch-invariant path does). Triton's dots still
    # round fp32 inputs to TF32 (10-bit mantissa) by default: static EAGLE-3 then
    # differed on 5 of 200 requests, every one at a gap of at most 0.0014 nats.
    # TRITON_F32_DEFAULT=ieee keeps them fp32 (own kernel cache: the choice is made
    # at compile time).
    fp32 = base + ["--dtype", "float32", "--enable-deterministic-inference"]
    env32 = {**DEBUG_ENV, "TRITON_F32_DEFAULT": "ieee", "TRITON_CACHE_DIR": "/tmp/triton-cache-f32-ieee"}
    add_variant(table, "fp32", fp32, env32, ("plain", "eagle3", "alternate-1", "threshold-8-ramp"))
    return collect("tiny-pair", table, text_requests(NUM))


def add_variant(table: dict, suffix: str, base: list[str], env: dict, labels) -> None:
    """The suite's configurations ``labels`` on other base flags and environment, as
    ``LABEL-SUFFIX``: same mode flags and load, so only the numerics differ."""
    derived = configs(base, PAIR / "eagle3")
    for label in labels:
        server_args, _, load = derived[label]
        table[f"{label}-{suffix}"] = (server_args, env, load)


def test_static_eagle3_accepts_at_least_two_tokens_per_verify(runs):
    assert runs["eagle3"].error is None, runs["eagle3"].error
    assert runs["eagle3"].accept_length() >= 2.0


def assert_same_outputs(ref, got):
    mismatching = mismatching_requests(ref.ids, got.ids)
    assert not mismatching, f"{len(mismatching)} of {len(ref.ids)} requests differ, first {mismatching[:5]}"


def test_plain_steps_reproduce_plain_server_bit_for_bit_with_deterministic_kernels(runs):
    ref, got = runs["plain-deterministic"], runs["threshold-0-deterministic"]
    assert ref.error is None, ref.error
    assert got.error is None, got.error
    assert got.stats()["spec"] == 0
    assert_same_outputs(ref, got)


@pytest.mark.parametrize("label", ["eagle3-fp32", "alternate-1-fp32", "threshold-8-ramp-fp32"])
def test_greedy_tokens_equal_plain_server_token_for_token_in_fp32(runs, label):
    ref, got = runs["plain-fp32"], runs[label]
    assert ref.error is None, ref.error
    assert got.error is None, got.error
    # Drafts must really be accepted, or equality shows nothing. Alternating every step,
    # each speculative step follows a plain one whose token the draft never saw
    # (draft state is not carried across plain steps yet): little is accepted there.
    assert got.spec_accept_length() >= (1.05 if label.startswith("alternate") else 2.0)
    if not label.startswith("eagle3"):  # both modes ran
        stats = got.stats()
        assert stats["plain"] > 0 and stats["spec"] > 0 and stats["switches"] > 0
    assert_same_outputs(ref, got)
