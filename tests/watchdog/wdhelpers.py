"""Helpers: real ``titan run`` jobs of ``hang_worker.py`` (2 ranks, gloo) for the watchdog tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKER = HERE / "hang_worker.py"
TITAN = Path(sys.executable).with_name("titan")


def run_titan(tmp: Path, run_id: str, worker_args: list[str], *, sets: tuple[str, ...] = (), timeout: float = 240,
              extra: list[str] | None = None, env: dict[str, str] | None = None,
              nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """``titan run`` as a subprocess in its own process group, killed whole on timeout."""
    e = dict(os.environ)
    e.setdefault("TITAN_WATCHDOG_LEDGER_PATH", str(tmp / "ledger.sqlite"))
    e.update(env or {})
    argv = [str(TITAN), "run", "--nproc-per-node", str(nproc), "--runs-dir", str(tmp / "runs"), "--run-id", run_id,
            *(extra or [])]
    for s in sets:
        argv += ["--set", s]
    argv += ["--", str(WORKER), *worker_args]
    p = subprocess.Popen(argv, cwd=tmp, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        _kill_workers(tmp / "runs" / run_id)
        raise AssertionError(f"titan run {run_id} did not finish within {timeout}s:\n{out[-3000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    _kill_workers(tmp / "runs" / run_id)
    return subprocess.CompletedProcess(argv, p.returncode, out, "")


def _kill_workers(rd: Path) -> None:
    """Workers survive a SIGKILLed launcher: end any still alive, by the pids in their beacons."""
    from titan.beacon import scan_beacons
    from titan.watchdog.evidence import kill_workers

    kill_workers(scan_beacons(rd / "beacons"))


def events(rd: Path, kind: str) -> list[dict[str, Any]]:
    out = []
    for f in sorted((rd / "events").glob("*.jsonl")) + sorted(rd.glob("launcher.*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("kind") == kind:
                out.append(e)
    return sorted(out, key=lambda e: e["t"])


