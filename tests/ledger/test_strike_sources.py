"""Which failures become strikes for which node (read from a run directory's events)."""

from __future__ import annotations

import json
import time

import pytest

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


def _guard_strike(rd, node, *, rank=1, attempt=0, step=9, cause=None, t_file="nodeA.rank1.attempt0.pid41.jsonl"):
    w = EventWriter(rd.events_dir / t_file, run="r", node=node, rank=rank, attempt=attempt)
    w.emit("guard.strike", f"strike against node {node} (rank {rank})", level="warning", step=step,
           data={"node": node, "rank": rank, **({"cause": cause} if cause else {})})
    w.close()


def _inject(rd, kind, *, step, rank=1, attempt=0, t=None, name="nodeA.rank1.attempt0.pid42.jsonl"):
    w = EventWriter(rd.events_dir / name, run="r", node="nodeA", rank=rank, attempt=attempt)
    w.emit(f"inject.{kind}", f"injected {kind}", level="warning", step=step, data={"rank": rank})
    w.close()
    if t is not None:  # age the event (an SDC finding comes rounds after its flip)
        lines = [json.loads(x) for x in (rd.events_dir / name).read_text().splitlines()]
        for o in lines:
            o["t"] = t
        (rd.events_dir / name).write_text("".join(json.dumps(o) + "\n" for o in lines))


@pytest.mark.parametrize("inject_file", ["nodeA.rank0.attempt0.pid40.jsonl", "nodeA.rank1.attempt0.pid42.jsonl"],
                         ids=["injection-read-first", "injection-read-after-the-strike"])
def test_a_guard_strike_from_an_injected_nan_is_not_a_strike(tmp_path, inject_file):
    # Issue 15: three short runs with injected NaNs excluded the host. The guard-strike path
    # never looked for the injection; and the file holding it may be read after the strike's.
    rd, wd, led, excluded = _wd(tmp_path)
    _inject(rd, "grad", step=9, name=inject_file)
    _guard_strike(rd, "nodeA", step=9)
    wd.strikes.scan(final=True)
    assert led.count("nodeA") == 0, f"an injected NaN struck the node: {led.strikes()}"
    assert [k for k, _ in wd.strikes.skipped] == ["guard"], wd.strikes.skipped
    assert not excluded
    wd.events.close()


def test_an_sdc_strike_rounds_after_an_injected_bitflip_is_not_a_strike(tmp_path):
    rd, wd, led, _ = _wd(tmp_path)
    _inject(rd, "bitflip", step=12, t=time.time() - 120)  # long before: the time window alone misses it
    _guard_strike(rd, "nodeA", step=20, cause="sdc.mismatch")
    wd.strikes.scan(final=True)
    assert led.count("nodeA") == 0, led.strikes()
    wd.events.close()


def test_guard_strikes_count_when_nothing_was_injected_or_injected_faults_are_asked_to_count(tmp_path):
    rd, wd, led, _ = _wd(tmp_path)
    _inject(rd, "grad", step=29, attempt=1, t=time.time() - 120)  # another attempt, long ago: no excuse
    _guard_strike(rd, "nodeA", step=30)
    wd.strikes.scan(final=True)
    assert led.count("nodeA") == 1, led.strikes()
    wd.events.close()
    rd2 = RunDir.create(tmp_path / "b", "r")
    led2 = Ledger(tmp_path / "b.sqlite", limit=5)
    wd2 = Watchdog(rd2, "nodeA", load_settings(env={}, cli={"watchdog.strike_injected": "true"}), ledger=led2)
    _inject(rd2, "grad", step=9)
    _guard_strike(rd2, "nodeA", step=9)
    wd2.strikes.scan(final=True)
    assert led2.count("nodeA") == 1, "watchdog.strike_injected=true must count injected faults"
    wd2.events.close()
