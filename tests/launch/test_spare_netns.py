"""Three namespace nodes, one a hot spare (--nnodes 2:2 and a third titan run): a node over its
strike limit leaves, the spare joins at the next rendezvous, the job finishes at full size, and
the strike is in every node's own ledger (the cluster-wide ledger, through the rendezvous store)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from titan.chaos.netns import netns_unavailable_reason

sys.path.insert(0, str(Path(__file__).parent))
from _netcluster import NetCluster  # noqa: E402

_NETNS = netns_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.multinode, pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))]
STEPS = 200


def _script(out: Path) -> list[str]:
    return ["-m", "titan.workloads.tinygpt", "--steps", str(STEPS), "--ckpt-every", "5", "--threads", "1",
            "--log-every", "0", "--seed", "5", "--out", str(out)]


def _strikes(path: Path) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    with sqlite3.connect(path) as c:
        return [tuple(r) for r in c.execute("SELECT node, kind FROM strikes ORDER BY t")]


@pytest.mark.slow  # three nodes, a restart and a spare joining: ~2-3 min on a loaded box
@pytest.mark.timeout(800)
def test_a_node_over_its_strike_limit_is_replaced_by_the_spare_and_every_ledger_agrees(tmp_path):
    # One shared run directory (the strike rules read every node's launcher file), one ledger
    # file per node (each node's own cache).
    c = NetCluster(tmp_path / "c", 3, tag="tsp", private=False)
    ledgers = {i: tmp_path / f"ledger-node{i}.sqlite" for i in range(3)}
    sets = lambda i: ["watchdog.restart_backoff_s=0.2", "watchdog.strike_limit=1",  # noqa: E731
                      f"watchdog.ledger_path={ledgers[i]}"]
    out = tmp_path / "final.pt"
    try:
        for i in (0, 1):
            c.start(i, "sp", "2:2", _script(out), nproc=1, sets=sets(i), extra=["--rdzv-conf", "last_call_timeout=3"])
        end = time.monotonic() + 300
        while time.monotonic() < end and not any(e["kind"] == "step" for e in c.events("sp")):
            assert all(p.poll() is None for p in c.procs.values()), c.console()
            time.sleep(0.3)
        c.start(2, "sp", "2:2", _script(out), nproc=1, sets=sets(2))  # the spare: the round is full
        # A hot spare: it is at the rendezvous (torch keeps it on the redundancy list) before
        # anything fails; the running pair keeps training meanwhile.
        joining: list[dict] = []
        while time.monotonic() < end and not joining:
            joining = [e for e in c.events("sp") if e["kind"] == "launcher.ledger" and e.get("node") == "node2"
                       and e["data"].get("when") == "before join"]
            assert c.procs[2].poll() is None, c.console()
            time.sleep(0.3)
        assert joining, "the spare never reached the rendezvous:\n" + c.console()
        t_spare = joining[0]["t"]  # the spare's own record of going to the rendezvous
        time.sleep(5)
        victim = None
        while time.monotonic() < end and victim is None:
            evs = c.events("sp")
            saved = [e["data"]["step"] for e in evs if e["kind"] == "ckpt.saved"]
            mine = [e for e in evs if e["kind"] == "step" and e["node"] == "node1"]
            if saved and mine and mine[-1]["step"] >= max(saved) + 2 and max(saved) >= 10:
                victim = mine[-1]["pid"]
            time.sleep(0.2)
        assert victim, "node1 never got past a checkpoint:\n" + c.console()
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        codes = c.wait(450)
        assert codes[0] == 0 and codes[2] == 0, f"exit codes {codes}\n{c.console()}"
        assert codes[1] not in (0, None), f"node1 should have left the job: {codes}"
        evs = c.events("sp")
        excluded = [e for e in evs if e["kind"] == "node.excluded" and e.get("node") == "node1"]
        assert excluded, "node1 was never excluded:\n" + c.console()
        spare_steps = [e for e in evs if e["kind"] == "step" and e["node"] == "node2" and e["t"] < t_kill]
        assert not spare_steps, "the spare trained before a node left: the group was larger than MAX"
        # While the spare waits (from its join until the kill), the pair steps on, and nothing
        # restarts it (the spare is on the redundancy list, not a membership change).
        before = [e for e in evs if e["kind"] == "step" and t_spare <= e["t"] < t_kill]
        assert before, "the pair did not keep training while the spare waited"
        restarts = [e for e in evs if e["kind"] == "launcher.restart" and t_spare <= e["t"] < t_kill]
        assert not restarts, f"the spare's arrival restarted the pair: {restarts}"
        after = [e for e in evs if e["kind"] == "step" and e["t"] > t_kill]
        assert {e["node"] for e in after} == {"node0", "node2"}, sorted({e["node"] for e in after})
        assert max(e["step"] for e in after if e["node"] == "node2") == STEPS, "the spare did not finish the job"
        world = {e["data"].get("world") or e.get("world") for e in after if e["kind"] == "step"}
        assert world <= {2, None}, f"the job did not go on at full size: {world}"
        for i, path in ledgers.items():
            got = _strikes(path)
            assert ("node1", "crash") in got and all(n == "node1" for n, _ in got), f"node{i}'s ledger: {got}"
    finally:
        c.close()
        print(json.dumps({i: _strikes(p) for i, p in ledgers.items()}))
