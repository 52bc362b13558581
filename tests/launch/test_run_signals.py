"""SIGTERM to `titan run` (a scheduler's preemption) stops the workers and exits PREEMPTED."""

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

from titan.exitcodes import ExitCode

TITAN = Path(sys.executable).with_name("titan")


@pytest.mark.timeout(90)
def test_sigterm_to_titan_run_stops_workers_and_exits_preempted(tmp_path, worker_script):
    p = subprocess.Popen([str(TITAN), "run", "--nproc-per-node", "2", "--run-id", "pre", "--json", "--",
                          str(worker_script), repr({"default": "sleep"})], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        events = tmp_path / "runs" / "pre" / "events"
        while time.monotonic() < deadline and len(list(events.glob("*.jsonl"))) < 2:
            time.sleep(0.1)
        workers = [c for c in psutil.Process(p.pid).children()  # the node agent is a child too
                   if c.is_running() and str(worker_script) in " ".join(c.cmdline())]
        assert len(workers) == 2, f"expected 2 workers, saw {workers}"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        assert p.returncode == ExitCode.PREEMPTED, f"exit {p.returncode}\n{err[-2000:]}"
        assert json.loads(out)["torchrun"]["signal"] == "SIGTERM"
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers left running: {alive}"
    finally:
        for w in workers:
            if w.is_running():
                w.kill()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
