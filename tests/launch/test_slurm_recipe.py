"""docs/launch.md's Slurm recipe, as written, on a real two-node Slurm (scripts/slurm_cluster.py:
munged, slurmctld, two slurmd, each with a private folder at one path — node-local disks).

Submitted with `sbatch` overriding only #SBATCH options on its command line and the recipe's
documented TRAIN_* variables; a training rank on n2 is SIGKILLed after a checkpoint; both nodes
must restart, resume from it and finish; each node's run directory lives in its own private
folder only; `titan gather` of the two gives one run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from titan.events import read_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm_cluster.py"
STEPS, EVERY = 30, 5
_MISSING = next((b for b in ("munged", "slurmctld", "slurmd", "sbatch") if not shutil.which(b)
                 and not Path("/usr/sbin", b).exists()), None)

pytestmark = [
    pytest.mark.multinode,
    pytest.mark.skipif(os.geteuid() != 0, reason="slurmd in mount namespaces needs root"),
    pytest.mark.skipif(_MISSING is not None, reason=f"{_MISSING} not installed (apt-get install slurm-wlm munge)"),
]


def recipe() -> str:
    """The ```bash block under '### Slurm' in docs/launch.md, unchanged."""
    doc = (ROOT / "docs" / "launch.md").read_text()
    sec = doc[doc.index("### Slurm\n"):]
    m = re.search(r"```bash\n(.*?)```", sec, re.S)
    assert m, "docs/launch.md has no bash block under '### Slurm'"
    return m.group(1)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _events(run_dir: Path, kind: str | None = None) -> list[Any]:
    if not (run_dir / "run.json").exists():
        return []
    return [e for e in read_run(run_dir).events if kind is None or e.kind == kind]


@pytest.mark.slow  # a real Slurm, 2 nodes x 2 ranks, a restart: ~1.5 min at load 20 (make test-slow)
@pytest.mark.timeout(900)
def test_the_docs_slurm_recipe_runs_restarts_after_a_kill_resumes_and_gathers(tmp_path):
    # slurmstepd's socket path (<spool>/<node>_<job>.<step>) must fit in 108 bytes: a short base.
    d = Path(tempfile.mkdtemp(prefix="tsl", dir="/tmp"))
    private = tmp_path / "local"
    up = subprocess.run([sys.executable, str(SCRIPT), "up", "--dir", str(d), "--private", str(private)],
                        capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    env = dict(os.environ, **json.loads(up.stdout.strip().splitlines()[-1]))
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # `titan` of this checkout
    env.update(TRAIN_NPROC="2", TRAIN_RDZV_HOST="127.0.0.1", TRAIN_RDZV_PORT=str(_port()),
               TRAIN_RUNS_DIR=str(private / "titan-runs"),
               TRAIN_ARGS=f"--steps {STEPS} --ckpt-every {EVERY} --threads 1 --log-every 0 --seed 1")
    job = None
    try:
        script = tmp_path / "titan.sbatch"
        script.write_text(recipe())
        sub = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1",
                              "--time=10", f"--output={tmp_path}/slurm-%j.out", str(script)],
                             env=env, capture_output=True, text=True, timeout=60)
        assert sub.returncode == 0, sub.stdout + sub.stderr
        job = sub.stdout.strip().split(";")[0]
        runs = {n: d / "node" / n / "titan-runs" / f"slurm-{job}" for n in ("n1", "n2")}
        out = tmp_path / f"slurm-{job}.out"

        def log() -> str:
            return (out.read_text(errors="replace")[-4000:] if out.exists() else "(no job output yet)")

        # Wait until n2 committed a checkpoint and went past it, then SIGKILL one of its ranks.
        victim, saved = None, None
        end = time.monotonic() + 400
        while time.monotonic() < end and victim is None:
            evs = _events(runs["n2"])
            done = [int(e.data["step"]) for e in evs if e.kind == "ckpt.saved"]
            # Every event in n2's private folder is n2's (its ranks may be 0-1 or 2-3: group
            # ranks follow the rendezvous order).
            steps = [e for e in evs if e.kind == "step" and e.step is not None and e.rank is not None]
            if done and steps and steps[-1].step >= max(done) + 2:
                victim, saved = steps[-1].pid, max(done)
                break
            state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True)
            assert state.stdout.strip() in ("PENDING", "RUNNING", "CONFIGURING"), (state.stdout, log())
            time.sleep(0.3)
        assert victim, "n2 never saved a checkpoint and went past it:\n" + log()
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        end = time.monotonic() + 400
        while time.monotonic() < end:
            q = subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True)
            if not q.stdout.strip():
                break
            time.sleep(0.5)
        else:
            pytest.fail("the job did not finish:\n" + log())

        for n, rd in runs.items():
            rj = json.loads((rd / "run.json").read_text())
            assert rj.get("exit_code") == 0, f"{n}: run.json exit_code {rj.get('exit_code')}\n{log()}"
            assert rj["storage"]["kind"] == "node-local" and rj["storage"]["replicate"] == "disk", rj["storage"]
        assert not (private / "titan-runs").exists(), "a run directory appeared outside the nodes' private folders"
        evs = _events(runs["n2"])
        failed = [e for e in evs if e.kind == "worker.failed" and e.data.get("signal") == "SIGKILL"]
        assert failed, "the SIGKILLed rank was not recorded as failed"
        for n, rd in runs.items():
            ev = _events(rd)
            loaded = [e for e in ev if e.kind == "ckpt.loaded" and e.t > t_kill]
            assert loaded and int(loaded[0].data["step"]) == saved, f"{n} resumed from {loaded[:1]}, saved {saved}"
            last = max((e.step for e in ev if e.kind == "step" and e.step is not None), default=0)
            assert last == STEPS, f"{n} stopped at step {last}"

        gathered = tmp_path / "gathered"
        g = subprocess.run([sys.executable, "-m", "titan", "gather", str(gathered), str(runs["n1"]), str(runs["n2"]),
                            "--json"], env=env, capture_output=True, text=True, timeout=120)
        assert g.returncode == 0, g.stdout + g.stderr
        all_evs = read_run(gathered).events
        assert {e.node for e in all_evs if e.kind == "step"} == {"n1", "n2"}, "gather lost a node's steps"
        assert any(e.kind == "launcher.restart" for e in all_evs), "the gathered run shows no restart"
    finally:
        if job:
            subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30)
        subprocess.run([sys.executable, str(SCRIPT), "down", "--dir", str(d)], capture_output=True, timeout=60)
        shutil.rmtree(d, ignore_errors=True)
