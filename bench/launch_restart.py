"""Restart reliability of `titan run`: torchrun's shared TCP store vs Titan's fix, side by side.

Each trial: `titan run --nproc-per-node 2 --max-restarts 3` of a script that forms a gloo
group with plain `init_process_group` (no Titan PrefixStore, so only the launcher's setting
differs), all-reduces, and in attempt 0 rank 1 SIGKILLs itself. A trial is *clean* when the
job succeeds with exactly one restart. Reported per configuration: clean/failed/hung trials,
restarts used, and kill → first all-reduce of the new attempt (seconds).

    .venv/bin/python bench/launch_restart.py --trials 5 [--timeout 120]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from titan.events import read_run

SCRIPT = textwrap.dedent('''
    import os, signal, time
    import torch, torch.distributed as dist
    from titan.worker import WorkerContext
    ctx = WorkerContext.from_env()
    dist.init_process_group("gloo")
    t = torch.ones(1); dist.all_reduce(t)
    ctx.events.emit("bench.allreduce", data={"value": float(t.item())})
    if ctx.attempt == 0 and ctx.rank == 1:
        time.sleep(0.5)
        ctx.events.emit("bench.kill")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)
    dist.barrier()
''')


def trial(root: Path, fix: bool, i: int, timeout: float) -> dict:
    script = root / "s.py"
    script.write_text(SCRIPT)
    run_id = f"{'fix' if fix else 'shared'}-{i}"
    env = {**os.environ, "TITAN_WATCHDOG_LEDGER_PATH": str(root / "ledger.sqlite"),
           "TITAN_WATCHDOG_STRIKE_LIMIT": "100000"}
    cmd = [sys.executable, "-m", "titan", "run", "--nproc-per-node", "2", "--max-restarts", "3", "--json",
           "--runs-dir", str(root / "runs"), "--run-id", run_id,
           "--set", f"run.disable_shared_rdzv_store={'true' if fix else 'false'}", "--", str(script)]
    p = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         start_new_session=True)
    hung = False
    try:
        p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(p.pid, signal.SIGKILL)  # launcher and its workers share the session's group
        p.wait(10)
    evs = read_run(root / "runs" / run_id).events
    restarts = sum(e.kind == "launcher.restart" for e in evs)
    kill = [e.t for e in evs if e.kind == "bench.kill"]
    after = [e.t for e in evs if e.kind == "bench.allreduce" and (e.attempt or 0) > 0]
    return {"ok": p.returncode == 0 and not hung, "hung": hung, "restarts": restarts,
            "clean": p.returncode == 0 and restarts == 1,
            "kill_to_allreduce_s": (min(after) - kill[0]) if kill and after else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for fix in (True, False):
            rows = [trial(Path(d), fix, i, a.timeout) for i in range(a.trials)]
            lat = [r["kill_to_allreduce_s"] for r in rows if r["clean"] and r["kill_to_allreduce_s"]]
            out["fix (fresh bound worker store per round)" if fix else "torchrun default (shared store)"] = {
                "trials": a.trials, "clean": sum(r["clean"] for r in rows), "succeeded": sum(r["ok"] for r in rows),
                "hung": sum(r["hung"] for r in rows), "restarts": [r["restarts"] for r in rows],
                "kill_to_first_allreduce_s_median": round(statistics.median(lat), 2) if lat else None,
            }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
