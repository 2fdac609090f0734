"""The target's two decode modes, each a bundle of resources switched by reference.

With speculation on, SGLang builds the target's decode CUDA graphs in TARGET_VERIFY
mode (``num_draft_tokens`` rows per request) and ``ModelRunner._forward_raw`` sends
every decode batch to whatever ``decode_cuda_graph_runner`` is installed. A plain
decode step therefore needs its own graph set, captured in DECODE mode with one
token per request, and its own attention backend (graph capture binds backend
buffers). ``ModeState.apply`` installs one bundle on the target model runner, as
upstream's ``EAGLEWorkerV2.apply_runtime_state`` does for its step-count states.

While a plain bundle is built and while it runs, the target runner reads
``spec_algorithm == NONE``: the runner, its graphs and its backend then behave
exactly as in a server started without speculation.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from sglang_adaptive.upstream import MODEL_RUNNER_ATTRIBUTES, check_instance, sglang_symbols as up

logger = logging.getLogger(__name__)


class PlainDecodeGraphRunner(up.DecodeCudaGraphRunner):
    """DECODE-mode target graphs (one token per request) inside a speculative server.

    EAGLE-3 drafts from the packed aux hidden states of the target. The plain graphs
    capture them for the last (only) token of every request, whatever the server's
    --return-hidden-states mode, so that a plain step can hand the draft what it
    needs to stay usable.
    """

    def __init__(self, model_runner, *, min_capture_hidden_mode, **kwargs):
        # Set before super().__init__: the base constructor captures right away.
        self._min_capture_hidden_mode = min_capture_hidden_mode
        super().__init__(model_runner, **kwargs)

    # BaseRunner.__init__ assigns return_hidden_states_mode (from the server flags)
    # and DecodeCudaGraphRunner captures with it; the floor acts through it.
    @property
    def return_hidden_states_mode(self):
        return max(self._return_hidden_states_mode, self._min_capture_hidden_mode)

    @return_hidden_states_mode.setter
    def return_hidden_states_mode(self, mode):
        self._return_hidden_states_mode = mode


@dataclass
class ModeState:
    """Everything the target model runner needs for one decode mode."""

    attn_backend: Any
    graph_runner: Any
    spec_algorithm: Any
    capture_hidden_mode: Any

    def apply(self, model_runner) -> None:
        model_runner.attn_backend = self.attn_backend
        model_runner.decode_cuda_graph_runner = self.graph_runner
        model_runner.spec_algorithm = self.spec_algorithm

    @classmethod
    def of_runner(cls, model_runner, capture_hidden_mode) -> ModeState:
        return cls(
            attn_backend=model_runner.attn_backend,
            graph_runner=model_runner.decode_cuda_graph_runner,
            spec_algorithm=model_runner.spec_algorithm,
            capture_hidden_mode=capture_hidden_mode,
        )


@contextlib.contextmanager
def installed(model_runner, state: ModeState):
    """Install ``state`` on the runner for the block, then put back what was there."""
    previous = ModeState.of_runner(model_runner, None)
    state.apply(model_runner)
    try:
        yield
    finally:
        previous.apply(model_runner)


def build_plain_state(model_runner, capture_hidden_mode, *, device, gpu_id,
                      capture: bool = True) -> tuple[ModeState, float, float]:
    """Build the plain bundle; returns it with the GPU memory (GiB) and seconds it took.
    ``capture=False`` leaves out the graphs, as a disabled decode graph backend does."""
    check_instance(model_runner, MODEL_RUNNER_ATTRIBUTES, "ModelRunner instance")
    tic = time.perf_counter()
    before = up.get_available_gpu_memory(device, gpu_id)
    plain = ModeState(
        attn_backend=None,
        graph_runner=None,
        spec_algorithm=up.SpeculativeAlgorithm.NONE,
        capture_hidden_mode=capture_hidden_mode,
    )
    backup_workspace = model_runner.init_new_workspace
    try:
        with installed(model_runner, plain):
            # A new workspace: the verify backend's buffers stay bound to its graphs.
            plain.attn_backend = model_runner._get_attention_backend(init_new_workspace=True)
            model_runner.attn_backend = plain.attn_backend
            if capture and not up.check_cuda_graph_backend(up.Phase.DECODE, up.Backend.DISABLED):
                plain.graph_runner = PlainDecodeGraphRunner(
                    model_runner,
                    min_capture_hidden_mode=capture_hidden_mode,
                    attn_backend=plain.attn_backend,
                    speculative_num_steps=0,
                    speculative_num_draft_tokens=1,
                )
    finally:
        model_runner.init_new_workspace = backup_workspace
    used_gib = before - up.get_available_gpu_memory(device, gpu_id)
    return plain, used_gib, time.perf_counter() - tic


def captured_batch_sizes(state: ModeState) -> list | None:
    runner = state.graph_runner
    return None if runner is None else sorted(runner.capture_bs)
