"""Measure (4): in-memory capture stall per step on the 100m preset — Titan's /dev/shm
per-step tier (and its verified SDC tier) vs GEMINI's capture vs DCP ``async_save``
(``scripts/capture_worker.py``).

Each system runs 2 ranks under its own launcher in its own environment, one after the
other (never concurrently: they would share the two cores). A capture's stall is the
slowest rank's (the next collective waits for it).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from peers.systems import free_port, run_bounded
from peers.venvs import HERE, ROOT, load_config, python_for, status

__all__ = ["CAPTURES", "run_capture"]

#: capture system -> (config whose environment runs it, launcher)
CAPTURES = {"titan_step": ("titan", "titan"), "titan": ("titan", "titan"), "gemini": ("lm_resiliency", "torchrun"), "dcp_async": ("torchrun", "torchrun")}


def _one(name: str, job_dir: Path, captures: int, gap_s: float, preset: str, timeout_s: float) -> dict[str, Any]:
    cfg_name, launcher = CAPTURES[name]
    cfg = load_config(cfg_name)
    st = status(cfg)
    if not st["ok"]:
        return {"skipped": st["reason"]}
    job_dir.mkdir(parents=True, exist_ok=True)
    py = str(python_for(cfg))
    worker = [str(HERE / "scripts" / "capture_worker.py"), "--system", name, "--captures", str(captures),
              "--gap-s", str(gap_s), "--preset", preset, "--dir", str(job_dir)]
    if launcher == "titan":
        cmd = [py, "-m", "titan", "run", "--nproc-per-node", "2", "--no-agent", "--runs-dir", str(job_dir / "runs"),
               "--run-id", "capture", "--set", f"watchdog.ledger_path={job_dir / 'ledger.sqlite'}",
               "--set", "watchdog.enabled=false", "--set", "checkpoint.every_steps=0",
               "--set", f"checkpoint.snapshot_every_steps={1 if name == 'titan_step' else 0}", "--", *worker]
    else:
        cmd = [py, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{free_port()}", *worker]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("TITAN_", "PEERS_"))},
           "PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'bench'}", "PEERS_LOG_DIR": str(job_dir),
           "XDG_STATE_HOME": str(job_dir / "state"), "CUDA_VISIBLE_DEVICES": "", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    t0 = time.monotonic()
    rc = run_bounded(cmd, cwd=job_dir, env=env, out=job_dir / "launcher.out", timeout_s=timeout_s)
    ranks = [json.loads(f.read_text()) for f in sorted(job_dir.glob("capture.rank*.json"))]
    if len(ranks) < 2:
        tail = (job_dir / "launcher.out").read_text(errors="replace")[-800:]
        return {"error": f"exit {rc}; rank results {len(ranks)}/2", "tail": tail}
    n = min(len(r["rows"]) for r in ranks)
    stalls = [max(r["rows"][i]["stall_s"] for r in ranks) for i in range(n)]
    waits = [max(r["rows"][i]["wait_s"] for r in ranks) for i in range(n)]
    return {"stall_s": round(statistics.median(stalls), 4), "stall_max_s": round(max(stalls), 4),
            "wait_s": round(statistics.median(waits), 4), "captures": n, "bytes_per_rank": ranks[0]["bytes"],
            "memcpy_floor_s": round(statistics.median(r["floor_s"] for r in ranks), 4),
            "stall_per_floor": round(statistics.median(stalls) / max(1e-9, statistics.median(r["floor_s"] for r in ranks)), 2),
            "wall_s": round(time.monotonic() - t0, 1), "versions": st["versions"]}


def run_capture(root: Path, *, captures: int, gap_s: float = 2.0, preset: str = "100m",
                timeout_s: float = 600, systems: list[str] | None = None) -> dict[str, Any]:
    """``{capture system: {stall_s, wait_s, memcpy_floor_s, …} | {"skipped": why}}`` for
    ``systems`` (default: every one of :data:`CAPTURES`)."""
    return {name: _one(name, root / f"capture-{name}", captures, gap_s, preset, timeout_s)
            for name in (systems or CAPTURES)}
