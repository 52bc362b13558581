"""`--nnodes 1:2`, two namespace nodes with private (node-local) folders, one node lost for good
and no spare: the survivor goes on at MIN (world 1) from the last checkpoint, resharded by DCP —
the lost node's shards from the buddy copy the survivor holds — with the data position carried
over, and its run directory and report say it continued at MIN."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from titan.chaos.netns import netns_unavailable_reason

sys.path.insert(0, str(Path(__file__).parent))
from _netcluster import NetCluster  # noqa: E402

_NETNS = netns_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.multinode, pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))]

STEPS = 120
BATCH = 8  # tinygpt's per-rank micro-batch
# Titan's tuned rendezvous (last call 3 s, keep-alive 1 s × 3) would let the host start alone
# while the other node is still importing torch; 10 s gives both time to form the first round.
SETS = ["watchdog.restart_backoff_s=0.2", "watchdog.strike_limit=1000", "run.rdzv_last_call_timeout_s=10"]


def _script(out: Path) -> list[str]:
    return ["-m", "titan.workloads.tinygpt", "--steps", str(STEPS), "--ckpt-every", "5", "--threads", "1",
            "--log-every", "0", "--seed", "4", "--batch-size", str(BATCH), "--out", str(out)]


@pytest.mark.slow  # two nodes, a loss, a 10 s last call and a survivor training on alone: ~1-2 min
@pytest.mark.timeout(600)
def test_a_node_lost_with_no_spare_leaves_the_survivor_going_on_at_min_resharded(tmp_path):
    c = NetCluster(tmp_path / "c", 2, tag="tmi")
    out = tmp_path / "c" / "final.pt"
    try:
        for i in (0, 1):
            c.start(i, "mi", "1:2", _script(out), nproc=1, sets=SETS)
        end = time.monotonic() + 300
        while time.monotonic() < end:
            evs = c.events("mi")
            saved = {e["data"]["step"] for e in evs if e["kind"] == "ckpt.saved" and e["node"] == "node1"}
            steps = [e["step"] for e in evs if e["kind"] == "step" and e["node"] == "node1"]
            if saved and max(saved) >= 10 and steps and max(steps) >= max(saved) + 2:
                break
            assert all(p.poll() is None for p in c.procs.values()), c.console()
            time.sleep(0.2)
        else:
            pytest.fail("node1 never got past a checkpoint:\n" + c.console())
        worlds = {e["world"] for e in c.events("mi", "worker.started")}
        assert worlds == {2}, f"the first round should have both nodes (world 2), saw {worlds}\n{c.console()}"
        t_kill = time.time()
        c.kill(1)  # the node is gone for good: no replacement, no spare
        c.lose_disk(1)
        codes = c.wait(400)
        assert codes[0] == 0, f"the survivor should finish alone, exit codes {codes}\n{c.console()}"

        evs = [e for e in c.events("mi") if e["node"] == "node0"]
        shrunk = [e for e in evs if e["kind"] == "launcher.world"]
        assert shrunk, "node0 never said it went on smaller:\n" + c.console()
        d = shrunk[-1]["data"]
        assert d["nodes"] == 1 and d["at_min"] is True and d["lost"] == ["node1"] and d["previous"] == 2, d
        rj = json.loads((c.run_dir(0, "mi") / "run.json").read_text())
        assert rj["elastic"]["at_min"] is True and rj["elastic"]["shrunk"] is True, rj.get("elastic")
        assert rj["storage"]["kind"] == "shared", rj["storage"]  # one node left: its folder is the job's

        loaded = [e for e in evs if e["kind"] == "ckpt.loaded" and e["t"] > t_kill]
        assert loaded, "the survivor loaded no checkpoint after the loss:\n" + c.console()
        ld = loaded[0]["data"]
        assert ld["resharded"] is True and ld["from_world_size"] == 2 and loaded[0]["world"] == 1, ld
        # node1's shard came from the buddy copy node0 holds (node1's folder is gone).
        assert ld["storage"] == "node-local" and ld["fetched_from"] == {"node0": 1}, ld
        after = [e for e in evs if e["kind"] == "step" and e["t"] > t_kill]
        assert after and {e["world"] for e in after} == {1}, sorted({e["world"] for e in after})
        first = min(after, key=lambda e: e["step"])
        k = ld["step"]
        assert first["step"] == k + 1, f"resumed after step {k}, first step trained {first['step']}"
        # The data position: the global consumed-samples counter, re-split for world 1.
        assert first["data"]["samples"] == k * 2 * BATCH + BATCH, (k, first["data"])
        assert max(e["step"] for e in after) == STEPS

        r = subprocess.run([sys.executable, "-m", "titan", "report", str(c.run_dir(0, "mi")), "--no-triage"],
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        md = (c.run_dir(0, "mi") / "report" / "summary.md").read_text()
        assert "continued at MIN: 1 of 2 nodes" in md and "node1" in md, md[:2000]
    finally:
        c.close()
