"""The trained tiny pair on a real GPU: real weights through SGLang's loader, real
acceptance on held-out prompts, and the core-worker suite (suite.py) against it.
On the GPU host (its servers are small: run them side by side):

    ADAPTIVE_GPU_PARALLEL=7 python -m pytest -m gpu test/gpu/test_tiny_pair.py -v
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
from suite import *  # noqa: F401,F403  (the shared tests, collected against this pair)
from suite import base_args, collect, configs

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
    return collect("tiny-pair", configs(base, PAIR / "eagle3"), text_requests(NUM))


def test_static_eagle3_accepts_at_least_two_tokens_per_verify(runs):
    assert runs["eagle3"].error is None, runs["eagle3"].error
    assert runs["eagle3"].accept_length() >= 2.0
