"""Beacons: written in-process, read from outside without locks, cheap per update."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import titan.beacon as beacon
from titan.beacon import Beacon, read_beacon, request_dump, scan_beacons


def test_phases_steps_and_collectives_are_visible_to_a_reader(tmp_path):
    b = Beacon(tmp_path / "n.local0.bcn", rank=3, local_rank=1, world=4, attempt=2, node="n1")
    s = read_beacon(b.path)
    assert (s.rank, s.local_rank, s.world, s.attempt, s.node, s.pid) == (3, 1, 4, 2, "n1", os.getpid())
    assert s.phase == "setup", f"expected the pre-step phase 'setup', saw {s.phase!r}"
    b.step_begin(1)
    with b.phase("data"):
        assert read_beacon(b.path).phase == "data"
        with b.phase("inner"):
            assert read_beacon(b.path).phase == "inner"
        assert read_beacon(b.path).phase == "data"
    b.collective_issued(0)
    b.collective_issued(0)
    b.collective_done(0)
    b.collective_issued(2)
    b.step_end(1)
    s = read_beacon(b.path)
    assert s.phase == "idle" and s.step == 1
    assert s.issued[:3] == [2, 0, 1] and s.completed[0] == 1, f"seen issued={s.issued} completed={s.completed}"
    assert [p for p, _ in s.phase_ring] == ["inner", "data"]
    assert len(s.step_ring) == 1 and s.step_ring[0][0] == 1 and s.step_ring[0][1] > 0, s.step_ring
    assert not s.done
    b.close()
    assert read_beacon(b.path).done


def test_compute_time_counts_data_forward_optimizer_not_backward(tmp_path):
    b = Beacon(tmp_path / "x.bcn")
    b.step_begin(1)
    with b.phase("forward"):
        time.sleep(0.02)
    with b.phase("backward"):
        time.sleep(0.05)
    b.step_end(1)
    step, compute_ns, step_ns = read_beacon(b.path).step_ring[-1]
    assert 0.015 < compute_ns / 1e9 < 0.045, f"compute {compute_ns / 1e9:.3f}s should be ~forward only"
    assert step_ns / 1e9 >= 0.07


def test_unmarked_time_between_and_inside_steps_is_compute(tmp_path):
    # A rank slowed where no phase is open — before its forward, in a data iterator the loop
    # does not mark — is slow all the same; that time must reach the straggler detector.
    b = Beacon(tmp_path / "x.bcn")
    time.sleep(0.05)  # setup (model build, restore): no step's compute
    b.step_begin(1)
    with b.phase("forward"):
        time.sleep(0.01)
    with b.phase("backward"):
        time.sleep(0.05)
    b.step_end(1)
    time.sleep(0.04)  # between steps, no phase open: the user's own code
    b.step_begin(2)
    time.sleep(0.02)  # inside the step, still no phase open
    with b.phase("forward"):
        time.sleep(0.01)
    with b.phase("backward"):
        time.sleep(0.05)
    b.step_end(2)
    (s1, c1, _), (s2, c2, w2) = read_beacon(b.path).step_ring[-2:]
    assert (s1, s2) == (1, 2)
    assert 0.008 < c1 / 1e9 < 0.03, f"step 1: {c1 / 1e9:.3f}s should be ~the forward (setup is no compute)"
    assert 0.065 < c2 / 1e9 < 0.095, f"step 2: {c2 / 1e9:.3f}s should be the forward + 0.06 s unmarked"
    assert w2 / 1e9 >= 0.08


def test_rings_wrap_and_keep_the_newest_entries(tmp_path):
    b = Beacon(tmp_path / "x.bcn")
    for i in range(1, 1001):
        b.step_begin(i)
        with b.phase("data"):
            pass
        b.step_end(i)
    s = read_beacon(b.path)
    assert s.step_count == 1000 and s.step_ring[-1][0] == 1000 and s.step_ring[0][0] == 1000 - len(s.step_ring) + 1
    assert s.phase_count == 1000 and len(s.phase_ring) == 512


def test_update_costs_microseconds(tmp_path):
    b = Beacon(tmp_path / "x.bcn")
    n = 5000
    t0 = time.perf_counter()
    for _ in range(n):
        with b.phase("forward"):
            pass
    per_phase = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        b.collective_issued()
    per_coll = (time.perf_counter() - t0) / n
    # Generous bounds for a shared 2-core box; typical: ~8 µs and ~1 µs.
    assert per_phase < 100e-6 and per_coll < 50e-6, f"phase {per_phase * 1e6:.1f} µs, collective {per_coll * 1e6:.1f} µs"


def test_module_level_phase_is_a_noop_without_a_beacon():
    beacon.set_beacon(None)
    with beacon.phase("eval"):
        pass


def test_reader_in_another_process_sees_a_live_writer(tmp_path):
    code = ("import sys, time; from titan.beacon import Beacon; b = Beacon(sys.argv[1], rank=1);"
            "b.enter('spin'); print('ready', flush=True);\nwhile True: pass")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "w.bcn")], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        snaps = scan_beacons(tmp_path)
        assert len(snaps) == 1 and snaps[0].phase == "spin" and snaps[0].pid == p.pid
        assert request_dump(tmp_path / "w.bcn") == 1
        assert read_beacon(tmp_path / "w.bcn").dump_req == 1
    finally:
        p.kill()
        p.wait(10)
