"""The host-time diagnostic: every target exists in the pinned release, and a wrapped
call lands in the bucket of the batch being run. In a subprocess: installing wraps
SGLang classes for the rest of the process."""

import importlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
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


def test_hook_cost_evicts_before_each_timed_batch_only(monkeypatch):
    """--evict-mb copies its buffer once before every timed batch, outside the time."""
    hook_cost = _benchmark_script("hook_cost")
    copies = []
    real_bytes = bytes

    def counting_bytes(x=b""):
        if isinstance(x, bytearray) and len(x) == 1 << 20:
            copies.append(len(x))
        return real_bytes(x)

    monkeypatch.setattr(hook_cost, "bytes", counting_bytes, raising=False)  # a global shadows the builtin
    out = hook_cost.measure(steps=40, repeat=1, parts=False, evict_mb=1)
    assert len(copies) == 2 * 40  # goodput and never-plain, 40 timed batches each
    assert out["evict_mb"] == 1 and out["spec_share"]["never-plain"] == 1.0
    assert all(us > 0 for us in out["us_per_batch"].values())


def test_hook_cost_counts_opcodes_and_puts_back_the_tracer_it_found():
    """--opcodes compares two versions exactly: the same loop counts the same; goodput
    runs more Python than never-plain; a coverage tracer keeps running after it."""
    hook_cost = _benchmark_script("hook_cost")
    before = sys.gettrace()
    first, second = hook_cost.opcodes(steps=200), hook_cost.opcodes(steps=200)
    assert first == second and sys.gettrace() is before
    assert first["goodput"]["opcodes"] > first["never-plain"]["opcodes"] > 100, first
    assert first["never-plain"]["calls"] > 10
    plain = hook_cost.opcodes(steps=200, plain=True)  # no draft accepted: goodput plain
    assert set(plain) == {"goodput", "always-plain"} and plain["goodput"]["opcodes"] > plain["always-plain"]["opcodes"]
    assert sys.gettrace() is before


def _fake_thread(proc: Path, pid: int, tid: int, name: str, ticks: tuple[int, int], switches: int,
                 processor: int = 3) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    # /proc/PID/task/TID/stat: fields 3-52 after the name; utime 14, stime 15, processor 39.
    fields = ["S"] + ["0"] * 49
    fields[14 - 3], fields[15 - 3], fields[39 - 3] = str(ticks[0]), str(ticks[1]), str(processor)
    (task / "stat").write_text(f"{tid} ({name}) " + " ".join(fields) + "\n")
    (task / "status").write_text(
        f"Name:\t{name}\nvoluntary_ctxt_switches:\t5\nnonvoluntary_ctxt_switches:\t{switches}\n")


def test_thread_sampler_reports_each_threads_cpu_per_interval(tmp_path):
    """benchmark/thread_sampler.py: the interval's CPU seconds and involuntary switches of
    every thread of the matching processes, from the second sample of a process on;
    names with spaces and parentheses, threads that start later, processes that do not
    match."""
    sampler_mod = _benchmark_script("thread_sampler")
    tick = sampler_mod.TICK_S
    proc = tmp_path / "proc"
    (proc / "100").mkdir(parents=True)
    (proc / "100" / "cmdline").write_bytes(b"sglang::scheduler\0")
    (proc / "100" / "stat").write_text("100 (sglang::schedul) S 90 1 1 0\n")  # its parent: 90
    (proc / "90").mkdir()
    (proc / "90" / "cmdline").write_bytes(b"python\0-m\0sglang.launch_server\0--port\x0030010\0")
    (proc / "200").mkdir()
    (proc / "200" / "cmdline").write_bytes(b"python\0-m\0bench\0")
    (proc / "self").mkdir()
    (proc / str(os.getpid())).mkdir()  # the sampler itself: its --match holds the text
    (proc / str(os.getpid()) / "cmdline").write_bytes(b"python\0thread_sampler.py\0--match\0sglang::scheduler\0")
    _fake_thread(proc, os.getpid(), os.getpid(), "python", (1, 0), 0)
    _fake_thread(proc, 100, 100, "sglang::schedul", (500, 100), 7)
    _fake_thread(proc, 100, 101, "ZMQbg/IO (1)", (10, 0), 0)
    _fake_thread(proc, 200, 200, "python", (900, 0), 0)
    times = iter([1000.0, 1000.5, 1000.8, 1001.0])
    sampler = sampler_mod.Sampler(("sglang::scheduler",), proc, clock=lambda: next(times))
    assert sampler.sample() == []  # the baseline
    _fake_thread(proc, os.getpid(), os.getpid(), "python", (9, 0), 3)
    _fake_thread(proc, 100, 100, "sglang::schedul", (540, 105), 9)
    _fake_thread(proc, 100, 102, "pt_autograd_0", (3, 0), 1, processor=5)
    (line,) = sampler.sample()
    assert line["pid"] == 100 and line["t"] == 1000.5 and line["port"] == "30010"
    assert line["threads"] == {"main": ["sglang::schedul", round(45 * tick, 3), 2, 3],
                               "102": ["pt_autograd_0", round(3 * tick, 3), 1, 5]}  # 101 did not run
    assert sampler.sample() == []  # nothing ran
    _fake_thread(proc, 100, 101, "ZMQbg/IO (1)", (30, 0), 4)
    (line,) = sampler.sample()
    assert line["threads"] == {"101": ["ZMQbg/IO (1)", round(20 * tick, 3), 4, 3]}
    # A second text matches more processes: the bench's client beside the schedulers.
    both = sampler_mod.Sampler(("sglang::scheduler", "-m\0bench"), proc)
    assert sampler_mod.matching_pids(both.match, proc) == [100]  # NUL-separated words are joined by spaces
    assert sampler_mod.matching_pids(("sglang::scheduler", "-m bench"), proc) == [100, 200]
    (proc / "90" / "stat").write_text("90 (python) S 1 1 1 0\n")
    assert sampler_mod.server_port(90, proc) == "30010"  # launch_server itself
    (proc / "200" / "stat").write_text("200 (python) S 1 1 1 0\n")
    assert sampler_mod.server_port(200, proc) is None  # the bench: no --port, nor has its parent
    summary = sampler_mod.summarize(
        [{"t": 1000.5, "pid": 100, "port": "30010", "threads": {"main": ["s", 0.4, 2, 3], "7": ["a", 0.1, 0, 1]}},
         {"t": 1000.9, "pid": 100, "port": "30010", "threads": {"main": ["s", 0.3, 0, 3], "8": ["b", 0.2, 1, 2]}}])
    (cell,) = summary["port 30010, pid 100"].values()
    assert cell == {"main_cpu_s": 0.7, "others_cpu_s": 0.3, "busiest": "b"}


def test_thread_sampler_reads_the_kernels_own_fields():
    """The fields it reads are the kernel's utime, stime and processor, not neighbours
    of them: a third of a second spun on this thread shows as about that much CPU time,
    on a CPU this process may use."""
    sampler_mod = _benchmark_script("thread_sampler")
    tid = threading.get_native_id()
    me = Path("/proc") / str(os.getpid()) / "task" / str(tid)
    allowed = os.sched_getaffinity(tid)
    # On the highest CPU it may use: not 0, which the zeros of neighbouring fields read as.
    os.sched_setaffinity(tid, {max(allowed)})
    try:
        before = sampler_mod.read_thread(me)
        stop = time.monotonic() + 0.35
        while time.monotonic() < stop:
            pass
        after = sampler_mod.read_thread(me)
    finally:
        os.sched_setaffinity(tid, allowed)
    assert 0.25 <= after[1] - before[1] <= 0.6
    assert after[3] == max(allowed)
    assert sampler_mod.read_thread(me.parent / "999999999") is None
