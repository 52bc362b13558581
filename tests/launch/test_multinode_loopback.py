"""Two `titan run` "nodes" on loopback form one job through c10d rendezvous."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from titan.events import read_run

TITAN = Path(sys.executable).with_name("titan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multinode
@pytest.mark.timeout(120)
def test_same_command_on_two_nodes_forms_one_world(tmp_path, worker_script):
    port = _free_port()
    procs = []
    try:
        for node, is_host in (("n0", 1), ("n1", 0)):
            procs.append(subprocess.Popen(
                [str(TITAN), "run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-conf", f"is_host={is_host}", "--run-id", "mn", "--node-id", node, "--json", "--",
                 str(worker_script), repr({"default": "ok"})],
                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True))
        outs = [p.communicate(timeout=100) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, f"node exit {p.returncode}:\n{err[-2000:]}"
        evs = read_run(tmp_path / "runs" / "mn").events
        started = sorted((e.node, e.rank, e.world) for e in evs if e.kind == "worker.started")
        assert started == [("n0", 0, 2), ("n1", 1, 2)] or started == [("n0", 1, 2), ("n1", 0, 2)], started
        meta = json.loads((tmp_path / "runs" / "mn" / "run.json").read_text())
        assert set(meta["nodes"]) == {"n0", "n1"}, meta["nodes"].keys()
        assert {e.node for e in evs if e.kind == "launcher.finished"} == {"n0", "n1"}
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
