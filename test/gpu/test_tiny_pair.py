"""The trained tiny pair on a real GPU: real weights through SGLang's loader,
real acceptance, and outputs equal to the plain server in every mode.

    python -m pytest -m gpu test/gpu/test_tiny_pair.py -v
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
from pathlib import Path

import pytest

from sglang_adaptive.testing import COMMON_ARGS, eagle3_args, first_mismatch, run_configs

pytestmark = pytest.mark.gpu

PAIR = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-pair"
NUM = int(os.environ.get("ADAPTIVE_GPU_NUM", "200"))
MAX_BS = 32


def text_requests(n: int, seed: int = 1) -> list[dict]:
    """Prompts cut from standard-library sources (real text the pair was trained on
    the like of), mixed prompt and output lengths, greedy."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(PAIR / "target" / "tokenizer.json"))
    root = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join(p.read_text(errors="ignore") for p in sorted(root.glob("*.py"))[-40:])
    ids = tok.encode(text).ids
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        length = rng.randint(16, 400)
        start = rng.randrange(0, len(ids) - length)
        reqs.append({"input_ids": ids[start:start + length],
                     "sampling_params": {"max_new_tokens": rng.randint(8, 200),
                                         "temperature": 0.0, "ignore_eos": True}})
    return reqs


def _base():
    return COMMON_ARGS + ["--model-path", str(PAIR / "target"), "--max-running-requests", str(MAX_BS),
                          "--cuda-graph-max-bs", str(MAX_BS), "--decode-log-interval", "1",
                          "--skip-server-warmup"]


def _spec(*extra):
    return _base() + eagle3_args(PAIR / "eagle3") + list(extra)


CONFIGS = {
    "plain": (_base(), {}, 16),
    "eagle3": (_spec(), {}, 16),
    "alternate-1": (_spec("--speculative-switch-policy", "alternate",
                          "--speculative-switch-alternate-period", "1"), {}, 16),
    "threshold-4-ramp": (_spec("--speculative-disable-batch-threshold", "4"), {},
                         [(0, 1), (20, 4), (60, 16)]),
}


@pytest.fixture(scope="module")
def runs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    out = run_configs(CONFIGS, text_requests(NUM))
    summary = {label: {"error": run.error} for label, run in out.items()}
    if out["eagle3"].error is None:
        summary["eagle3"]["accept_length"] = round(out["eagle3"].accept_length(), 3)
    path = os.path.join(os.environ.get("OUT", "/tmp"), "tiny-pair-summary.json")
    with open(path, "w") as f:
        json.dump({"num_requests": NUM, "configs": summary}, f, indent=1)
    return out


def test_static_eagle3_accepts_at_least_two_tokens_per_verify(runs):
    assert runs["eagle3"].error is None, runs["eagle3"].error
    assert runs["eagle3"].accept_length() >= 2.0


@pytest.mark.parametrize("label", [k for k in CONFIGS if k != "plain"])
def test_greedy_tokens_equal_plain_server(runs, label):
    assert runs["plain"].error is None, runs["plain"].error
    assert runs[label].error is None, runs[label].error
    mismatch = first_mismatch(runs["plain"].ids, runs[label].ids)
    assert mismatch is None, f"first mismatch (request, token, len): {mismatch}"
