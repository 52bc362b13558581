"""Node-local checkpoint folders (one per "node"): commit agreed over the process group, every
node's shards on its buddy, a lost node's folder restored from the buddy — bitwise."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

from titan.checkpoint.manifest import list_committed, read_manifest, verify
from titan.replica import DiskStore, ReplicaClient, ReplicaServer

pytestmark = pytest.mark.timeout(600)  # 3 runs of 4 spawned ranks; a box at load 30 took > 240 s
KEY = b"n" * 32
NODES = ["nodeA", "nodeA", "nodeB", "nodeB"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """Two nodes' folders and replica servers (the part of `titan run` these tests need)."""

    def __init__(self, base: Path, run_id: str = "nl") -> None:
        self.base, self.run_id = base, run_id
        self.servers: dict[str, ReplicaServer] = {}
        for n in ("nodeA", "nodeB"):
            self.start(n)

    def folder(self, node: str) -> Path:
        return self.base / node / self.run_id

    def root(self, node: str) -> Path:
        return self.folder(node) / "checkpoints"

    def start(self, node: str) -> None:
        self.root(node).mkdir(parents=True, exist_ok=True)
        store = DiskStore(self.folder(node) / "replicas")
        self.servers[node] = ReplicaServer(store, key=KEY, context=self.run_id, exports={"ckpt": self.root(node)},
                                           node=node).start()

    def lose(self, node: str) -> None:
        """The node dies with everything it had: its server, its folder (checkpoints and replicas)."""
        self.servers.pop(node).close()
        shutil.rmtree(self.base / node)

    def close(self) -> None:
        for s in self.servers.values():
            s.close()

    def run(self, out: Path, *, stop: int, every: int = 4, mode: str = "sync", attempt: int = 0,
            replicate: str = "auto", settings: dict[str, str] | None = None) -> list[dict[str, Any]]:
        from _nodelocal_worker import rank_main

        out.mkdir(parents=True, exist_ok=True)
        spec = {"nodes": NODES, "stop": stop, "every": every, "mode": mode, "attempt": attempt, "out": str(out),
                "replicate": replicate, "settings": settings or {},
                "roots": {n: str(self.root(n)) for n in self.servers},
                "run_dirs": {n: str(self.folder(n)) for n in self.servers},
                "env": {n: {"TITAN_REPLICA_ENDPOINT": s.endpoint, "TITAN_REPLICA_KEY": KEY.hex(),
                            "TITAN_REPLICA_EXPORT": str(self.root(n))} for n, s in self.servers.items()}}
        ctx = mp.start_processes(rank_main, args=(4, _port(), spec), nprocs=4, join=False, start_method="spawn")
        try:
            while not ctx.join(timeout=200):
                pass
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        res = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
        errors = [r["error"] for r in res if "error" in r]
        assert not errors, errors
        return res


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same job, never interrupted (its own folders): every rank's result after step 8."""
    base = tmp_path_factory.mktemp("ref")
    ref = Cluster(base)
    try:
        want = ref.run(base / "o-ref", stop=8)
    finally:
        ref.close()
    assert {r["layout"]["storage"] for r in want} == {"node-local"}, want[0]["layout"]
    return want


def test_node_local_saves_lose_nothing_with_a_node_nor_with_every_node_given_a_durable_tier(cluster, tmp_path,
                                                                                          reference):
    want = reference
    durable = tmp_path / "durable"  # a folder every node sees (a shared file system)
    persist = {"TITAN_CHECKPOINT_PERSIST_EVERY_STEPS": "4", "TITAN_CHECKPOINT_PERSIST_DIR": str(durable)}
    first = cluster.run(tmp_path / "o1", stop=6, settings=persist)
    assert all(r["start"] == 0 for r in first)
    for node in ("nodeA", "nodeB"):
        steps = [s for s, _ in list_committed(cluster.root(node))]
        assert steps == [4], f"{node} committed {steps}, expected step 4 on its own disk"
        path = cluster.root(node) / "step-00000004"
        m = read_manifest(path)
        assert m["version"] == 2 and m["storage"] == "node-local", m
        own = sorted(n for n, p in m["placement"].items() if p["node"] == node and n != ".metadata")
        other = "nodeB" if node == "nodeA" else "nodeA"
        assert own and all(m["placement"][n]["replica"] == other for n in own), m["placement"]
        # Each node holds its own shards only (no node read another's files) ...
        present = sorted(p.name for p in path.iterdir() if p.name.endswith(".distcp"))
        assert present == own, f"{node} holds {present}, wrote {own}"
        # ... and its buddy holds a verified copy of them.
        with ReplicaClient(KEY, context="nl") as c:
            held = c.list(cluster.servers[other].endpoint, "ckpt/step-00000004")
        copies = {n: i for s, blobs in held.items() for n, i in blobs.items()}
        assert sorted(copies) == own and all(copies[n].crc32 == m["files"][n]["crc32"] for n in own), (held, m)
    # The durable tier got the same step, every node's shards written by that node's ranks.
    dm = read_manifest(durable / "step-00000004")
    assert dm["files"] == m["files"] and verify(durable / "step-00000004").ok, dm

    cluster.lose("nodeB")  # the whole node: its ranks are gone already, now its disk and its server too
    cluster.start("nodeB")  # a replacement node with an empty folder
    # (This run leaves the durable tier alone, so that it still holds step 4 only.)
    second = cluster.run(tmp_path / "o2", stop=8, attempt=1)
    assert all(r["start"] == 4 for r in second), [r["start"] for r in second]
    assert all(r["params"] == w["params"] for r, w in zip(second, want)), "the resumed run differs from the clean run"
    assert verify(cluster.root("nodeB") / "step-00000004").ok, "the replacement node has no complete copy"
    loaded = _events(cluster.folder("nodeB"), "ckpt.loaded")
    assert loaded and loaded[0]["data"]["fetched_files"] > 0 and "nodeA" in loaded[0]["data"]["fetched_from"], loaded
    assert loaded[0]["data"]["source"] == "disk", loaded[0]["data"]

    # Now both nodes, their disks and the buddies' replicas are gone; two new nodes start
    # with empty folders: only the durable tier holds anything (step 4).
    for node in ("nodeA", "nodeB"):
        cluster.lose(node)
    for node in ("nodeA", "nodeB"):
        cluster.start(node)
    third = cluster.run(tmp_path / "o3", stop=8, attempt=2, settings=persist)
    assert all(r["start"] == 4 for r in third), [r["start"] for r in third]
    assert all(r["params"] == w["params"] for r, w in zip(third, want)), \
        "resumed from the durable tier, the final state differs from the clean run"
    for node in ("nodeA", "nodeB"):
        loaded = _events(cluster.folder(node), "ckpt.loaded")
        assert loaded and loaded[0]["data"]["source"] == "durable", loaded
        assert set(loaded[0]["data"]["fetched_from"]) == {"durable"}, loaded[0]["data"]
        assert verify(cluster.root(node) / "step-00000004").ok, f"{node} holds no complete copy of step 4"


@pytest.mark.slow  # two runs of 4 spawned ranks; CI keeps the node-loss case above
def test_a_damaged_local_shard_is_fetched_again_from_the_buddy(cluster, tmp_path):
    cluster.run(tmp_path / "o1", stop=4)
    shard = next((cluster.root("nodeA") / "step-00000004").glob("__0_*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    res = cluster.run(tmp_path / "o2", stop=4, attempt=1)
    assert all(r["start"] == 4 for r in res)
    loaded = _events(cluster.folder("nodeA"), "ckpt.loaded")[-1]["data"]
    assert any(shard.name in x for x in loaded["repaired"]), loaded
    assert verify(cluster.root("nodeA") / "step-00000004").ok


@pytest.mark.slow  # 4 spawned ranks to see a refusal; CI keeps tests/launch/test_nodelocal_netns.py's refusal by titan run
def test_replication_off_on_node_local_folders_is_refused(cluster, tmp_path):
    with pytest.raises(AssertionError) as e:
        cluster.run(tmp_path / "o1", stop=2, replicate="off")
    assert "checkpoint.replicate=off" in str(e.value), e.value


def _events(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    out = []
    for f in sorted((run_dir / "events").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e["kind"] == kind:
                out.append(e)
    return sorted(out, key=lambda e: e["t"])

