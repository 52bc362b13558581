"""A node over its strike limit is excluded and the job continues on the other node (two
`titan run` "nodes" on loopback). The give-up policy is tested in tests/launch/test_restart_policy.py."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from titan.ledger import Ledger
from wdhelpers import TITAN, WORKER, _kill_workers, events


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.multinode
@pytest.mark.timeout(400)
def test_a_node_over_its_strike_limit_leaves_and_the_job_continues(tmp_path: Path):
    port = _free_port()
    limit = 2
    ledgers = {n: tmp_path / f"ledger-{n}.sqlite" for n in ("nodeA", "nodeB")}
    Ledger(ledgers["nodeB"], limit=limit).add("nodeB", "crash", detail="earlier failure")  # K-1 strikes
    procs = {}
    try:
        for node in ("nodeA", "nodeB"):
            argv = [str(TITAN), "run", "--nproc-per-node", "1", "--nnodes", "1:2", "--rdzv-endpoint",
                    f"127.0.0.1:{port}", "--node-id", node, "--runs-dir", str(tmp_path / "runs"), "--run-id", "two",
                    "--set", f"watchdog.strike_limit={limit}",
                    "--set", "watchdog.strike_injected=true",  # the stall below is injected on purpose
                    "--", str(WORKER), "--steps", "60", "--ckpt-every", "5", "--inject", "0:node=nodeB:25:data"]
            env = {**os.environ, "TITAN_WATCHDOG_LEDGER_PATH": str(ledgers[node])}
            procs[node] = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
            time.sleep(1.0)
        outs = {n: p.communicate(timeout=300)[0] for n, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
        _kill_workers(tmp_path / "runs" / "two")
    rd = tmp_path / "runs" / "two"
    assert procs["nodeA"].returncode == 0, f"nodeA should finish the job alone:\n{outs['nodeA'][-3000:]}"
    assert procs["nodeB"].returncode != 0, "nodeB should have left the job"
    (hang,) = events(rd, "hang.detected")
    assert hang["data"]["culprit"]["node"] == "nodeB" and hang["data"]["culprit"]["phase"] == "data", hang["msg"]
    excl = [e for e in events(rd, "node.excluded") if e["node"] == "nodeB"]
    assert excl, "no node.excluded event for nodeB"
    steps = [e for e in events(rd, "step") if e["node"] == "nodeA" and e["step"] == 60]
    assert steps and steps[-1]["world"] == 1, "nodeA should finish the last step at world size 1"
    # the next launch on nodeB alone: the only node of that job is excluded, a give-up (exit 3,
    # issue 15) that names the strikes and how to clear them, never a silent end
    r = subprocess.run([str(TITAN), "run", "--node-id", "nodeB", "--runs-dir", str(tmp_path / "runs"), "--", str(WORKER)],
                       cwd=tmp_path, env={**os.environ, "TITAN_WATCHDOG_LEDGER_PATH": str(ledgers["nodeB"]),
                                          "TITAN_WATCHDOG_STRIKE_LIMIT": str(limit)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "is excluded by the node ledger" in r.stderr, r.stderr[-2000:]
    assert "titan nodes --clear nodeB" in r.stderr, r.stderr[-2000:]
