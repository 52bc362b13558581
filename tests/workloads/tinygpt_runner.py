"""Run tinygpt in real subprocesses (1 process, or N ranks under torch.distributed.run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from titan.events import read_run

PY = sys.executable


def _clean_env(run_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TITAN_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")}
    env["TITAN_RUN_DIR"] = str(run_dir)
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def _spawn(run_dir: Path, args: list[str], nproc: int) -> subprocess.Popen:
    mod = ["-m", "titan.workloads.tinygpt", *args]
    cmd = [PY, *mod] if nproc == 1 else [
        PY, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone", *mod]
    return subprocess.Popen(cmd, env=_clean_env(run_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def run_many(jobs: list[tuple[Path, list[str]]], *, nproc: int = 1, timeout: float = 120) -> list[str]:
    """Run several tinygpt jobs concurrently (each to completion, exit 0 expected); returns
    their outputs. Every process group still alive at the end is SIGKILLed."""
    procs = [_spawn(run_dir, args, nproc) for run_dir, args in jobs]
    outs: list[str] = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"tinygpt exited {proc.returncode}, expected 0; output:\n{out[-3000:]}"
            outs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return outs


def run_tinygpt(run_dir: Path, args: list[str], *, nproc: int = 1, timeout: float = 120) -> str:
    """Run tinygpt to completion (exit 0 expected); returns its output."""
    return run_many([(run_dir, args)], nproc=nproc, timeout=timeout)[0]


def step_data(run_dir: Path) -> dict[int, list[tuple[int, dict]]]:
    """``{rank: [(step, data), ...]}`` of the run's ``step`` events."""
    out: dict[int, list[tuple[int, dict]]] = {}
    for ev in read_run(run_dir).events:
        if ev.kind == "step":
            out.setdefault(ev.rank, []).append((ev.step, ev.data))
    return out


