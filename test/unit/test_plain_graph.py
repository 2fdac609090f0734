from types import SimpleNamespace as NS

import pytest

from sglang_adaptive.plain_graph import ModeState, PlainDecodeGraphRunner, captured_batch_sizes, installed


def test_mode_state_is_switched_by_reference_and_restored():
    runner = NS(attn_backend="verify-backend", decode_cuda_graph_runner="verify-graphs",
                spec_algorithm="EAGLE3")
    plain = ModeState("plain-backend", "decode-graphs", "NONE", None)
    with installed(runner, plain):
        assert (runner.attn_backend, runner.decode_cuda_graph_runner, runner.spec_algorithm) == (
            "plain-backend", "decode-graphs", "NONE")
    assert (runner.attn_backend, runner.decode_cuda_graph_runner, runner.spec_algorithm) == (
        "verify-backend", "verify-graphs", "EAGLE3")
    with pytest.raises(RuntimeError), installed(runner, plain):
        raise RuntimeError("a failing plain forward")
    assert runner.decode_cuda_graph_runner == "verify-graphs"


@pytest.mark.parametrize("server_mode, floor, captured", [
    ("NULL", "LAST", "LAST"),   # EAGLE-3: aux states of the token, whatever the server asks
    ("FULL", "LAST", "FULL"),   # --return-hidden-states keeps its wider capture
    ("NULL", "NULL", "NULL"),   # EAGLE (no aux states needed)
])
def test_plain_graphs_capture_at_least_the_floor(server_mode, floor, captured):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode as M

    runner = PlainDecodeGraphRunner.__new__(PlainDecodeGraphRunner)
    runner._min_capture_hidden_mode = M[floor]
    runner.return_hidden_states_mode = M[server_mode]  # what BaseRunner.__init__ assigns
    assert runner.return_hidden_states_mode == M[captured]


class FakeTargetRunner:
    """A target ModelRunner as build_plain_state sees it (upstream.MODEL_RUNNER_ATTRIBUTES)."""

    def __init__(self, spec_algorithm, fail_backend=False):
        self.attn_backend = "verify-backend"
        self.decode_cuda_graph_runner = "verify-graphs"
        self.spec_algorithm = spec_algorithm
        self.init_new_workspace = False
        self.fail_backend = fail_backend
        self.backend_calls = []

    def _get_attention_backend(self, init_new_workspace=False):
        # Upstream leaves the flag set on the runner; build_plain_state puts it back.
        self.init_new_workspace = init_new_workspace
        self.backend_calls.append((init_new_workspace, self.spec_algorithm))
        if self.fail_backend:
            raise RuntimeError("backend failed")
        return "plain-backend"


@pytest.fixture()
def build(monkeypatch):
    """build_plain_state with upstream's graph capture and GPU memory query recorded."""
    from sglang_adaptive import plain_graph
    from sglang_adaptive.upstream import sglang_symbols as up

    calls = NS(captures=[], memory=[], backend_checks=[], disabled=False)
    free_gib = iter([80.0, 78.5])

    def capture(self, model_runner, **kwargs):
        # What DecodeCudaGraphRunner.__init__ sees when it captures.
        calls.captures.append(dict(kwargs, floor=self._min_capture_hidden_mode,
                                   runner_algorithm=model_runner.spec_algorithm,
                                   runner_backend=model_runner.attn_backend))
        self.return_hidden_states_mode = up.CaptureHiddenMode.NULL  # as BaseRunner assigns
        self.capture_bs = [8, 1, 4, 2]

    def memory(device, gpu_id):
        calls.memory.append((device, gpu_id))
        return next(free_gib)

    def backend_check(phase, backend):
        calls.backend_checks.append((phase, backend))
        return calls.disabled

    monkeypatch.setattr(up.DecodeCudaGraphRunner, "__init__", capture)
    monkeypatch.setattr(up, "get_available_gpu_memory", memory)
    monkeypatch.setattr(up, "check_cuda_graph_backend", backend_check)

    def run(runner, disabled=False, capture=True):
        calls.disabled = disabled
        return plain_graph.build_plain_state(runner, up.CaptureHiddenMode.LAST,
                                             device="cuda", gpu_id=3, capture=capture)

    return NS(run=run, calls=calls, up=up)


def assert_runner_restored(runner, up):
    assert runner.attn_backend == "verify-backend"
    assert runner.decode_cuda_graph_runner == "verify-graphs"
    assert runner.spec_algorithm == up.SpeculativeAlgorithm.EAGLE3
    assert runner.init_new_workspace is False


def test_plain_state_captures_one_token_decode_graphs_on_a_new_backend(build):
    up = build.up
    runner = FakeTargetRunner(up.SpeculativeAlgorithm.EAGLE3)
    state, used_gib, seconds = build.run(runner)

    # A new workspace, created while the runner reads like a non-speculative server.
    assert runner.backend_calls == [(True, up.SpeculativeAlgorithm.NONE)]
    assert build.calls.backend_checks == [(up.Phase.DECODE, up.Backend.DISABLED)]
    assert build.calls.captures == [dict(
        attn_backend="plain-backend", speculative_num_steps=0, speculative_num_draft_tokens=1,
        floor=up.CaptureHiddenMode.LAST, runner_algorithm=up.SpeculativeAlgorithm.NONE,
        runner_backend="plain-backend")]
    assert isinstance(state.graph_runner, PlainDecodeGraphRunner)
    # The EAGLE-3 floor lifts the server's NULL capture for the plain graphs.
    assert state.graph_runner.return_hidden_states_mode == up.CaptureHiddenMode.LAST
    assert (state.attn_backend, state.spec_algorithm, state.capture_hidden_mode) == (
        "plain-backend", up.SpeculativeAlgorithm.NONE, up.CaptureHiddenMode.LAST)
    assert captured_batch_sizes(state) == [1, 2, 4, 8]
    assert build.calls.memory == [("cuda", 3), ("cuda", 3)]
    assert used_gib == pytest.approx(1.5) and seconds >= 0
    assert_runner_restored(runner, up)


@pytest.mark.parametrize("disabled, capture", [(True, True), (False, False)])
def test_plain_state_without_decode_graphs(build, disabled, capture):
    """With the decode CUDA graph backend disabled, or no capture asked for (the
    backend-only diagnostic), the plain bundle is backend-only."""
    up = build.up
    runner = FakeTargetRunner(up.SpeculativeAlgorithm.EAGLE3)
    state, used_gib, _ = build.run(runner, disabled=disabled, capture=capture)
    assert build.calls.captures == []
    assert state.graph_runner is None and state.attn_backend == "plain-backend"
    assert captured_batch_sizes(state) is None
    assert used_gib == pytest.approx(1.5)
    assert_runner_restored(runner, up)


def test_plain_state_build_failure_restores_the_runner(build):
    up = build.up
    runner = FakeTargetRunner(up.SpeculativeAlgorithm.EAGLE3, fail_backend=True)
    with pytest.raises(RuntimeError, match="backend failed"):
        build.run(runner)
    assert build.calls.captures == []
    assert_runner_restored(runner, up)


def test_plain_state_checks_the_runner_before_touching_it(build):
    from sglang_adaptive.upstream import UpstreamDriftError

    runner = NS(attn_backend="verify-backend", decode_cuda_graph_runner="verify-graphs",
                spec_algorithm="EAGLE3", _get_attention_backend=lambda **kw: "plain-backend")
    with pytest.raises(UpstreamDriftError, match=r"ModelRunner instance\.init_new_workspace does not exist"):
        build.run(runner)
    assert build.calls.memory == [] and runner.attn_backend == "verify-backend"
