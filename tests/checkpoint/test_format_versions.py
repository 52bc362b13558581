"""Checkpoint format versions: a version-1 checkpoint (written by Titan before node-local
storage, kept in tests/checkpoint/data) still verifies, loads and resumes exactly; new saves
are version 2; a newer version is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from titan.checkpoint import Checkpointer
from titan.checkpoint.manifest import VERSION, read_manifest, verify

from _ckpt_model import build, context, events, params, same, train_steps

pytestmark = pytest.mark.timeout(60)
DATA = Path(__file__).parent / "data"


def test_a_version_1_checkpoint_loads_and_resumes_to_the_same_bits(tmp_path):
    root = tmp_path / "checkpoints"
    shutil.copytree(DATA / "v1-checkpoint", root)
    m = read_manifest(root / "step-00000003")
    assert m["version"] == 1 and "storage" not in m, "the kept checkpoint is not a version-1 one"
    assert verify(root / "step-00000003").ok
    ctx = context(tmp_path, mode="sync", every_steps=100)
    st = build(seed=123)  # other weights and RNG: everything must come from the checkpoint
    ck = Checkpointer(ctx, root=root)
    assert ck.restore(st) == 3
    losses = train_steps(st, 3, 6)
    ck.close()
    want = torch.load(DATA / "v1-expected.pt", weights_only=True)
    assert losses == want["losses"], f"losses after resuming the v1 checkpoint: {losses} != {want['losses']}"
    assert same(params(st), want["params"]), "parameters after resuming the v1 checkpoint differ"
    assert events(tmp_path, "ckpt.loaded")[0].data["path"].endswith("step-00000003")


def test_new_saves_are_version_2_and_say_their_storage(tmp_path):
    ctx = context(tmp_path, mode="sync", every_steps=2)
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 2, ck)
    ck.close()
    m = read_manifest(ctx.run_dir.checkpoints / "step-00000002")
    assert VERSION == 2 and m["version"] == 2 and m["storage"] == "shared", m


def test_a_newer_version_is_refused_naming_both(tmp_path):
    root = tmp_path / "checkpoints"
    shutil.copytree(DATA / "v1-checkpoint", root)
    mp = root / "step-00000003" / "manifest.json"
    m = json.loads(mp.read_text())
    m["version"] = VERSION + 1
    mp.write_text(json.dumps(m))
    res = verify(root / "step-00000003")
    assert not res.ok and f"version {VERSION + 1}" in res.reason and f"({VERSION})" in res.reason, res.reason
