import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))
from profile_decode import summarise  # noqa: E402


def test_summary_separates_busy_time_from_stalls(tmp_path):
    kernel = lambda name, ts, dur: {"cat": "kernel", "name": name, "ts": ts, "dur": dur}  # noqa: E731
    events = [
        kernel("gemm", 0, 40), kernel("attn", 30, 30),  # overlapping: busy 0..60
        kernel("gemm", 100, 50),  # idle 60..100 (a stall), busy 100..150
        {"name": "cudaGraphLaunch", "ts": 0, "cat": "cuda_runtime"},
        {"name": "cudaGraphLaunch", "ts": 100, "cat": "cuda_runtime"},
    ]
    path = tmp_path / "x.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = summarise(str(path))
    assert s["window_ms"] == 0.15
    assert s["gpu_busy_share"] == round(110 / 150, 4)
    assert s["kernel_time_ms"] == 0.12
    assert s["graph_launches"] == 2 and s["mean_launch_gap_ms"] == 0.1
    assert list(s["top_kernels_ms"]) == ["gemm", "attn"]


def test_batches_split_by_kind_with_their_waits_and_gpu_time():
    from profile_decode import per_batch

    def py(name, ts, dur, tid=1):
        return {"cat": "python_function", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}

    def rt(name, ts, dur, corr=None):
        return {"cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
                "args": {"correlation": corr}}

    def kernel(ts, dur, corr):
        return {"cat": "kernel", "name": "k", "ts": ts, "dur": dur, "args": {"correlation": corr}}

    run = "sglang/srt/managers/scheduler.py(10): run_batch"
    events = [
        # an extend: a 2 ms wait inside the attention backend's metadata, one kernel of 3 ms
        py(run, 0, 10_000),
        py("sglang/srt/layers/attention/triton_backend.py(5): forward_extend", 1_000, 5_000),
        py("sglang/srt/layers/attention/triton_backend.py(9): init_forward_metadata", 1_000, 3_000),
        rt("cudaMemcpyAsync", 1_500, 2_000), rt("cudaLaunchKernel", 4_000, 10, corr=7),
        kernel(6_000, 3_000, 7),
        # a plain decode of the adaptive worker: one graph, no wait
        py(run, 20_000, 1_000), py("sglang_adaptive/worker.py(3): _forward_plain", 20_100, 800),
        rt("cudaGraphLaunch", 20_200, 50, corr=8), kernel(20_500, 400, 8),
        # another thread's run_batch-like frame is not the launching thread's
        py(run, 30_000, 5, tid=2),
    ]
    b = per_batch(events, [e for e in events if e["cat"] == "kernel"], top=5)
    assert set(b) == {"extend", "decode-plain"}
    ext = b["extend"]
    assert ext["iterations"] == 1 and ext["median_host_ms"] == 10.0 and ext["median_gpu_ms"] == 3.0
    assert ext["median_gpu_lag_ms"] == 6.0 and ext["median_wait_ms"] == 2.0
    assert ext["waits_total_ms"] == {"triton_backend.py:init_forward_metadata cudaMemcpyAsync": 2.0}
    assert ext["host_ms_per_iteration"] == {"triton_backend.py:forward_extend": 5.0,
                                            "triton_backend.py:init_forward_metadata": 3.0}
    assert ext["calls_per_iteration"] == {"triton_backend.py:forward_extend": 1,
                                          "triton_backend.py:init_forward_metadata": 1}
    dec = b["decode-plain"]
    assert dec["median_gpu_ms"] == 0.4 and dec["median_wait_ms"] == 0.0 and dec["waits_total_ms"] == {}
