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
