"""--pin-cpus without touching this host's affinities: the core plan, which process gets
which CPUs, and that every thread of a process is moved."""

from __future__ import annotations

import os
import threading

import pytest

from sglang_adaptive.bench import pinning


def ht_siblings(cpu):  # 8 cores, two hardware threads each: cpu i and i + 8
    return {cpu % 8, cpu % 8 + 8}


def test_cpu_lists_read_as_the_kernel_writes_them():
    assert pinning.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert pinning.parse_cpu_list("5") == {5}


def test_cores_group_hardware_threads_and_keep_to_the_usable_cpus():
    cores = pinning.physical_cores(range(16), ht_siblings)
    assert cores == [frozenset({i, i + 8}) for i in range(8)]
    # A container allowed one thread of core 1 only: that core is the one thread.
    assert pinning.physical_cores({0, 8, 1}, ht_siblings) == [frozenset({0, 8}), frozenset({1})]
    assert pinning.physical_cores({0, 1, 2}, lambda c: {c}) == [frozenset({c}) for c in (0, 1, 2)]


def test_schedulers_take_the_last_cores_whole_and_nothing_else_runs_there():
    plan = pinning.make_plan(pinning.physical_cores(range(16), ht_siblings), schedulers=2)
    assert plan.schedulers == (frozenset({6, 14}), frozenset({7, 15}))
    assert plan.rest == frozenset(range(16)) - {6, 14, 7, 15}
    assert "6,14; 7,15" in plan.describe()


def test_too_few_cores_or_no_scheduler_is_refused_with_the_reason():
    with pytest.raises(pinning.PinningError, match="needs 3 physical cores .* may use 2"):
        pinning.make_plan([frozenset({0}), frozenset({1})], schedulers=1)
    with pytest.raises(pinning.PinningError, match="found no scheduler process"):
        pinning.make_plan(pinning.physical_cores(range(16), ht_siblings), schedulers=0)
    # This CI machine has two CPUs: the bench refuses before starting a server.
    with pytest.raises(pinning.PinningError, match="needs 3 physical cores"):
        pinning.Pinner(cpus={0, 1}, siblings_of=lambda c: {c}).check(1)


def test_each_scheduler_gets_its_core_by_rank_and_the_rest_share_the_others():
    plan = pinning.make_plan(pinning.physical_cores(range(16), ht_siblings), schedulers=2)
    procs = [(10, "python -m sglang.launch_server --tp 2"), (12, "sglang::scheduler_TP1"),
             (11, "sglang::scheduler_TP0"), (13, "sglang::detokenizer")]
    cpus = pinning.assign(procs, plan)
    assert cpus == {10: plan.rest, 11: plan.schedulers[0], 12: plan.schedulers[1], 13: plan.rest}
    with pytest.raises(pinning.PinningError, match="planned for 2 scheduler processes, the server runs 1"):
        pinning.assign(procs[:2], plan)


def test_every_thread_of_a_process_is_moved():
    moved, started, stop = {}, threading.Event(), threading.Event()

    def idle():
        started.set()
        stop.wait()

    t = threading.Thread(target=idle)
    t.start()
    started.wait()
    try:
        pinning.pin_process(os.getpid(), frozenset({3}), setaffinity=lambda tid, cpus: moved.setdefault(tid, cpus))
    finally:
        stop.set()
        t.join()
    assert {os.getpid(), t.native_id} <= set(moved) and set(moved.values()) == {frozenset({3})}


def test_the_pinner_plans_from_the_cpus_it_started_with_and_pins_the_client_too():
    pinned = []
    procs = {100: [(100, "python -m sglang.launch_server"), (101, "sglang::scheduler"), (102, "sglang::detokenizer")],
             200: [(200, "python -m sglang.launch_server"), (201, "sglang::scheduler")]}
    pinner = pinning.Pinner(cpus=range(16), siblings_of=ht_siblings, processes=procs.__getitem__,
                            pin=lambda pid, cpus: pinned.append((pid, cpus)))
    plan = pinner.pin_server(100)
    rest = frozenset(range(16)) - {7, 15}
    assert plan.schedulers == (frozenset({7, 15}),) and plan.rest == rest
    assert pinned == [(100, rest), (101, frozenset({7, 15})), (102, rest), (os.getpid(), rest)]
    pinned.clear()
    # The next server gets the same plan, though the bench itself now runs on `rest` only.
    assert pinner.pin_server(200) == plan
    assert pinned == [(200, rest), (201, frozenset({7, 15})), (os.getpid(), rest)]


def test_servers_at_once_each_get_their_own_core():
    pinned = []
    procs = {100 + k: [(100 + k, "python -m sglang.launch_server"), (110 + k, "sglang::scheduler")] for k in range(3)}
    pinner = pinning.Pinner(cpus=range(8), siblings_of=lambda c: {c}, processes=procs.__getitem__,
                            pin=lambda pid, cpus: pinned.append((pid, cpus)), slots=3)
    mine = [pinner.pin_server(100 + k, slot=k) for k in range(3)]
    assert [m.schedulers for m in mine] == [(frozenset({5}),), (frozenset({6}),), (frozenset({7}),)]
    assert {cpus for pid, cpus in pinned if pid in (110, 111, 112)} == {frozenset({c}) for c in (5, 6, 7)}
    assert {cpus for pid, cpus in pinned if pid not in (110, 111, 112)} == {frozenset(range(5))}
    with pytest.raises(pinning.PinningError, match="needs 5 physical cores"):
        pinning.Pinner(cpus=range(4), siblings_of=lambda c: {c}, slots=3).check(1)
