"""The agent as a child process (for `titan run`), and scripts/gpu-check.sh on a GPU-less host."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from titan.events import RunDir, read_run
from titan.monitor.spawn import start_agent, stop_agent
from titan.settings import load_settings

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(90)
def test_spawned_agent_uses_the_launcher_settings_and_stops_on_sigterm(tmp_path: Path):
    rd = RunDir.create(tmp_path, "run5")
    settings = load_settings(env={}, cli={"agent.interval_s": 0.2, "agent.collectors": "host,disk"})
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = start_agent(rd, "nodeS", settings_json=settings.to_json(), env=env)
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not (rd.metrics / "agent.nodeS.jsonl").exists():
            assert proc.poll() is None, (rd.path / "agent.nodeS.log").read_text()
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        rc = stop_agent(proc, timeout_s=10)
    assert rc == 0, (rd.path / "agent.nodeS.log").read_text()
    kinds = [e.kind for e in read_run(rd.path).events if e.node == "nodeS"]
    assert kinds[0] == "agent.start" and kinds[-1] == "agent.stop", kinds
    start = next(e for e in read_run(rd.path).events if e.kind == "agent.start")
    assert start.data["collectors"] == ["host", "disk"] and start.data["interval_s"] == 0.2


@pytest.mark.timeout(150)
def test_gpu_check_script_reports_pass_fail_lines_without_a_gpu():
    p = subprocess.run(["bash", "scripts/gpu-check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=140)
    out = p.stdout
    assert "FAIL nvml: unavailable: NVML library (libnvidia-ml.so.1) not found" in out, out + p.stderr
    assert "PASS xid-classify: Xid 79 -> exclude_node" in out, out
    assert any(line.startswith(("PASS xid-watch", "SKIP xid-watch")) for line in out.splitlines()), out
    assert p.returncode == 1 and "gpu-check: 1 failure(s)" in out, out
