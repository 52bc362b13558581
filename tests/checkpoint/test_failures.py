"""A full disk fails one save cleanly; SIGTERM saves the current step and exits 9."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from titan.checkpoint import Checkpointer
from titan.checkpoint.manifest import list_committed, verify

from _ckpt_model import build, context, events, train_steps
from _tmpfs import mounted_tmpfs

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def small_fs(tmp_path):
    with mounted_tmpfs(tmp_path / "mnt", "2m") as mnt:
        yield mnt


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_full_disk_fails_the_save_training_continues_older_intact(tmp_path, small_fs, mode):
    ctx = context(tmp_path / "run", every_steps=1, mode=mode, keep_last=50, dir=str(small_fs))
    st = build()
    width = 5000  # ~600 KB per checkpoint (weights + two AdamW moments): the 4th does not fit
    st["model"][0] = torch.nn.Linear(8, width)
    st["model"][2] = torch.nn.Linear(width, 1)
    st["optim"] = torch.optim.AdamW(st["model"].parameters(), lr=1e-2)
    st["sched"] = torch.optim.lr_scheduler.StepLR(st["optim"], 2)
    ck = Checkpointer(ctx)
    losses = train_steps(st, 0, 6, ck)
    ck.close()
    assert len(losses) == 6, "training did not go on after the failed save"
    failed = events(tmp_path / "run", "ckpt.failed")
    assert failed, "no ckpt.failed event on a full disk"
    assert failed[0].data["kind"] == "disk_full", f"expected disk_full, got {failed[0].data}"
    assert "free_bytes" in failed[0].data
    committed = list_committed(small_fs)
    assert len(committed) >= 2, f"older checkpoints missing: {committed}"
    for step, path in committed:
        assert verify(path).ok, f"{path.name} damaged by the failed save: {verify(path).reason}"
    assert not list(small_fs.glob("*.partial")), "the failed save's partial directory was left behind"
    st2 = build(seed=3)
    st2.update({k: st[k] for k in ("model", "optim", "sched")})
    assert Checkpointer(ctx).restore(st2) == committed[-1][0]


SCRIPT = r'''
import sys, time
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from titan.checkpoint import Checkpointer
from _ckpt_model import build, context
st = build()
ck = Checkpointer(context(Path(sys.argv[1]), every_steps=1000, mode="async", save_on_sigterm="true"))
start = ck.restore(st)
import random, numpy as np
step = start
print("ready", flush=True)
while True:
    step += 1
    x = st["sampler"].batch(4)
    st["model"](x).pow(2).mean().backward()
    st["optim"].step(); st["optim"].zero_grad(); st["sched"].step(); st["sampler"].consumed += 4
    time.sleep(0.01)
    ck.maybe_save(step, st)
'''


def test_sigterm_saves_current_step_and_exits_preempted(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(run), str(Path(__file__).parent)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 9, f"expected exit 9 (PREEMPTED), got {rc}: {proc.stderr.read()[-2000:]}"
    (pre,) = events(run, "ckpt.preempted")
    saved = events(run, "ckpt.saved")
    assert saved and saved[-1].data["step"] == pre.data["step"], "no checkpoint at the preempted step"
    st = build()
    start = Checkpointer(context(run)).restore(st)
    assert start == pre.data["step"] and st["sampler"].consumed == 4 * start
