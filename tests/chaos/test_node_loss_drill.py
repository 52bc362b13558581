"""`titan drill --nodes 2 --node-local --plan node-loss --json`, as the issue asks for it: two
namespace nodes × 2 ranks with a private checkpoint folder each; node1 is lost whole (launcher,
workers, node agent, its folder and its memory), a replacement joins with an empty folder, takes
node1's shards from node0's buddy copy, and the job ends bitwise equal to a clean run. With the
fast path on (per-step in-memory snapshots, warm workers: issue 23) the same loss must fall back
to that cold path — every rank from the disk checkpoint, saying why not from memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from titan.chaos.netns import netns_unavailable_reason

_NETNS = netns_unavailable_reason()


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.multinode
@pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))
@pytest.mark.timeout(900)
@pytest.mark.parametrize("fast", [False, True], ids=["defaults", "fast_path"])
def test_node_loss_drill_resumes_the_replacement_from_the_buddy_copy_bitwise(tmp_path, fast):
    cmd = [sys.executable, "-m", "titan", "drill", "--nodes", "2", "--node-local", "--plan", "node-loss", "--json",
           "--timeout", "700", "--runs-dir", str(tmp_path / "runs")]
    if fast:
        cmd += ["--set", "checkpoint.snapshot_every_steps=1", "--set", "warm.enabled=true"]
    p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=850)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait(10)
    assert p.returncode == 0, f"exit {p.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    rep = json.loads(out)
    assert rep["passed"] and rep["final_state_equal"] is True and rep["nodes"] == 2, rep["problems"]
    (f,) = rep["faults"]
    assert f["kind"] == "node_loss" and f["detected"] and f["attributed_ok"] and f["recovered"], f
    assert f["detector"] == "launcher.node_lost" and "node1" in f["attribution"], f
    assert f["checks"]["lost node restored from its buddy"], f
    assert f["steps_lost"] is not None and 1 <= f["steps_lost"] <= 5, f  # lost at step 13, saved at 10
    assert f["effect"]["bit"] and "file(s)" in f["impact"], f
    if fast:
        from titan.events import read_run

        evs = read_run(rep["run_dir"]).events
        t_loss = next(e.t for e in evs if e.kind == "inject.node_loss")
        assert any(e.kind == "ckpt.step_snapshots" and e.t < t_loss for e in evs), "the per-step tier never ran"
        loaded = [e for e in evs if e.kind == "ckpt.loaded" and e.t > t_loss]
        assert sorted({e.rank for e in loaded}) == [0, 1, 2, 3], [(e.rank, e.data) for e in loaded]
        first = {e.rank: e for e in reversed(loaded)}  # each rank's first restore after the loss
        assert all(e.data["source"] != "snapshot:restart" for e in first.values()), \
            f"the lost node's memory must be gone: {[(r, e.data['source']) for r, e in first.items()]}"
        assert all("no valid per-step snapshot" in (e.data.get("memory") or "") for e in first.values()), \
            f"each rank must say why not from memory: {[(r, e.data.get('memory')) for r, e in first.items()]}"
