"""The host-time diagnostic: every target exists in the pinned release, and a wrapped
call lands in the bucket of the batch being run. In a subprocess: installing wraps
SGLang classes for the rest of the process."""

import importlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import json, sys
from types import SimpleNamespace as NS
from sglang_adaptive import hosttime
missing = hosttime.install(sys.argv[1])
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.forward_batch_info import ForwardMode
batch = NS(forward_mode=ForwardMode.DECODE, reqs=[1, 2, 3])
import gc
hosttime._state["bs"] = "decode-3"
gc.collect(1)  # a pause while the scheduler runs a decode batch of 3
hosttime._state["last_dump"] = -1e9
try:
    Scheduler.run_batch(NS(), batch)
except Exception:
    pass  # the stand-in scheduler lacks everything; the wrapper still counts the call
print(json.dumps(missing))
"""


def test_every_target_exists_and_calls_are_bucketed_by_decode_batch_size(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    (dump,) = tmp_path.glob("hosttime-*.json")
    cell = json.loads(dump.read_text())["buckets"]["decode-3"]["sglang.srt.managers.scheduler:Scheduler.run_batch"]
    assert cell["calls"] == 1 and cell["s"] >= 0 and cell["max_s"] == cell["s"]
    gc_cell = json.loads(dump.read_text())["buckets"]["decode-3"]["gc.gen1"]
    assert gc_cell["calls"] >= 1 and gc_cell["s"] > 0 and 0 < gc_cell["max_s"] <= gc_cell["s"]


def _benchmark_script(name: str):
    """A module of benchmark/ (scripts, not a package)."""
    folder = str(Path(__file__).resolve().parents[2] / "benchmark")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def test_the_report_leaves_out_one_off_calls():
    """A kernel compiled on first use made one call 8.8 s: per iteration it would read as
    2.9 ms a step (benchmark/results/2026-12-02-h200-goodput-host-time)."""
    hosttime_report = _benchmark_script("hosttime_report")

    run_batch = hosttime_report.RUN_BATCH
    cells = {"decode-1": {run_batch: {"calls": 4, "s": 8.804, "max_s": 8.771},
                          "m:init": {"calls": 4, "s": 0.004, "max_s": 0.0011}}}
    iterations, ms, one_offs = hosttime_report.per_iteration(cells, "decode-1")
    assert iterations == 4 and one_offs == {run_batch: 8.771}
    assert abs(ms[run_batch] - 8.25) < 1e-6 and abs(ms["m:init"] - 1.0) < 1e-6
    assert hosttime_report.per_iteration(cells, "decode-8") == (0, {}, {})


def test_controller_cost_times_every_call_of_a_steady_speculating_server():
    """benchmark/controller_cost.py claims the goodput policy speculates on every
    measured batch (the tiny pair's c=1) and times each call the scheduler makes."""
    controller_cost = _benchmark_script("controller_cost")

    for waits in (False, True):
        out = controller_cost.measure(batch=1, steps=300, waits=waits)
        assert out["spec_share"] == 1.0 and out["waits"] is waits
        assert set(out["us_per_batch"]) == {"context", "speculate", "kv_reserve", "on_prepare", "on_verify"}
        assert out["us_total"] == pytest.approx(sum(out["us_per_batch"].values()))
    # It silences the controller's log lines while it runs, then leaves logging as it was.
    assert logging.root.manager.disable == logging.NOTSET
    logging.disable(logging.WARNING)
    try:
        controller_cost.measure(batch=1, steps=10)
        assert logging.root.manager.disable == logging.WARNING
    finally:
        logging.disable(logging.NOTSET)


def test_hook_cost_drives_the_hooks_of_a_speculating_server_and_restores_the_controller():
    """benchmark/hook_cost.py claims both servers speculate (goodput after its
    explorations) through the scheduler hooks, and times goodput without each part."""
    from sglang_adaptive import controller as ctl

    hook_cost = _benchmark_script("hook_cost")
    before = ctl.current()
    out = hook_cost.measure(steps=300, repeat=1)
    assert out["spec_share"]["never-plain"] == 1.0 and out["spec_share"]["goodput"] >= 0.99, out
    assert set(out["goodput_without"]) == set(hook_cost.PARTS)
    assert ctl.current() is before and logging.root.manager.disable == logging.NOTSET
