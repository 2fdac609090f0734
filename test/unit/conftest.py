"""Unit tests run on CPU against the installed, pinned SGLang (no mocks of its classes).

SGLang's plugin loading is process-wide and idempotent, so the hooks are applied
once per test session, through SGLang's own ``load_plugins()``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "benchmark" / "models" / "llama3-8b"
DRAFT = REPO / "benchmark" / "models" / "llama3-8b-eagle3"


def eagle3_argv(*extra: str) -> list[str]:
    """A CPU-resolvable EAGLE-3 command line on the shipped dummy configs."""
    return [
        "--device", "cpu", "--model-path", str(TARGET), "--load-format", "dummy",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(DRAFT),
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", *extra,
    ]


@pytest.fixture(scope="session")
def plugins():
    from sglang.srt.plugins import load_plugins

    load_plugins()


@pytest.fixture(scope="session")
def parse(plugins):
    """ServerArgs from a command line, through SGLang's own parser and our hooks."""
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args


@pytest.fixture()
def runtime_args(parse):
    """Install ServerArgs in SGLang's runtime context, as a scheduler process does."""
    from sglang.srt.runtime_context import get_context

    def install(*extra: str):
        server_args = parse(eagle3_argv(*extra))
        get_context().set_server_args(server_args)
        return server_args

    return install


@pytest.fixture(autouse=True)
def _reset_controller():
    from sglang_adaptive import controller

    controller.reset()
    yield
    controller.reset()


def assert_greedy_generation_repeats(model, tok) -> None:
    """A checkpoint transformers loads generates the same 12 greedy tokens twice, from a
    prompt its tokenizer round-trips."""
    import torch

    ids = tok("def main():\n    ", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=1)
    again = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=1)
    assert torch.equal(out, again) and out.shape[1] == ids.shape[1] + 12
    assert tok.decode(ids[0]) == "def main():\n    "



@pytest.fixture()
def no_number_through_an_index(monkeypatch):
    """Fail where the package assigns a Python number through a tensor index
    (``t[idx] = -1``). On CUDA that copies the number to the device with a blocking
    copy (``index_put_`` moves a CPU scalar value to the tensor's device), so the host
    waits for every kernel queued on the stream: a speculative prefill waited ~12 ms
    for the decode step in flight (benchmark/results/2026-12-04-h200-prefill-sync).
    ``index_fill_`` or ``fill_`` take the number as a kernel argument instead."""
    import torch

    import sglang_adaptive

    # The package as imported: the mutants' runs import a copy from elsewhere.
    package_dir = str(Path(sglang_adaptive.__file__).parent)
    original = torch.Tensor.__setitem__

    def checked(self, index, value):
        caller = sys._getframe(1).f_code.co_filename
        if isinstance(value, (bool, int, float)) and caller.startswith(package_dir):
            raise AssertionError(
                f"{caller}:{sys._getframe(1).f_lineno} assigns the Python number {value!r} through "
                "a tensor index: a blocking host-to-device copy on CUDA (use index_fill_ or fill_)")
        return original(self, index, value)

    monkeypatch.setattr(torch.Tensor, "__setitem__", checked)
