"""Run a preflight job on this node: torchrun with N local ranks, then read the verdict."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from titan.errors import TitanError
from titan.events import RunDir
from titan.settings.env import TITAN_NODE_ID, TITAN_RUN_DIR, TITAN_RUN_ID

__all__ = ["run_local", "PreflightError"]


class PreflightError(TitanError):
    """The preflight job could not run (as opposed to: it ran and found a problem)."""


def run_local(run_dir: RunDir, nproc: int, worker_args: Sequence[str], *, node_id: str,
              env: dict[str, str] | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
    """Launch ``nproc`` ranks through torchrun (one node, Titan's bound rendezvous) and return rank 0's verdict.

    Raises ``PreflightError`` when the job did not produce a verdict (crash, timeout).
    """
    env = dict(os.environ if env is None else env)
    env.update({TITAN_RUN_DIR: str(run_dir.path), TITAN_RUN_ID: run_dir.run_id, TITAN_NODE_ID: node_id})
    out = run_dir.path / "preflight.json"
    # torchrun with Titan's rendezvous: stores on loopback only, state signed (docs/security.md).
    cmd = [sys.executable, "-m", "titan.launch.local_torchrun", f"--nproc-per-node={nproc}",
           "--max-restarts=0", "-m", "titan.preflight.worker", *worker_args]
    log = open(run_dir.path / "preflight.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        raise PreflightError(f"preflight did not finish within {timeout_s:.0f}s (log: {log.name})") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers: our session
            proc.wait()
        log.close()
    if rc != 0 or not out.is_file():
        tail = Path(log.name).read_text(errors="replace").strip().splitlines()[-3:]
        raise PreflightError(f"preflight job failed (exit {rc}): {' | '.join(tail)}")
    return json.loads(out.read_text())
