"""The nodes' exchange after each rendezvous round (titan.launch.cluster), over a real TCPStore:
a node replaced under its id is named by the survivors (launcher.node_lost), and every node
of a round agrees one job-wide attempt that its workers inherit (TITAN_ATTEMPT)."""

from __future__ import annotations

import datetime
import json
import os
import threading
import types
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import PrefixStore, TCPStore

from titan.launch.cluster import ClusterServices
from titan.security.secret import generate_secret
from titan.settings import load_settings
from titan.settings.env import TITAN_ATTEMPT

pytestmark = pytest.mark.timeout(120)
SECRET = generate_secret()


class Node:
    def __init__(self, name: str, root: Path, nnodes: tuple[int, int] = (2, 2)) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.run_json: dict[str, Any] = {}
        sec = types.SimpleNamespace(secret=SECRET, listen=types.SimpleNamespace(addr="127.0.0.1"))
        self.svc = ClusterServices(run_id="job", node=name, settings=load_settings(env={}), security=sec, root=root,
                                   multi_node=True, record=self.run_json.update, nnodes=nnodes,
                                   emit=lambda kind, msg, level="info", data=None: self.events.append(
                                       (kind, msg, data or {})))

    def lost(self) -> list[dict[str, Any]]:
        return [d for k, _, d in self.events if k == "launcher.node_lost"]


def _round(master: TCPStore, rnd: int, nodes: list[Node]) -> dict[str, str]:
    """One round: every node runs the after-join exchange in its own thread, as each node's
    titan run does; returns what each handed its workers as TITAN_ATTEMPT."""
    handler = types.SimpleNamespace(get_run_id=lambda: "job",
                                    _state_holder=types.SimpleNamespace(state=types.SimpleNamespace(round=rnd)))
    errors: list[BaseException] = []
    attempts: dict[str, str] = {}

    def join(rank: int, n: Node) -> None:
        try:  # each node its own client of the one store, as each node's agent has
            client = TCPStore("127.0.0.1", master.port, is_master=False, timeout=datetime.timedelta(seconds=30))
            store = PrefixStore(f"torch.rendezvous.job.{rnd}", client)
            n.svc.after_join(types.SimpleNamespace(store=store, rank=rank, world_size=len(nodes)), handler)
            attempts[n.svc.node] = str(n.svc.attempt)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test
            errors.append(e)

    ths = [threading.Thread(target=join, args=(r, n)) for r, n in enumerate(nodes)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(60)
    assert not errors, errors
    return attempts


def test_a_replaced_node_is_named_by_the_survivors_and_the_attempt_stays_job_wide(tmp_path, monkeypatch):
    monkeypatch.setenv(TITAN_ATTEMPT, "")
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    shared = tmp_path / "ckpt"  # one folder: the storage is shared (no replica servers needed here)
    a, b = Node("node0", shared), Node("node1", shared)
    assert _round(master, 0, [a, b]) == {"node0": "0", "node1": "0"}
    assert _round(master, 1, [a, b]) == {"node0": "1", "node1": "1"}
    assert not a.lost() and not b.lost(), "a restart of the same nodes lost nobody"

    b2 = Node("node1", shared)  # node1 lost; a replacement starts from nothing
    attempts = _round(master, 2, [a, b2])
    assert attempts == {"node0": "2", "node1": "2"}, f"the replacement must join the survivors' attempt: {attempts}"
    assert os.environ[TITAN_ATTEMPT] == "2"
    (lost,) = a.lost()
    assert lost["node"] == "node1" and lost["how"] == "replaced" and lost["committed"] is None, lost
    assert not b2.lost(), "a new node has no previous round to compare"
    assert _round(master, 3, [a, b2]) == {"node0": "3", "node1": "3"}
    assert len(a.lost()) == 1, "the same replacement is not lost again"


def test_strikes_are_shared_through_the_store_signed_and_an_excluded_node_stays_out(tmp_path, monkeypatch):
    from titan.launch.cluster import NodeExcluded
    from titan.launch.ledger_sync import LEDGER_PURPOSE
    from titan.security.secret import generate_secret as other_secret

    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    settings = load_settings(env={}, cli={"watchdog.strike_limit": 2})
    nodes = {}
    for name in ("node0", "node1", "node2"):
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / name))  # each node its own local ledger
        n = Node(name, tmp_path / "ckpt")
        n.svc.settings = settings
        n.svc.ledger_sync = n.svc._make_ledger_sync()
        nodes[name] = n
    handler = lambda: types.SimpleNamespace(_store=TCPStore("127.0.0.1", master.port, is_master=False))  # noqa: E731
    n1 = nodes["node1"].svc
    n1.ledger_sync.ledger.add("node1", "crash", run="job", detail="worker died")
    n1.before_join(handler())  # one strike of two: it joins, and publishes it
    # A writer of the store without the job secret plants a strike for node0: never believed.
    forged = other_secret().signer().seal(LEDGER_PURPOSE, json.dumps(
        [{"node": "node0", "kind": "crash", "t": 1.0, "run": "job"}]).encode(), context="job")
    master.set("titan/ledger/job/node/node0", forged)
    for name in ("node0", "node2"):
        nodes[name].svc.before_join(handler())
    for name in ("node0", "node2"):
        got = [(s.node, s.kind) for s in nodes[name].svc.ledger_sync.ledger.strikes()]
        assert got == [("node1", "crash")], f"{name}'s ledger: {got}"
    n1.ledger_sync.ledger.add("node1", "hang", run="job", detail="hung in comm")
    with pytest.raises(NodeExcluded):
        n1.before_join(handler())  # over its limit: it stays out of the round
    assert any(k == "node.excluded" for k, _, _ in nodes["node1"].events)
    # node1's disk is lost; its replacement learns its own strikes from the store and stays out too.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "node1-new"))
    fresh = Node("node1", tmp_path / "ckpt")
    fresh.svc.settings = settings
    fresh.svc.ledger_sync = fresh.svc._make_ledger_sync()
    assert fresh.svc.ledger_sync.ledger.strikes() == []
    with pytest.raises(NodeExcluded):
        fresh.svc.before_join(handler())
    for name in ("node0", "node2"):
        nodes[name].svc.before_join(handler())
        assert nodes[name].svc.ledger_sync.ledger.is_excluded("node1"), f"{name} does not see node1 excluded"
        assert not nodes[name].svc.ledger_sync.ledger.is_excluded("node0"), "the forged strike counted"


def test_a_round_without_the_lost_node_and_no_spare_says_the_job_went_on_at_min(tmp_path, monkeypatch):
    monkeypatch.setenv(TITAN_ATTEMPT, "")
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    a, b = Node("node0", tmp_path / "ckpt", (1, 2)), Node("node1", tmp_path / "ckpt", (1, 2))
    _round(master, 0, [a, b])
    assert a.run_json["elastic"] == {"nodes": 2, "min": 1, "max": 2, "at_min": False, "round": 0, "previous": None}
    assert not [k for k, _, _ in a.events if k == "launcher.world"], "a full round is no shrink"
    _round(master, 1, [a])  # node1 gone for good, no spare: node0 alone (world 1)
    (msg, d), = [(m, d) for k, m, d in a.events if k == "launcher.world"]
    assert d["nodes"] == 1 and d["at_min"] is True and d["lost"] == ["node1"] and d["previous"] == 2, d
    assert msg.startswith("continuing at MIN: 1 of 2 nodes (was 2); node1 lost"), msg
    assert a.run_json["elastic"]["shrunk"] is True and a.run_json["elastic"]["at_min"] is True
    assert [x["node"] for x in a.lost()] == ["node1"], "the lone survivor names the node it lost"
