"""Run the reference workload under real torchrun, optionally SIGKILLing ranks at steps."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_events(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((run_dir / "events").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            out.append(e)
    return sorted(out, key=lambda e: e["t"])


def losses(run_dir: Path) -> dict[int, float]:
    """Rank 0's loss per step; a step replayed after a restart keeps its last value."""
    return {e["step"]: e["data"]["loss"] for e in step_events(run_dir) if e["kind"] == "step" and e["rank"] == 0}


def run_workload(run_dir: Path, nproc: int, args: list[str], *, kills: list[tuple[int, int, int]] = (),
                 env: dict[str, str] | None = None, timeout_s: float = 120, max_restarts: int = 3,
                 before_kill: Callable[[int], None] | None = None) -> subprocess.CompletedProcess:
    """torchrun ``nproc`` workers of tinygpt; ``kills`` = [(attempt, step, rank)]: SIGKILL
    ``rank`` of that attempt once it has emitted step >= ``step``. ``before_kill(rank)`` runs
    while that rank is stopped (SIGSTOP), just before its SIGKILL: what it does to the rank's
    files cannot race the rank's own writes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    e = dict(os.environ)
    e.update({"TITAN_RUN_DIR": str(run_dir), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
              "TITAN_CHECKPOINT_SAVE_ON_SIGTERM": "true", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    e.update(env or {})
    cmd = [PY, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
           "--monitor-interval=0.1", f"--master-port={free_port()}",
           "-m", "titan.workloads.tinygpt", "--threads", "1", "--no-guard", "--log-every", "0", *args]
    log = open(run_dir / "torchrun.log", "wb")
    proc = subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    pending = list(kills)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"workload did not finish in {timeout_s}s: {(run_dir / 'torchrun.log').read_text()[-2000:]}")
            if pending:
                attempt, step, rank = pending[0]
                evs = step_events(run_dir)
                # Kill only once this attempt has something to resume from (a committed save
                # or a load): an async save can still be writing when its step has passed.
                ready = any(e["kind"] in ("ckpt.saved", "ckpt.loaded") and e["attempt"] == attempt and e["rank"] == 0
                            for e in evs)
                for ev in reversed(evs if ready else []):
                    if ev["kind"] == "step" and ev["rank"] == rank and ev["attempt"] == attempt and ev["step"] >= step:
                        if before_kill is not None:
                            os.kill(ev["pid"], signal.SIGSTOP)
                            before_kill(rank)
                        os.kill(ev["pid"], signal.SIGKILL)
                        pending.pop(0)
                        break
            time.sleep(0.05)
        return subprocess.CompletedProcess(cmd, proc.returncode)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers (own session)
            proc.wait(10)
        log.close()


def load_out(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def bitwise_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    return [k for k in a if not torch.equal(a[k], b[k])]
