"""In-memory snapshots in /dev/shm: rollback, restart from a newer snapshot, torn slots ignored."""

from __future__ import annotations

import pytest

from titan.checkpoint import Checkpointer
from titan.checkpoint.snapshot import SnapshotStore

from _ckpt_model import build, context, events, params, same, train_steps

pytestmark = pytest.mark.timeout(60)


def _ctx(tmp_path):
    # SDC (when enabled) requires snapshots on its verified rounds; this test snapshots every step.
    return context(tmp_path / "run", every_steps=4, mode="sync", snapshot_every_steps=1,
                   snapshot_dir=str(tmp_path / "shm"), env_extra={"TITAN_SDC_ENABLED": "false"})


def test_rollback_restores_the_snapshot_state(tmp_path):
    ctx = _ctx(tmp_path)
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 3, ck)
    at3 = params(st)
    train_steps(st, 3, 4)  # a "bad" step, not snapshotted
    assert not same(params(st), at3)
    assert ck.rollback(st) == 3
    assert same(params(st), at3) and st["sampler"].consumed == 12
    (space,) = events(tmp_path / "run", "ckpt.snapshot_space")
    assert space.data["total_bytes"] > 0


def test_restart_prefers_a_newer_snapshot_and_skips_a_torn_slot(tmp_path):
    ctx = _ctx(tmp_path)
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 6, ck)  # disk at 4, snapshots at 5 and 6
    at6 = params(st)
    ck.close()
    st2 = build(seed=1)
    assert Checkpointer(ctx).restore(st2) == 6, "the newer snapshot (6) was not used over disk (4)"
    assert same(params(st2), at6)
    # Tear the newest slot (a worker killed mid-write): the other slot (5) is used.
    store = Checkpointer(ctx)._snap  # the store's folder is keyed by run id and run directory
    assert isinstance(store, SnapshotStore) and store.dir.is_relative_to(tmp_path / "shm")
    slot = next(s for s in (0, 1) if (store._read_marker(s) or {}).get("step") == 6)
    data = store._data(slot)
    data.write_bytes(data.read_bytes()[:-10])
    assert store.valid_steps() == [5]
    ck = Checkpointer(ctx)
    assert ck.restore(build(seed=2)) == 5
    ck.discard_snapshots()
    assert not store.dir.exists(), "discard_snapshots left the tmpfs files behind"
