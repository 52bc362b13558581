"""The durable tier (``checkpoint.persist_every_steps`` / ``persist_dir``), in one process: every
K-th checkpoint copied to a folder or an fsspec URL, retention there, and a restore from it when
the local checkpoints are gone — bitwise; a damaged durable copy is refused and an older one
used; bad settings are one line. The node-local case (both nodes' folders lost) is in
``test_nodelocal.py``."""

from __future__ import annotations

import shutil

import pytest

from titan.checkpoint import Checkpointer
from titan.checkpoint.durable import DurableError, DurableTier
from titan.checkpoint.manifest import list_committed, read_manifest, verify
from titan.errors import UserError
from titan.settings import load_settings

from _ckpt_model import build, context, events, params, same, train_steps

pytestmark = pytest.mark.timeout(120)


def _where(tmp_path, kind: str) -> str:
    d = tmp_path / "durable"
    return d.as_uri() if kind == "url" else str(d)


@pytest.mark.parametrize("kind", ["folder", "url"])
def test_every_kth_checkpoint_is_persisted_pruned_and_restored_bitwise_when_local_ones_are_gone(tmp_path, kind):
    ref = build()
    train_steps(ref, 0, 12)
    where = _where(tmp_path, kind)
    run = tmp_path / "run"
    ctx = context(run, every_steps=2, mode="async", persist_every_steps=4, persist_dir=where, persist_keep_last=2)
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 9, ck)  # saves 2..8; durable 4 and 8; "crashes" after step 9
    ck.close()
    tier = DurableTier(where)
    held = tier.steps()
    assert sorted(held) == [4, 8], f"durable tier holds {sorted(held)}, expected 4 and 8 (every 4th)"
    assert held[8]["files"] == read_manifest(run / "checkpoints" / "step-00000008")["files"], "not the same manifest"
    persisted = events(run, "ckpt.persisted")
    assert [e.data["step"] for e in persisted] == [4, 8] and all(e.data["bytes"] > 0 for e in persisted), persisted
    assert not events(run, "ckpt.persist_failed")

    shutil.rmtree(run / "checkpoints")  # the node's disk is gone
    st2 = build(seed=99)
    ck2 = Checkpointer(ctx)
    start = ck2.restore(st2)
    assert start == 8, f"expected a resume from the durable step 8, got {start}"
    (loaded,) = events(run, "ckpt.loaded")
    assert loaded.data["source"] == "durable" and "durable storage" in loaded.msg, loaded
    assert verify(run / "checkpoints" / "step-00000008").ok, "the fetched copy is not committed here"
    train_steps(st2, start, 12, ck2)
    ck2.close()
    assert same(params(st2), params(ref)), "resumed from the durable tier, the final state differs"
    assert sorted(tier.steps()) == [8, 12], f"retention of the durable tier: {sorted(tier.steps())}"


def test_a_damaged_durable_copy_is_refused_and_the_previous_one_used(tmp_path):
    where = str(tmp_path / "durable")
    run = tmp_path / "run"
    ctx = context(run, every_steps=2, mode="sync", persist_every_steps=2, persist_dir=where, persist_keep_last=3)
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 4, ck)
    ck.close()
    shard = next((tmp_path / "durable" / "step-00000004").glob("*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    shutil.rmtree(run / "checkpoints")
    start = Checkpointer(ctx).restore(build(seed=5))
    assert start == 2, f"the damaged step 4 should be refused and step 2 used, got {start}"
    bad = [e for e in events(run, "ckpt.corrupt") if e.data.get("tier") == "durable"]
    assert bad and "CRC-32" in bad[0].data["reasons"][0], [e.data for e in events(run, "ckpt.corrupt")]
    assert [s for s, _ in list_committed(run / "checkpoints")] == [2], "a torn copy of step 4 was committed"


def test_a_durable_copy_that_fails_is_a_warning_and_the_local_checkpoint_stands(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")  # persist_dir below a regular file: every copy fails
    run = tmp_path / "run"
    ctx = context(run, every_steps=2, mode="async", persist_every_steps=2, persist_dir=str(blocker / "d"))
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 4, ck)
    ck.close()
    failed = events(run, "ckpt.persist_failed")
    assert [e.data["step"] for e in failed] == [2, 4] and all(e.level == "warning" for e in failed), failed
    assert [e.data["step"] for e in events(run, "ckpt.saved")] == [2, 4] and not events(run, "ckpt.failed")
    assert verify(run / "checkpoints" / "step-00000004").ok


def test_an_unfinished_durable_copy_is_never_a_candidate(tmp_path):
    tier = DurableTier((tmp_path / "d").as_uri())
    tier.begin(6)
    with tier.writer(6, "__0_0.distcp") as f:
        f.write(b"half a shard")
    assert tier.steps() == {}, "a step without its manifest looks committed"
    with pytest.raises(DurableError):
        tier.fetch(6, "../../etc/passwd", tmp_path / "x", {"size": 1, "crc32": 0})


@pytest.mark.parametrize("env,needle", [
    ({"TITAN_CHECKPOINT_PERSIST_EVERY_STEPS": "4"}, "needs checkpoint.persist_dir"),
    ({"TITAN_CHECKPOINT_PERSIST_DIR": "/x"}, "persist_every_steps is 0"),
    ({"TITAN_CHECKPOINT_PERSIST_EVERY_STEPS": "150", "TITAN_CHECKPOINT_PERSIST_DIR": "/x"}, "not a multiple"),
    ({"TITAN_CHECKPOINT_PERSIST_EVERY_STEPS": "200", "TITAN_CHECKPOINT_PERSIST_DIR": "nosuchscheme://b/x"},
     "cannot open nosuchscheme://"),
])
def test_persistence_settings_that_would_do_nothing_or_cannot_work_are_refused(env, needle):
    with pytest.raises(UserError) as e:
        load_settings(env=env)
    assert needle in e.value.message and e.value.hint, (e.value.message, e.value.hint)
