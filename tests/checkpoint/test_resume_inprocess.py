"""Resume in one process: bitwise equal to an uninterrupted run; each saved part matters."""

from __future__ import annotations

import pytest
import torch

from titan.checkpoint import Checkpointer
from titan.checkpoint.manifest import read_latest, verify

from _ckpt_model import build, context, events, params, same, train_steps

pytestmark = pytest.mark.timeout(60)


def _reference() -> tuple[list[torch.Tensor], list[float]]:
    st = build()
    losses = train_steps(st, 0, 8)
    return params(st), losses


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_resume_is_bitwise_equal_to_uninterrupted_run(tmp_path, mode):
    ref_params, ref_losses = _reference()
    ctx = context(tmp_path, every_steps=4, mode=mode)
    st = build()
    ck = Checkpointer(ctx)
    assert ck.restore(st) == 0
    first = train_steps(st, 0, 5, ck)  # saves at 4, then "crashes" after step 5
    ck.close()
    st2 = build(seed=99)  # fresh objects with different weights and RNG
    ck2 = Checkpointer(ctx)
    start = ck2.restore(st2)
    assert start == 4, f"expected resume after step 4, got {start}"
    rest = train_steps(st2, start, 8, ck2)
    ck2.close()
    assert first[:4] + rest == ref_losses, f"loss sequence differs:\n{first[:4] + rest}\n{ref_losses}"
    assert same(params(st2), ref_params), "final parameters differ from the uninterrupted run"
    saved = events(tmp_path, "ckpt.saved")
    assert {e.data["step"] for e in saved} >= {4, 8}
    assert all(e.data["bytes"] > 0 and e.data["mode"] == mode for e in saved), [e.data for e in saved]
    for e in saved:  # sync: training waits for all of it; async: only for the staging copy
        assert (e.data["stall_s"] == e.data["total_s"]) == (mode == "sync"), e.data
    assert read_latest(ctx.run_dir.checkpoints) == "step-00000008"
    assert verify(ctx.run_dir.checkpoints / "step-00000008").ok


@pytest.mark.parametrize("drop", ["rng", "sampler", "optim"])
def test_resume_without_one_component_is_not_equal(tmp_path, drop, monkeypatch):
    """Negative controls: the equality above fails when RNG, data position or optimizer
    state is not restored — so each of them is really needed and really restored."""
    ref_params, _ = _reference()
    ctx = context(tmp_path, every_steps=4, mode="sync")
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 4, ck)
    ck.close()
    st2 = build(seed=99)
    if drop == "rng":
        from titan.checkpoint import state

        monkeypatch.setattr(state, "restore_rng", lambda s: None)
    restore_state = {k: v for k, v in st2.items() if k != drop}
    start = Checkpointer(ctx).restore(restore_state)
    assert start == 4
    train_steps(st2, start, 8)
    assert not same(params(st2), ref_params), f"resume without {drop} still matched: the control is broken"


def test_nothing_to_resume_returns_zero_and_says_so(tmp_path):
    ctx = context(tmp_path)
    assert Checkpointer(ctx).restore(build()) == 0
    assert events(tmp_path, "ckpt.none")


def test_retention_keeps_last_n_plus_every_mth(tmp_path):
    ctx = context(tmp_path, every_steps=1, mode="sync", keep_last=2, keep_every=3)
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 7, ck)
    ck.close()
    names = sorted(p.name for p in ctx.run_dir.checkpoints.iterdir() if p.name.startswith("step-"))
    assert names == ["step-00000003", "step-00000006", "step-00000007"], names
