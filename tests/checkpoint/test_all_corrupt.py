"""Every checkpoint corrupt: never a silent restart from step 0 (issue 15).

Before: each bad checkpoint was moved aside, then ``ckpt.none`` and training from step 0 —
``titan run`` exited 0. Now: ``ckpt.all_corrupt`` (critical) and a give-up (exit 3) unless
``checkpoint.allow_fresh_start``; a later restore that finds only moved-aside checkpoints
says the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from titan.checkpoint import Checkpointer
from titan.errors import TitanAbort
from titan.exitcodes import ExitCode

from _ckpt_model import build, context, events, train_steps

pytestmark = pytest.mark.timeout(60)
TITAN = Path(sys.executable).with_name("titan")


def _corrupt_all(root: Path) -> int:
    n = 0
    for shard in root.glob("step-*/*.distcp"):
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
        n += 1
    return n


def _saved(tmp_path: Path, **kw):
    ctx = context(tmp_path, every_steps=2, mode="sync", **kw)
    ck = Checkpointer(ctx)
    train_steps(build(), 0, 4, ck)
    ck.close()
    assert _corrupt_all(ctx.run_dir.checkpoints) >= 2
    return ctx


def test_every_checkpoint_corrupt_stops_with_gave_up_and_says_so(tmp_path):
    _saved(tmp_path)
    with pytest.raises(TitanAbort) as ei:
        Checkpointer(context(tmp_path)).restore(build(seed=5))
    assert ei.value.exit_code == ExitCode.GAVE_UP and "allow_fresh_start" in ei.value.message + ei.value.hint
    (lost,) = events(tmp_path, "ckpt.all_corrupt")
    assert lost.level == "critical" and lost.data["checkpoints"] == 2 and lost.data["fresh_start"] is False, lost.data
    assert not events(tmp_path, "ckpt.none"), "the run must not look like a fresh start"
    # A second restore finds only the moved-aside checkpoints: still not a quiet fresh start.
    with pytest.raises(TitanAbort):
        Checkpointer(context(tmp_path)).restore(build(seed=5))
    assert sorted(e.data["moved_before"] for e in events(tmp_path, "ckpt.all_corrupt")) == [0, 2]


def test_allow_fresh_start_trains_from_zero_but_says_so(tmp_path):
    _saved(tmp_path)
    start = Checkpointer(context(tmp_path, allow_fresh_start="true")).restore(build(seed=5))
    assert start == 0
    (lost,) = events(tmp_path, "ckpt.all_corrupt")
    assert lost.data["fresh_start"] is True and "restarting from step 0" in lost.msg, lost


def _titan_run(tmp_path: Path, steps: int, *sets: str) -> subprocess.CompletedProcess:
    cmd = [str(TITAN), "run", "--nproc-per-node", "2", "--max-restarts", "0", "--no-agent", "--runs-dir",
           str(tmp_path / "runs"), "--run-id", "lost", *sets, "--", "-m", "titan.workloads.tinygpt", "--steps",
           str(steps), "--ckpt-every", "4", "--threads", "1", "--log-every", "0"]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=170, start_new_session=True)


@pytest.mark.timeout(400)
def test_titan_run_with_every_checkpoint_corrupt_is_loud_and_non_zero(tmp_path):
    first = _titan_run(tmp_path, 8)
    assert first.returncode == 0, first.stderr[-2000:]
    assert _corrupt_all(tmp_path / "runs" / "lost" / "checkpoints") >= 2
    p = _titan_run(tmp_path, 12)  # the same run directory again: a resume that finds only corrupt checkpoints
    assert p.returncode == ExitCode.GAVE_UP, f"expected exit 3, saw {p.returncode}:\n{p.stderr[-2500:]}"
    final = [ln for ln in p.stderr.splitlines() if ln.startswith("titan run: GAVE_UP")]
    assert final and "every checkpoint (2) was corrupt" in final[0], p.stderr[-1500:]
    allowed = _titan_run(tmp_path, 12, "--set", "checkpoint.allow_fresh_start=true")
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    final = [ln for ln in allowed.stderr.splitlines() if ln.startswith("titan run: SUCCEEDED")]
    assert final and "training restarted from step 0" in final[0], allowed.stderr[-1500:]
    meta = json.loads((tmp_path / "runs" / "lost" / "run.json").read_text())
    assert meta["all_checkpoints_corrupt"] and meta["all_checkpoints_corrupt"][0]["fresh_start"] is True, meta
