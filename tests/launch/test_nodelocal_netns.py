"""Two namespace nodes × 2 ranks whose run and checkpoint folders are node-local (a mount
namespace per node): the storage is found out, saved per node with buddy copies, and a
lost node (processes and disk) comes back from its buddy's copy, bitwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from titan.chaos.netns import netns_unavailable_reason
from titan.checkpoint.manifest import list_committed, read_manifest

sys.path.insert(0, str(Path(__file__).parent))
from _netcluster import NetCluster  # noqa: E402

_NETNS = netns_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.multinode, pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))]

STEPS = 16
FAST = ["watchdog.restart_backoff_s=0.2", "watchdog.strike_limit=1000"]


def equal_params(a: Path, b: Path) -> bool:
    """The two final models (tinygpt --out) are bitwise equal."""
    import torch

    pa, pb = torch.load(a, map_location="cpu", weights_only=True), torch.load(b, map_location="cpu", weights_only=True)
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def _script(out: Path) -> list[str]:
    return ["-m", "titan.workloads.tinygpt", "--steps", str(STEPS), "--ckpt-every", "4", "--threads", "1",
            "--log-every", "0", "--seed", "3", "--out", str(out)]


def _reference(base: Path) -> subprocess.Popen:
    """The same job, 4 ranks on one node, never interrupted."""
    base.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "titan", "run", "--nproc-per-node", "4", "--run-id", "ref",
                             "--runs-dir", str(base / "runs"), "--no-agent", "--", *_script(base / "ref.pt")],
                            cwd=base, stdout=open(base / "ref.log", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


@pytest.mark.slow  # ~2 min: a 4-rank reference beside two nodes that lose one (the drill test repeats it)
@pytest.mark.timeout(600)
def test_node_loss_with_its_disk_resumes_from_the_buddy_copy_bitwise(tmp_path):
    ref = _reference(tmp_path / "ref")
    c = NetCluster(tmp_path / "c", 2, tag="tnl")
    out = tmp_path / "c" / "final.pt"
    try:
        for i in (0, 1):
            c.start(i, "nl", "2", _script(out), sets=FAST)
        # Wait for node1 to have committed step 8 and gone past it, then lose node1 entirely.
        end = time.monotonic() + 240
        while time.monotonic() < end:
            evs = c.events("nl")
            saved = {e["data"]["step"] for e in evs if e["kind"] == "ckpt.saved" and e["node"] == "node1"}
            steps = [e["step"] for e in evs if e["kind"] == "step" and e["node"] == "node1"]
            if 8 in saved and steps and max(steps) >= 9:
                break
            assert all(p.poll() is None for p in c.procs.values()), c.console()
            time.sleep(0.2)
        else:
            pytest.fail("node1 never saved step 8:\n" + c.console())
        rj = json.loads((c.run_dir(0, "nl") / "run.json").read_text())
        assert rj["storage"]["kind"] == "node-local" and rj["storage"]["replicate"] == "disk", rj["storage"]
        m = read_manifest(c.run_dir(1, "nl") / "checkpoints" / "step-00000008")
        assert m["version"] == 2 and m["storage"] == "node-local", m
        assert {p["replica"] for n, p in m["placement"].items() if p["node"] == "node1"} == {"node0"}, m["placement"]
        c.kill(1)
        c.lose_disk(1)
        assert not c.folder(1).exists()
        c.start(1, "nl", "2", _script(out), sets=FAST)  # a replacement node: empty folder
        codes = c.wait(300)
        assert codes == {0: 0, 1: 0}, f"exit codes {codes}\n{c.console()}"
        loaded = [e for e in c.events("nl", "ckpt.loaded") if e["node"] == "node1"]
        assert loaded, "the replacement node loaded nothing:\n" + c.console()
        first = loaded[0]["data"]
        assert first["step"] == 8 and first["storage"] == "node-local" and first["fetched_from"].get("node0"), first
        assert [s for s, _ in list_committed(c.run_dir(1, "nl") / "checkpoints")][-1] == STEPS
        assert ref.wait(300) == 0, (tmp_path / "ref" / "ref.log").read_text()[-3000:]
        assert equal_params(out, tmp_path / "ref" / "ref.pt") is True, "final weights differ from the clean run"
    finally:
        if ref.poll() is None:
            os.killpg(ref.pid, 9)
        c.close()


@pytest.mark.timeout(240)
def test_node_local_storage_without_replication_is_refused_on_every_node(tmp_path):
    c = NetCluster(tmp_path / "c", 2, tag="tnr")
    try:
        for i in (0, 1):
            c.start(i, "nr", "2", _script(tmp_path / "x.pt"), sets=[*FAST, "checkpoint.replicate=off"])
        codes = c.wait(180)
        assert codes == {0: 2, 1: 2}, f"exit codes {codes}\n{c.console()}"
        for i in (0, 1):
            log = c.logs[i].read_text()
            assert "titan: error:" in log and "checkpoint.replicate=off" in log and "hint:" in log, log[-2000:]
            assert "Traceback" not in log, log[-3000:]
            rj = json.loads((c.run_dir(i, "nr") / "run.json").read_text())
            assert rj["storage"]["kind"] == "node-local" and rj["exit_code"] == 2, rj.get("storage")
        assert not c.events("nr", "worker.started"), "a worker started although the job was refused"
    finally:
        c.close()
