"""The watchdog against real processes that write beacons (no torch, no torchrun): stall
detection, culprit by collective sequence, stacks from a blocked process, SIGKILL, holding
off inside a budgeted phase, and one verdict for two nodes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from titan.events import RunDir
from titan.ledger import Ledger
from titan.settings import load_settings
from titan.watchdog import Watchdog

FAKE = r'''
import faulthandler, signal, sys, time
from titan.beacon import Beacon
path, rank, world, node, stall_step, how, stacks = sys.argv[1:8]
rank, world, stall_step = int(rank), int(world), int(stall_step)
fh = open(stacks, "a")
faulthandler.register(signal.SIGUSR2, file=fh, all_threads=True)
b = Beacon(path, rank=rank, world=world, node=node)
for step in range(1, 1000):
    b.step_begin(step)
    with b.phase("data"):
        if step == stall_step and how == "data":
            time.sleep(3600)
        if step == stall_step and how.startswith("pause:"):
            time.sleep(float(how[6:]))   # a long stall that ends by itself
        time.sleep(0.005)
    with b.phase("forward"):
        time.sleep(0.005)
    with b.phase("backward"):
        b.collective_issued(0)
        if step == stall_step and how == "wait":
            time.sleep(3600)   # a peer blocked in the all-reduce the culprit never joins
        b.collective_done(0)
    b.step_end(step)
    if step == stall_step and how == "checkpoint":
        with b.phase("checkpoint"):
            time.sleep(3600)
'''


def _settings(**over):
    base = {"watchdog.floor_s": 1.0, "watchdog.warmup_samples": 5, "watchdog.poll_interval_s": 0.05,
            "watchdog.dump_wait_s": 0.5, "watchdog.agree_wait_s": 2.0, "watchdog.py_spy": False}
    base.update(over)
    return load_settings(env={}, cli=base)


def _spawn(rd: RunDir, node: str, rank: int, world: int, stall_step: int, how: str) -> subprocess.Popen:
    """A fake worker; its faulthandler output goes to /dev/null (the stacks themselves are
    checked in test_hang_recovery with the real ``beacon.install``)."""
    bcn = rd.path / "beacons" / f"{node}.local{rank}.bcn"
    return subprocess.Popen([sys.executable, "-c", FAKE, str(bcn), str(rank), str(world), node, str(stall_step), how,
                             "/dev/null"])


def _until(wd: Watchdog, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = wd.tick()
        if rec:
            return rec
        time.sleep(0.05)
    return None


@pytest.mark.timeout(60)
def test_stall_is_detected_culprit_named_and_workers_killed(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    procs = [_spawn(rd, "n", 0, 2, 12, "wait"), _spawn(rd, "n", 1, 2, 12, "data")]
    led = Ledger(tmp_path / "l.sqlite", limit=5)
    wd = Watchdog(rd, "n", _settings(), ledger=led)
    try:
        t0 = time.monotonic()
        rec = _until(wd, 30)
        assert rec is not None, "no hang detected within 30 s"
        assert rec["culprit"]["rank"] == 1 and rec["culprit"]["phase"] == "data", rec["culprit"]
        assert rec["reason"] == "collective-seq" and rec["culprit"]["step"] == 12
        assert rec["detection_latency_s"] < 4.0, f"floor 1 s, yet detected after {rec['detection_latency_s']:.1f}s"
        for p in procs:
            assert p.wait(10) == -9, "workers must be SIGKILLed"
        assert led.count("n") == 1 and led.strikes("n")[0].kind == "hang"
        assert time.monotonic() - t0 < 30
    finally:
        for p in procs:
            p.kill()
        wd.events.close()
    kinds = [json.loads(x)["kind"] for x in (rd.events_dir / "watchdog.n.jsonl").read_text().splitlines()]
    assert kinds.count("hang.detected") == 1 and "hang.killed" in kinds and "node.strike" in kinds


@pytest.mark.timeout(60)
def test_a_rank_inside_its_checkpoint_budget_is_not_a_hang(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    # rank 1 sits in "checkpoint" (budget 20 s); rank 0 is ahead in the next step's all-reduce
    procs = [_spawn(rd, "n", 0, 2, 13, "wait"), _spawn(rd, "n", 1, 2, 12, "checkpoint")]
    wd = Watchdog(rd, "n", _settings(**{"watchdog.checkpoint_budget_s": 20}))
    try:
        assert _until(wd, 5.0) is None, "a save within its budget was taken for a hang"
        assert all(p.poll() is None for p in procs)
    finally:
        for p in procs:
            p.kill()
        wd.events.close()


@pytest.mark.timeout(60)
def test_two_nodes_agree_on_one_verdict(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    procs = [_spawn(rd, "nodeA", 0, 2, 12, "wait"), _spawn(rd, "nodeB", 1, 2, 12, "data")]
    wds = {n: Watchdog(rd, n, _settings()) for n in ("nodeA", "nodeB")}
    recs: dict[str, dict] = {}
    try:
        ths = [threading.Thread(target=lambda n=n: recs.__setitem__(n, _until(wds[n], 30))) for n in wds]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
    finally:
        for p in procs:
            p.kill()
        for w in wds.values():
            w.events.close()
    assert recs["nodeA"] and recs["nodeB"], recs
    culprits = {n: (r["culprit"]["rank"], r["culprit"]["node"]) for n, r in recs.items()}
    assert set(culprits.values()) == {(1, "nodeB")}, culprits
    decided = [r["decided_by"] for r in recs.values()]
    assert sum(d != "another node" for d in decided) == 1, f"exactly one node decides, saw {decided}"
    assert len(recs["nodeA"]["views"]) == 2, "each node must see both ranks' views"


def test_straggler_flags_become_events_and_strikes(tmp_path):
    from titan.beacon import Beacon

    rd = RunDir.create(tmp_path, "r")
    # Beacons owned by this test process: timeouts far away so no hang handling can trigger.
    s = load_settings(env={}, cli={"dist.pg_timeout_s": 1000, "run.rdzv_join_timeout_s": 2000, "watchdog.ceiling_s": 900, "watchdog.floor_s": 800,
                                   "watchdog.warmup_timeout_s": 900, "watchdog.straggler_strike_after": 2})
    led = Ledger(tmp_path / "l.sqlite", limit=10)
    wd = Watchdog(rd, "n", s, ledger=led, kill=False)
    bs = [Beacon(rd.path / "beacons" / f"n.local{r}.bcn", rank=r, world=2, node="n") for r in range(2)]
    import titan.beacon.core as core

    try:
        for step in range(1, 121):
            for r, b in enumerate(bs):
                b.step_begin(step)
                b._compute_ns = int((0.02 if r == 1 else 0.01) * 1e9)  # noqa: SLF001 - rank 1 computes 2x longer
                b.step_end(step)
            if step % 5 == 0:
                assert wd.tick() is None
    finally:
        core.set_beacon(None)
        wd.events.close()
    evs = [json.loads(x) for x in (rd.events_dir / "watchdog.n.jsonl").read_text().splitlines()]
    flags = [e for e in evs if e["kind"] == "straggler.detected"]
    assert flags and flags[0]["data"]["rank"] == 1 and flags[0]["step"] <= 50, [e["data"] for e in flags]
    assert abs(flags[0]["data"]["slowdown"] - 2.0) < 0.05
    assert [x.kind for x in led.strikes("n")][:1] == ["straggler"], "every 2nd flag must be a strike"


_PY_SPY = shutil.which("py-spy") or (str(Path(sys.executable).with_name("py-spy"))
                                     if Path(sys.executable).with_name("py-spy").is_file() else None)


@pytest.mark.skipif(_PY_SPY is None, reason="py-spy is not installed")
@pytest.mark.timeout(60)
def test_evidence_is_collected_at_suspicion_with_native_frames_of_the_culprit_only(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    procs = [_spawn(rd, "n", 0, 2, 12, "wait"), _spawn(rd, "n", 1, 2, 12, "data")]
    wd = Watchdog(rd, "n", _settings(**{"watchdog.floor_s": 2.0, "watchdog.py_spy": True,
                                        "watchdog.evidence_lead_s": 1.0, "watchdog.py_spy_wait_s": 10.0}))
    try:
        rec = _until(wd, 30)
        assert rec is not None, "no hang detected within 30 s"
    finally:
        for p in procs:
            p.kill()
        wd.events.close()
    assert rec["culprit"]["rank"] == 1, rec["culprit"]
    cap = rec["capture"]
    assert cap["started"] == "suspicion" and cap["native"] == [1] and wd.suspicions == 1, cap
    culprit = Path(rec["evidence"]["1"]["py_spy"]).read_text()
    peer = Path(rec["evidence"]["0"]["py_spy"]).read_text()
    # --native on the culprit: the C function it sleeps in; the waiting peer without native frames
    assert "time_sleep" in culprit and "<module>" in culprit, f"culprit's py-spy: {culprit[:600]}"
    assert "<module>" in peer and "time_sleep" not in peer, f"peer's py-spy: {peer[:600]}"


@pytest.mark.timeout(60)
def test_a_stall_that_ends_before_its_timeout_drops_its_evidence_and_is_no_hang(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    # floor 2 s: evidence from 1.0 s of stall on; the rank sleeps 1.2 s, then goes on. A native
    # py-spy pausing it must not push it over its timeout (the pause is not counted as stall).
    proc = _spawn(rd, "n", 0, 1, 30, "pause:1.2")
    wd = Watchdog(rd, "n", _settings(**{"watchdog.floor_s": 2.0, "watchdog.py_spy": _PY_SPY is not None,
                                        "watchdog.evidence_lead_s": 1.0}))
    try:
        assert _until(wd, 8.0) is None, "a stall shorter than its timeout was declared a hang"
        assert proc.poll() is None, "the worker must not be killed"
        assert wd.suspicions >= 1, "the 1.2 s stall never reached its suspicion point (1.0 s): the test tested nothing"
        assert wd.dropped == wd.suspicions, f"{wd.suspicions} suspicion(s), {wd.dropped} dropped once the rank went on"
        assert not list(rd.stacks.glob("*.py-spy.txt")), "a dropped capture's py-spy output must be deleted"
    finally:
        proc.kill()
        wd.stop()


@pytest.mark.timeout(60)
def test_the_time_a_native_py_spy_holds_a_suspect_stopped_is_not_counted_as_its_stall(tmp_path, monkeypatch):
    import titan.watchdog.evidence as evidence

    # A slow native unwind, for real: this "py-spy" stops the process for 1.5 s. The rank's own
    # stall (1.2 s) is within its 2 s timeout; with the pause it would stand still ~2.5 s.
    spy = tmp_path / "py-spy"
    spy.write_text('#!/bin/sh\n[ "$2" = "--native" ] && { kill -STOP "$4"; sleep 1.5; kill -CONT "$4"; }\n'
                   'echo "fake py-spy $*"\n')
    spy.chmod(0o755)
    monkeypatch.setattr(evidence, "_py_spy", lambda: str(spy))
    rd = RunDir.create(tmp_path, "r")
    proc = _spawn(rd, "n", 0, 1, 30, "pause:1.2")
    wd = Watchdog(rd, "n", _settings(**{"watchdog.floor_s": 2.0, "watchdog.py_spy": True,
                                        "watchdog.evidence_lead_s": 1.0}))
    try:
        assert _until(wd, 8.0) is None, "the watchdog's own pause of the rank was declared a hang"
        assert proc.poll() is None, "the worker must not be killed"
        assert wd.suspicions >= 1 and wd.dropped == wd.suspicions, (wd.suspicions, wd.dropped)
    finally:
        proc.kill()
        wd.stop()


def test_a_bogus_last_update_time_is_no_hang_while_the_heartbeat_moves(tmp_path):
    """CI once declared a clean run hung: "rank 0 stalled 25418.6s" — its last update read as
    0, the whole monotonic clock — while its heartbeat kept moving. A stall is never longer
    than the watchdog watched the heartbeat stand still; a real stall is still a hang."""
    import struct

    from titan.beacon import Beacon
    from titan.beacon import layout as L
    import titan.beacon.core as core

    import signal

    prev = signal.signal(signal.SIGUSR2, lambda *_: None)  # the watchdog asks this process for its stacks
    rd = RunDir.create(tmp_path, "r")
    s = _settings(**{"watchdog.warmup_timeout_s": 1.5, "watchdog.ceiling_s": 1.5, "watchdog.floor_s": 1.0,
                     "watchdog.idle_timeout_s": 1.5})
    wd = Watchdog(rd, "n", s, ledger=Ledger(tmp_path / "l.sqlite", limit=10), kill=False)
    bs = [Beacon(rd.path / "beacons" / f"n.local{r}.bcn", rank=r, world=2, node="n") for r in range(2)]
    try:
        for b in bs:
            b.step_begin(1)
            b.enter("forward")
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            for b in bs:
                b.heartbeat()
            struct.pack_into("<q", bs[0]._mm, L.F.LAST_MONO, 0)  # noqa: SLF001 - the bogus timestamp
            assert wd.tick() is None, "a rank whose heartbeat moves was declared hung"
            time.sleep(0.05)
        # The control: the same beacons, standing still, are a hang after the timeout.
        rec = None
        t_end = time.monotonic() + 10.0
        while rec is None and time.monotonic() < t_end:
            rec = wd.tick()
            time.sleep(0.05)
        assert rec is not None, "a real stall must still be a hang"
    finally:
        core.set_beacon(None)
        wd.events.close()
        signal.signal(signal.SIGUSR2, prev)
