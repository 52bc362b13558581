"""In-memory snapshots in /dev/shm, both tiers: per-step (crash recovery) and SDC-verified (rollback).

Restart from the last step bitwise, torn or corrupt slots ignored, a lost tier falls back to
disk and says why, a rollback with SDC on never uses the unverified per-step tier.
"""

from __future__ import annotations

import json

import pytest
import torch

from titan.checkpoint import Checkpointer
from titan.checkpoint.snapshot import SnapshotStore
from titan.checkpoint.stepsnap import StepSnapshots

from _ckpt_model import build, context, events, params, same, train_steps

pytestmark = pytest.mark.timeout(60)


def _ctx(tmp_path, **extra):
    return context(tmp_path / "run", every_steps=4, mode="sync", snapshot_every_steps=1,
                   snapshot_dir=str(tmp_path / "shm"), env_extra={"TITAN_SDC_ENABLED": "false", **extra})


def _state(st):
    """Everything a resumed run must get back: parameters, optimizer moments, schedule, data position."""
    opt = st["optim"]
    moments = [t.clone() for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    return params(st), moments, st["sched"].state_dict()["last_epoch"], st["sampler"].consumed


def _equal(a, b):
    return same(a[0], b[0]) and same(a[1], b[1]) and a[2:] == b[2:]


def test_rollback_without_sdc_uses_the_per_step_tier(tmp_path):
    ctx = _ctx(tmp_path)
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 3, ck)
    at3 = params(st)
    train_steps(st, 3, 4)  # a "bad" step, not snapshotted
    assert not same(params(st), at3)
    assert ck.rollback(st) == 3
    assert same(params(st), at3) and st["sampler"].consumed == 12
    space = events(tmp_path / "run", "ckpt.snapshot_space")
    assert [e.data["tier"] for e in space] == ["step"] and space[0].data["total_bytes"] > 0


def test_restart_resumes_from_the_last_step_bitwise_then_continues_identically(tmp_path):
    ctx = _ctx(tmp_path)
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 6, ck)  # disk at 4, per-step snapshots at 5 and 6
    at6 = _state(st)
    ck.close()
    clean = train_steps(st, 6, 9)  # the uninterrupted continuation
    end_clean = _state(st)
    st2 = build(seed=1)  # a new process: other weights, other RNG
    ck2 = Checkpointer(ctx)
    assert ck2.restore(st2) == 6, "the per-step snapshot (6) was not used over disk (4)"
    assert _equal(_state(st2), at6), "the state restored from memory differs from the state after step 6"
    (loaded,) = events(tmp_path / "run", "ckpt.loaded")
    assert loaded.data["source"] == "snapshot:restart" and loaded.data["tier"] == "step", loaded.data
    assert train_steps(st2, 6, 9) == clean, "the continuation after the restore diverged (RNG or data position)"
    assert _equal(_state(st2), end_clean)


def test_torn_and_corrupt_slots_are_ignored_and_a_lost_tier_falls_back_to_disk(tmp_path):
    ctx = _ctx(tmp_path)
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 6, ck)
    ck.close()
    tier = Checkpointer(ctx).step_tier()
    assert isinstance(tier, StepSnapshots) and tier.dir.is_relative_to(tmp_path / "shm")
    assert tier.valid_steps() == [5, 6]
    newest = next(s for s in tier._slots if json.loads(s.marker.read_text())["step"] == 6)
    with open(newest.bin, "r+b") as f:  # one flipped byte in the tensor data
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0x40]))
    assert tier.valid_steps() == [5], "a slot with a flipped byte passed its checksum"
    st5 = build(seed=2)
    assert Checkpointer(ctx).restore(st5) == 5
    # Memory gone (a reboot, a replacement node): the disk checkpoint, and the event says why.
    for s in tier._slots:
        s.close()
    import shutil

    shutil.rmtree(tier.dir)
    st4 = build(seed=3)
    assert Checkpointer(ctx).restore(st4) == 4
    disk = [e for e in events(tmp_path / "run", "ckpt.loaded") if e.data["source"] == "disk"]
    assert disk and "no valid per-step snapshot" in (disk[-1].data.get("memory") or ""), [e.data for e in disk]


def test_a_snapshot_that_does_not_fit_is_rejected_and_newer_slots_go_after_an_older_restore(tmp_path):
    ctx = _ctx(tmp_path)
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 6, ck)
    ck.close()
    # Another model (a changed script): the snapshot is refused before anything is modified,
    # and the disk checkpoint does not fit either — loud, never a silent partial load.
    other = build()
    other["model"] = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
    other["optim"] = torch.optim.AdamW(other["model"].parameters(), lr=1e-2)
    other["sched"] = torch.optim.lr_scheduler.StepLR(other["optim"], 2)
    with pytest.raises(BaseException):
        Checkpointer(ctx).restore(other)
    (rejected,) = events(tmp_path / "run", "ckpt.snapshot_rejected")
    assert "SnapshotMismatch" in rejected.data["reasons"][0], rejected.data
    # A run resumed from an older state must not keep slots of a step it has not reached.
    tier = Checkpointer(ctx).step_tier()
    tier.discard_newer_than(5)
    assert tier.valid_steps() == [5]


def test_with_sdc_on_a_rollback_uses_only_the_verified_tier(tmp_path):
    ctx = _ctx(tmp_path, TITAN_SDC_ENABLED="true")
    st = build()
    ck = Checkpointer(ctx)
    ck.enable_snapshots()  # what titan.sdc does: the verified tier, written on agreeing rounds
    train_steps(st, 0, 2, ck)
    ck.snapshot(2, st)  # an agreeing round at step 2
    at2 = params(st)
    train_steps(st, 2, 5, ck)  # per-step snapshots 3..5, unverified
    assert ck.step_tier().valid_steps() == [4, 5]
    assert ck.rollback(st) == 2, "the rollback used an unverified per-step snapshot"
    assert same(params(st), at2)
    assert isinstance(ck._snap, SnapshotStore)


def test_the_tier_turns_itself_off_when_the_state_would_not_fit(tmp_path):
    ctx = _ctx(tmp_path, TITAN_CHECKPOINT_SNAPSHOT_MAX_FRACTION="0.01")
    st = build()
    st["model"].add_module("big", torch.nn.Linear(1, 1))
    st["ballast"] = torch.nn.Linear(1, 1)
    tier = Checkpointer(ctx).step_tier()
    tier.max_fraction = 1e-12  # any state is too big for this budget
    ck = Checkpointer(ctx)
    ck._steps = tier
    train_steps(st, 0, 2, ck)
    (off,) = events(tmp_path / "run", "ckpt.snapshot_off")
    assert "would not fit" in off.data["reason"] and ck.step_tier() is None
    assert not tier.dir.exists(), "the tier left its files behind when it turned off"


def test_discard_snapshots_frees_both_tiers(tmp_path):
    ctx = _ctx(tmp_path)
    st = build()
    ck = Checkpointer(ctx)
    ck.enable_snapshots()
    train_steps(st, 0, 2, ck)
    ck.snapshot(2, st)
    tier = ck.step_tier()
    assert tier.valid_steps() == [1, 2] and ck._snap.valid_steps() == [2]
    ck.discard_snapshots()
    assert not tier.dir.exists() and not ck._snap.dir.exists(), "discard_snapshots left tmpfs files behind"


def test_maybe_save_marks_ckpt_step_and_only_a_disk_save_is_checkpoint(tmp_path):
    """The per-step call is ``ckpt_step`` (learned), its snapshot ``snapshot`` (learned once
    warm) and only the disk save ``checkpoint`` (budgeted): a rank stuck in the per-step part
    is judged like any per-step phase (docs/hang.md), not given the 120 s save budget."""
    from titan.beacon import Beacon, read_beacon, set_beacon

    b = Beacon(tmp_path / "b.bcn", rank=0, local_rank=0, world=1, attempt=0, node="n")
    set_beacon(b)
    try:
        ck = Checkpointer(_ctx(tmp_path))
        st = build()
        ck.restore(st)
        train_steps(st, 0, 8, ck)  # every_steps=4: disk saves at 4 and 8; a snapshot each step
        ck.close()
    finally:
        set_beacon(None)
    ring = [p for p, _ in read_beacon(b.path).phase_ring if p in ("ckpt_step", "snapshot", "checkpoint")]
    per_step = ["snapshot", "ckpt_step"]
    save_step = ["checkpoint", "snapshot", "ckpt_step"]
    want = per_step * 3 + save_step + per_step * 3 + save_step + ["checkpoint"]  # + close()'s wait
    assert ring == want, ring
