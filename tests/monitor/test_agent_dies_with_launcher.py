"""The node agent dies with its launcher: SIGKILL `titan run`, the agent is gone within seconds
(issue 15: it stayed alive, orphaned, for minutes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from titan.events import read_run

TITAN = Path(sys.executable).with_name("titan")
SLEEPER = "import time\nfrom titan.worker import WorkerContext\nctx = WorkerContext.from_env()\ntime.sleep(300)\n"


def _agent_pid(rd: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        f = rd / "launcher.agentnode.jsonl"
        if f.exists():
            for line in f.read_text().splitlines():
                ev = json.loads(line)
                if ev["kind"] == "launcher.agent" and "pid" in ev.get("data", {}):
                    return int(ev["data"]["pid"])
        time.sleep(0.1)
    raise AssertionError(f"titan run did not report its node agent within {timeout:.0f}s")


@pytest.mark.timeout(120)
def test_sigkill_of_titan_run_takes_its_node_agent_down_within_seconds(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    rd = tmp_path / "runs" / "orphan"
    p = subprocess.Popen([str(TITAN), "run", "--nproc-per-node", "1", "--max-restarts", "0", "--node-id", "agentnode",
                          "--runs-dir", str(tmp_path / "runs"), "--run-id", "orphan", "--set", "agent.interval_s=0.5",
                          "--", str(script)], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    agent = None
    try:
        agent = psutil.Process(_agent_pid(rd, 60))
        assert agent.is_running() and agent.ppid() == p.pid, "the agent should be titan run's child"
        os.kill(p.pid, signal.SIGKILL)  # the launcher only; the agent lives in its own session
        p.wait(10)
        t0 = time.monotonic()
        gone, alive = psutil.wait_procs([agent], timeout=10)
        waited = time.monotonic() - t0
        assert not alive, f"the node agent (pid {agent.pid}) is still running 10 s after its launcher was SIGKILLed"
        stops = [e for e in read_run(rd).events if e.kind == "agent.stop" and e.node == "agentnode"]
        assert stops, "the agent must stop through its normal path (agent.stop written)"
        print(f"agent gone {waited:.2f}s after the launcher's SIGKILL")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        with __import__("contextlib").suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # the orphaned worker (same process group as the launcher)
        if agent is not None and agent.is_running():
            agent.kill()
