"""AdaptiveEAGLEWorker on the users' model shape: a Kimi-K2.5-shaped MLA + MoE pair
(``benchmark/models/k25-tp2``, dummy weights) at tensor parallel 2, with the users'
flags, flashinfer and triton attention, with and without allreduce fusion.

Dummy weights show what they can (see suite.py): graph replays per mode on every
rank, the modes each configuration claims, the same mode on every rank, the plain
KV reserve, healthy servers, and what the plain graph set costs in memory. Needs 2
GPUs; skips (or fails under ADAPTIVE_GPU_REQUIRED=1) otherwise. On the GPU host:

    ADAPTIVE_GPU_PARALLEL=3 python -m pytest -m gpu test/gpu/test_k25_shape.py -v
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from suite import *  # noqa: F401,F403  (the shared tests, collected against this pair)
from suite import DEBUG_ENV, assert_modes, base_args, collect, configs, require_gpu

from sglang_adaptive.testing import make_requests, without_flags

pytestmark = pytest.mark.gpu

MODELS = Path(__file__).resolve().parents[2] / "benchmark" / "models"
TARGET, DRAFT = MODELS / "k25-tp2", MODELS / "k25-tp2-eagle3"
TP = 2
NUM = int(os.environ.get("ADAPTIVE_GPU_NUM", "64"))
# The users' flags besides the model and speculation (their --tp 8 is --tp 2 here).
USERS_FLAGS = ["--disable-custom-all-reduce", "--enable-flashinfer-allreduce-fusion"]
# SGLang 0.5.17 turns the fusion on by itself for DeepseekV3 at TP > 1 on SM90
# (`_flashinfer_allreduce_fusion_auto_enable`); only this flag turns it off.
NO_FUSION_FLAGS = ["--disable-custom-all-reduce", "--enforce-disable-flashinfer-allreduce-fusion"]
FUSION_LINE = "FlashInfer AllReduce Fusion enabled"
# (attention backend, allreduce fusion) combinations served. The fusion is a
# flashinfer communication kernel, independent of the attention backend.
VARIANTS = {"flashinfer-fusion": ("flashinfer", True), "flashinfer": ("flashinfer", False),
            "triton": ("triton", False)}
# alternate-1 exercises every transition in every variant; threshold-0, the
# always-plain reserve, runs on the users' flags.
MODES = ("alternate-1",)
USERS_MODES = ("alternate-1", "threshold-0")
PLAIN_GRAPH_LINE = re.compile(r"AdaptiveEAGLE plain DECODE set built: .*mem=([\d.]+) GB")


def base(backend: str, fusion: bool) -> list[str]:
    # suite.base_args with this pair's own attention backend and a smaller memory
    # fraction (three TP 2 servers share each GPU).
    common = without_flags(base_args("--model-path", str(TARGET), "--load-format", "dummy", "--tp", str(TP),
                                     "--max-total-tokens", "16000", "--context-length", "4096"),
                           ("--attention-backend", "--mem-fraction-static"))
    return ["--attention-backend", backend, "--mem-fraction-static", "0.6", *common,
            *(USERS_FLAGS if fusion else NO_FUSION_FLAGS)]


def labelled(variant: str, label: str) -> str:
    return label if variant == "flashinfer-fusion" else f"{label}@{variant}"


@pytest.fixture(scope="module")
def runs():
    require_gpu()
    import torch

    if torch.cuda.device_count() < TP:
        if os.environ.get("ADAPTIVE_GPU_REQUIRED") == "1" and os.environ.get("ADAPTIVE_REQUIRE_TP2") == "1":
            pytest.fail(f"needs {TP} GPUs for tensor parallel {TP}; {torch.cuda.device_count()} visible")
        pytest.skip(f"needs {TP} GPUs for tensor parallel {TP}; {torch.cuda.device_count()} visible")
    table = {}
    for variant, (backend, fusion) in VARIANTS.items():
        modes = USERS_MODES if variant == "flashinfer-fusion" else MODES
        for label, entry in configs(base(backend, fusion), DRAFT, labels=modes).items():
            table[labelled(variant, label)] = entry
    # Upstream alone on the same flags: where a combination fails without speculation
    # too, it is the host's, not the worker's.
    table["plain"] = (base("flashinfer", True), DEBUG_ENV, 32)
    table["eagle3"] = (configs(base("flashinfer", True), DRAFT, labels=("eagle3",))["eagle3"][0], DEBUG_ENV, 16)
    out = collect("k25-tp2", table, make_requests(NUM, vocab=163840, in_range=(16, 512), out_range=(16, 96)))
    summary = {label: {"problems": run.problems(), "plain_graph_gib": plain_graph_gib(run.log)}
               for label, run in out.items()}
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "k25-tp2-startup.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return out


def plain_graph_gib(log: str) -> float | None:
    m = PLAIN_GRAPH_LINE.search(log)
    return float(m.group(1)) if m else None


def test_upstream_serves_the_users_flags_without_speculation(runs):
    runs["plain"].check()
    runs["eagle3"].check()


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("label", MODES)
def test_every_backend_and_fusion_variant_serves_both_modes(runs, variant, label):
    name = labelled(variant, label)
    stats = assert_modes(label, runs[name])
    per_rank = runs[name].stats_per_rank()
    assert sorted(per_rank) == list(range(TP)), f"mode counters of ranks {sorted(per_rank)}"
    assert all(s["plain"] == stats["plain"] and s["spec"] == stats["spec"] for s in per_rank.values())
    for rank in range(TP):
        assert runs[name].replays("DECODE", rank=rank) == stats["plain"]
        assert runs[name].replays("TARGET_VERIFY", rank=rank) == stats["spec"]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_allreduce_fusion_is_on_exactly_where_asked(runs, variant):
    log = runs[labelled(variant, "alternate-1")].check().log
    assert (FUSION_LINE in log) == VARIANTS[variant][1]


def test_plain_graph_memory_is_reported(runs):
    gib = plain_graph_gib(runs["alternate-1"].check().log)
    assert gib is not None and gib < 4.0, gib
