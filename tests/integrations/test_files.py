"""Titan's guarantees on a framework's own checkpoint files (titan.integrations._files):
committed by a checksummed manifest, chosen newest-good-first, bad and unfinished ones moved
aside and reported, and checkpoints that predate Titan adopted. No framework needed."""

from __future__ import annotations

import json
from pathlib import Path

from titan.integrations import _files
from titan.worker import WorkerContext


def _ctx(tmp_path: Path) -> WorkerContext:
    return WorkerContext.from_env(run_dir=tmp_path / "run", env={}, wire=False)


def _events(ctx: WorkerContext, kind: str) -> list[dict]:
    from titan.events import read_run

    return [e.data for e in read_run(ctx.run_dir.path).events if e.kind == kind]


def _dir_ckpt(root: Path, step: int, *, commit: bool = True) -> _files.Candidate:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.bin").write_bytes(bytes(range(256)) * (step + 1))
    (d / "state.json").write_text(json.dumps({"step": step}))
    if commit:
        _files.commit_files(d, _files.files_under(d), manifest="manifest.json", step=step, world_size=2, info={})
    return _files.Candidate(d, step, d, "manifest.json")


def test_the_newest_committed_checkpoint_is_chosen_and_verified(tmp_path):
    ctx, root = _ctx(tmp_path), tmp_path / "out"
    root.mkdir()
    cands = [_dir_ckpt(root, s) for s in (5, 10, 15)]
    chosen, facts = _files.choose(ctx, root, cands, source="test")
    assert chosen is not None and chosen.step == 15, f"expected checkpoint-15, got {chosen}"
    assert facts["verified"] is True and facts["skipped"] == []


def test_a_truncated_newest_checkpoint_is_reported_moved_aside_and_the_previous_used(tmp_path):
    ctx, root = _ctx(tmp_path), tmp_path / "out"
    root.mkdir()
    cands = [_dir_ckpt(root, s) for s in (5, 10)]
    victim = root / "checkpoint-10" / "model.bin"
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    chosen, facts = _files.choose(ctx, root, cands, source="test")
    assert chosen is not None and chosen.step == 5, f"expected the fallback to checkpoint-5, got {chosen}"
    assert not (root / "checkpoint-10").exists(), "the bad checkpoint was left where the framework lists it"
    moved = [p.name for p in root.iterdir() if p.name.startswith(_files.QUARANTINE_PREFIX)]
    assert moved and moved[0].startswith("corrupt.checkpoint-10.corrupt-"), moved
    (ev,) = _events(ctx, "ckpt.corrupt")
    assert "model.bin" in ev["reasons"][0] and "truncated" in ev["reasons"][0], ev
    # The next attempt no longer sees it: no crash loop on the same bad checkpoint.
    again, _ = _files.choose(ctx, root, [c for c in cands if c.path.exists()], source="test")
    assert again is not None and again.step == 5 and len(_events(ctx, "ckpt.corrupt")) == 1


def test_a_save_interrupted_before_its_manifest_is_never_loaded(tmp_path):
    ctx, root = _ctx(tmp_path), tmp_path / "out"
    root.mkdir()
    first = [_dir_ckpt(root, 5)]
    _files.choose(ctx, root, first, source="test")  # Titan looked: the folder is adopted (nothing legacy)
    cands = first + [_dir_ckpt(root, 10, commit=False)]
    chosen, _ = _files.choose(ctx, root, cands, source="test")
    assert chosen is not None and chosen.step == 5, f"an uncommitted checkpoint-10 was chosen: {chosen}"
    assert "no manifest" in _events(ctx, "ckpt.corrupt")[0]["reasons"][0]


def test_checkpoints_from_before_titan_are_adopted_unverified(tmp_path):
    ctx, root = _ctx(tmp_path), tmp_path / "out"
    root.mkdir()
    legacy = [_dir_ckpt(root, s, commit=False) for s in (100, 200)]
    chosen, facts = _files.choose(ctx, root, legacy, source="test")
    assert chosen is not None and chosen.step == 200 and facts == {"verified": False, "adopted": True,
                                                                   "verify_s": 0.0, "skipped": []}, (chosen, facts)
    marker = json.loads((root / _files.ADOPTED).read_text())
    assert marker["legacy"] == ["checkpoint-100", "checkpoint-200"], marker
    # A Titan save after adoption commits; a later uncommitted one is an interrupted save.
    cands = legacy + [_dir_ckpt(root, 205), _dir_ckpt(root, 210, commit=False)]
    chosen, facts = _files.choose(ctx, root, cands, source="test")
    assert chosen is not None and chosen.step == 205 and facts["verified"] is True, (chosen, facts)


def test_a_one_file_checkpoint_has_a_sidecar_manifest_that_moves_with_it(tmp_path):
    ctx, root = _ctx(tmp_path), tmp_path / "ckpts"
    root.mkdir()
    _files.choose(ctx, root, [], source="test")  # adopt the (empty) folder
    cands = []
    for s in (5, 10):
        f = root / f"epoch=0-step={s}.ckpt"
        f.write_bytes(b"x" * 1000 * s)
        _files.commit_files(root, [f.name], manifest=_files.sidecar_name(f), step=s, world_size=2, info={})
        cands.append(_files.Candidate(f, s, root, _files.sidecar_name(f)))
    f10 = root / "epoch=0-step=10.ckpt"
    f10.write_bytes(b"y" * 10000)  # same size, other bytes: only the checksum tells
    chosen, _ = _files.choose(ctx, root, cands, source="test")
    assert chosen is not None and chosen.step == 5, chosen
    assert "checksum" in _events(ctx, "ckpt.corrupt")[0]["reasons"][0]
    names = sorted(p.name for p in root.iterdir())
    assert not any(n.startswith("epoch=0-step=10") for n in names), names
    assert any(n.startswith("corrupt.epoch=0-step=10.ckpt.corrupt-") and n.endswith(".titan.json") for n in names), names
