"""Which failures become strikes for which node (read from a run directory's events)."""

from __future__ import annotations

import time

from titan.events import EventWriter, RunDir
from titan.ledger import Ledger
from titan.settings import load_settings
from titan.watchdog import Watchdog


def _wd(tmp_path, node="nodeA"):
    rd = RunDir.create(tmp_path, "r")
    led = Ledger(tmp_path / f"{node}.sqlite", limit=2)
    excluded: list[str] = []
    wd = Watchdog(rd, node, load_settings(env={}), ledger=led, on_exclude=excluded.append)
    return rd, wd, led, excluded


def _failed(rd, node, t, pid, *, signal=None, code=-9):
    w = EventWriter(rd.launcher_file(node), run="r", node=node)
    w.emit("worker.failed", data={"pid": pid, "global_rank": 0, "exit_code": code, "signal": signal})
    w.close()


def test_the_first_failure_of_an_incident_is_blamed_only_if_it_can_be_the_node(tmp_path):
    rd, wd, led, excluded = _wd(tmp_path)
    _failed(rd, "nodeA", time.time(), 11, signal="SIGSEGV")
    _failed(rd, "nodeB", time.time(), 12, code=10)  # the peer's "connection closed" a moment later
    wd.strikes.scan(final=True)
    assert [s.kind for s in led.strikes("nodeA")] == ["crash"], led.strikes()
    _failed(rd, "nodeA", time.time(), 13, code=1)  # a Python exception: the script's fault
    wd.strikes.scan(final=True)
    assert led.count("nodeA") == 1
    wd.events.close()


def test_peer_failures_do_not_strike_this_node(tmp_path):
    rd, wd, led, _ = _wd(tmp_path)
    _failed(rd, "nodeB", time.time(), 21, signal="SIGKILL")
    _failed(rd, "nodeA", time.time(), 22, code=10)
    wd.strikes.scan(final=True)
    assert led.count("nodeA") == 0
    wd.events.close()


def test_guard_strikes_count_and_the_limit_excludes(tmp_path):
    rd, wd, led, excluded = _wd(tmp_path)
    w = EventWriter(rd.event_file("nodeA", 0, 0, 99), run="r", node="nodeA", rank=0)
    w.emit("guard.strike", "non-finite gradients twice", level="warning")
    w.emit("guard.strike", "loss spike", level="warning")
    w.close()
    wd.strikes.scan(final=True)
    assert [s.kind for s in led.strikes("nodeA")] == ["guard", "guard"]
    assert excluded and "2 strikes" in excluded[0], excluded
    wd.events.close()


def test_a_deliberately_injected_kill_is_not_a_strike(tmp_path):
    rd, wd, led, _ = _wd(tmp_path)
    w = EventWriter(rd.events_dir / "chaos.nodeA.jsonl", run="r", node="nodeA")
    w.emit("inject.kill", data={"pid": 31})
    w.close()
    _failed(rd, "nodeA", time.time(), 31, signal="SIGKILL")
    wd.strikes.scan(final=True)
    assert led.count("nodeA") == 0
    wd.events.close()
