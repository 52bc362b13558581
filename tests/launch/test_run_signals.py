"""SIGTERM to `titan run` (a scheduler's preemption) stops the workers; the exit is PREEMPTED (9,
"saved and stopped") only when the preemption save is on disk, else INTERRUPTED with the reason."""

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
def test_sigterm_to_titan_run_stops_workers_that_saved_nothing_and_does_not_claim_a_save(tmp_path, worker_script):
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
        assert p.returncode == ExitCode.INTERRUPTED, f"nothing was saved: exit {p.returncode}\n{err[-2000:]}"
        res = json.loads(out)
        assert res["torchrun"]["signal"] == "SIGTERM" and res["preemption"]["saved"] is False, res
        assert "without a save on disk" in res["reason"], res["reason"]
        gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"workers left running: {alive}"
    finally:
        for w in workers:
            if w.is_running():
                w.kill()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def _start(tmp_path: Path, run_id: str, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([str(TITAN), "run", "--nproc-per-node", "2", "--max-restarts", "0", "--no-agent",
                             "--runs-dir", str(tmp_path / "runs"), "--run-id", run_id, "--", *argv], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_steps(rd: Path, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(f'"step":{n},' in f.read_text() for f in (rd / "events").glob("*.rank0.*.jsonl")):
            return
        time.sleep(0.1)
    raise AssertionError(f"no step {n} within {timeout:.0f}s")


IGNORES_SIGTERM = """
import signal, time
from titan.worker import WorkerContext
ctx = WorkerContext.from_env()
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a script that ignores the preemption notice
for step in range(1, 100000):
    ctx.events.emit("step", step=step)
    time.sleep(0.05)
"""


@pytest.mark.timeout(150)
def test_a_worker_that_ignored_sigterm_and_was_killed_after_the_grace_period_is_not_saved_and_stopped(tmp_path):
    script = tmp_path / "ignore.py"
    script.write_text(IGNORES_SIGTERM)
    p = _start(tmp_path, "ignored", str(script))
    try:
        _wait_steps(tmp_path / "runs" / "ignored", 3, 60)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)  # torchelastic's grace period (30 s), then SIGKILL
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    assert p.returncode != ExitCode.PREEMPTED, f"exit 9 claims a save that never happened:\n{err[-2000:]}"
    assert p.returncode == ExitCode.INTERRUPTED, f"exit {p.returncode}\n{err[-2000:]}"
    final = [ln for ln in err.splitlines() if ln.startswith("titan run: INTERRUPTED")]
    assert final and "without a save on disk" in final[0], err[-1500:]


@pytest.mark.timeout(200)
def test_a_worker_that_saves_on_sigterm_exits_preempted_with_the_checkpoint_on_disk(tmp_path):
    rd = tmp_path / "runs" / "saved"
    p = _start(tmp_path, "saved", "-m", "titan.workloads.tinygpt", "--steps", "100000", "--ckpt-every", "1000",
               "--threads", "1", "--log-every", "0")
    try:
        _wait_steps(rd, 5, 120)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    assert p.returncode == ExitCode.PREEMPTED, f"exit {p.returncode}\n{err[-2000:]}"
    meta = json.loads((rd / "run.json").read_text())
    pre = meta["preemption"]
    assert pre["saved"] and Path(pre["path"], "manifest.json").is_file(), pre
    assert Path(pre["path"]).name == f"step-{pre['step']:08d}", pre
