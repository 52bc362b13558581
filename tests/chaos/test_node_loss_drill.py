"""`titan drill --nodes 2 --node-local --plan node-loss --json`, as the issue asks for it: two
namespace nodes × 2 ranks with a private checkpoint folder each; node1 is lost whole (launcher,
workers, node agent and its folder), a replacement joins with an empty folder, takes node1's
shards from node0's buddy copy, and the job ends bitwise equal to a clean run."""

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
def test_node_loss_drill_resumes_the_replacement_from_the_buddy_copy_bitwise(tmp_path):
    cmd = [sys.executable, "-m", "titan", "drill", "--nodes", "2", "--node-local", "--plan", "node-loss", "--json",
           "--timeout", "700", "--runs-dir", str(tmp_path / "runs")]
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
