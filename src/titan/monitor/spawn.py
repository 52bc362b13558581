"""Start and stop the node agent as a child process (what ``titan run`` does per node).

The agent runs in its own process so that it never shares an interpreter with torch and
keeps sampling while workers hang or restart. ``start_agent`` returns the ``Popen``;
``stop_agent`` sends SIGTERM (the agent writes ``agent.stop`` and exits) and SIGKILLs
after ``timeout_s``. If this process dies without stopping it (SIGKILL), the agent notices
and stops by itself within about a second (``titan.monitor.parent``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from titan.events import RunDir
from titan.settings.env import TITAN_NODE_ID, TITAN_RUN_DIR, TITAN_SETTINGS_JSON

__all__ = ["agent_command", "start_agent", "stop_agent"]


def agent_command(run_dir: RunDir, node: str, *, python: str | None = None,
                  prometheus_port: int | None = None) -> list[str]:
    """The command line of the agent for ``run_dir`` and ``node``."""
    cmd = [python or sys.executable, "-m", "titan.cli.main", "agent", "--run-dir", str(run_dir.path), "--node", node]
    if prometheus_port is not None:
        cmd += ["--prometheus-port", str(prometheus_port)]
    return cmd


def start_agent(run_dir: RunDir, node: str, *, settings_json: str | None = None,
                env: Mapping[str, str] | None = None, prometheus_port: int | None = None,
                log_file: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
    """Spawn the agent; its stderr goes to ``log_file`` (default ``<run>/agent.<node>.log``)."""
    from titan.monitor.parent import parent_env

    child_env = dict(os.environ if env is None else env)
    child_env.update(parent_env())  # the agent stops when this process is gone (even SIGKILLed)
    child_env[TITAN_RUN_DIR] = str(run_dir.path)
    child_env[TITAN_NODE_ID] = node
    if settings_json is not None:
        child_env[TITAN_SETTINGS_JSON] = settings_json
    log_path = Path(log_file) if log_file else run_dir.path / f"agent.{node}.log"
    with open(log_path, "ab") as log:
        return subprocess.Popen(agent_command(run_dir, node, prometheus_port=prometheus_port), env=child_env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def stop_agent(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> int:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns the exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
    return proc.returncode
