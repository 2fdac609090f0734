from types import SimpleNamespace as NS

import pytest

from sglang_adaptive.plain_graph import ModeState, PlainDecodeGraphRunner, installed


def test_mode_state_is_switched_by_reference_and_restored():
    runner = NS(attn_backend="verify-backend", decode_cuda_graph_runner="verify-graphs",
                spec_algorithm="EAGLE3")
    plain = ModeState("plain", "plain-backend", "decode-graphs", "NONE", None)
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
