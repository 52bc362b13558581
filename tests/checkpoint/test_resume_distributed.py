"""Bitwise-exact resume under real torchrun + gloo after SIGKILLs at random steps.

Dropout is on (the tiny preset's 0.1), so every step consumes per-rank RNG.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from _ckpt_launch import bitwise_diff, load_out, losses, run_workload, step_events

STEPS = 14
ARGS = ["--steps", str(STEPS), "--ckpt-every", "3", "--seq-len", "32", "--batch-size", "4"]


def _reference(tmp: Path, nproc: int) -> Path:
    out = tmp / f"ref{nproc}.pt"
    r = run_workload(tmp / f"ref{nproc}", nproc, [*ARGS, "--out", str(out)])
    assert r.returncode == 0, (tmp / f"ref{nproc}" / "torchrun.log").read_text()[-3000:]
    return out


def _killed_run(tmp: Path, name: str, nproc: int, ref: Path, rng: random.Random, *, crash_mid_save: bool,
                two_kills: bool = True) -> list:
    """Kill a random rank at a random step of attempt 0 (and of the last attempt);
    optionally let rank 1 (not the coordinator) die inside its first save of attempt 1."""
    # The first kill comes after the first checkpoint (step 3) had time to commit; kill steps
    # stay well before the end (a kill racing the last step could miss) and leave attempt 1
    # at least one save (step 12) for the mid-save crash.
    k1 = rng.randrange(5, STEPS - 4)
    k2 = rng.randrange(k1 + 1, STEPS - 2)
    second = 2 if crash_mid_save else 1
    kills = [(0, k1, rng.randrange(nproc))]
    if two_kills:
        kills.append((second, k2, rng.randrange(nproc)))
    env = {"TITAN_CKPT_CRASH_AT": "shard_written@1#1"} if crash_mid_save else {}
    run = tmp / name
    r = run_workload(run, nproc, [*ARGS, "--out", str(tmp / f"{name}.pt")], kills=kills, env=env, timeout_s=200)
    assert r.returncode == 0, f"kills {kills}: " + (run / "torchrun.log").read_text()[-3000:]
    evs = step_events(run)
    attempts = {e["attempt"] for e in evs}
    assert len(attempts) >= len(kills) + crash_mid_save, f"expected restarts after kills {kills}, saw attempts {attempts}"
    diff = bitwise_diff(load_out(ref), load_out(tmp / f"{name}.pt"))
    assert not diff, f"kills at {kills}: {len(diff)} tensors differ from the uninterrupted run, e.g. {diff[:3]}"
    assert losses(run) == losses(ref.parent / ref.stem), f"kills at {kills}: the loss sequence differs"
    assert any(e["kind"] == "ckpt.loaded" for e in evs), "the restarted workers did not load a checkpoint"
    if crash_mid_save:  # rank 1 died inside a save: that save never became `latest`
        assert any(e["kind"] == "ckpt.loaded" and e["attempt"] == 2 for e in evs), "attempt 2 did not resume"
    return kills


@pytest.mark.timeout(420)
def test_two_ranks_killed_at_random_steps_and_mid_save_resume_bitwise(tmp_path):
    ref = _reference(tmp_path, 2)
    _killed_run(tmp_path, "run", 2, ref, random.Random(), crash_mid_save=True, two_kills=False)
    # Then flip a byte in rank 1's shard of the reference run's newest checkpoint and rerun
    # its last steps: both ranks must agree to fall back to step 9 and still match bitwise.
    ckpts = tmp_path / "ref2" / "checkpoints"
    shard = ckpts / "step-00000012" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x10
    shard.write_bytes(bytes(data))
    r = run_workload(tmp_path / "ref2", 2, [*ARGS, "--out", str(tmp_path / "fallback.pt")])
    assert r.returncode == 0, (tmp_path / "ref2" / "torchrun.log").read_text()[-3000:]
    evs = [e for e in step_events(tmp_path / "ref2") if e["attempt"] == 0 and e["kind"].startswith("ckpt.")]
    (corrupt,) = [e for e in evs if e["kind"] == "ckpt.corrupt"]
    assert "checksum" in " ".join(corrupt["data"]["reasons"]), corrupt["data"]
    loaded = [e for e in evs if e["kind"] == "ckpt.loaded" and e["t"] > corrupt["t"]]
    assert sorted(e["rank"] for e in loaded) == [0, 1] and all(e["step"] == 9 for e in loaded), loaded
    assert not bitwise_diff(load_out(ref), load_out(tmp_path / "fallback.pt")), "fallback resume is not bitwise equal"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_ranks_ten_random_kill_steps_across_runs(tmp_path):
    ref = _reference(tmp_path, 2)
    rng = random.Random()
    kills = []
    for i in range(5):
        kills += _killed_run(tmp_path, f"run{i}", 2, ref, rng, crash_mid_save=False)
    assert len({(a, s) for a, s, _ in kills}) >= 5 and len(kills) >= 10


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_ranks_resume_bitwise_with_ddp_warmup(tmp_path):
    """World 3: gloo sums depend on bucket offsets; the workload's discarded warm-up backward
    after restore (titan.checkpoint.ddp_warmup) gives the resumed run the rebuilt layout."""
    ref = _reference(tmp_path, 3)
    _killed_run(tmp_path, "run", 3, ref, random.Random(), crash_mid_save=False)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_restart_resumes_from_newer_dev_shm_snapshot_bitwise(tmp_path):
    """Disk every 6 steps, /dev/shm snapshot every step: a worker SIGKILLed at step >= 8
    comes back from the snapshot (newer than disk) and still ends bitwise equal."""
    env = {"TITAN_CHECKPOINT_SNAPSHOT_EVERY_STEPS": "1", "TITAN_SDC_ENABLED": "false"}
    args = ["--steps", str(STEPS), "--ckpt-every", "6", "--seq-len", "32", "--batch-size", "4"]
    ref = run_workload(tmp_path / "ref", 2, [*args, "--out", str(tmp_path / "ref.pt")],
                       env={**env, "TITAN_CHECKPOINT_SNAPSHOT_DIR": str(tmp_path / "shm-ref")})
    assert ref.returncode == 0, (tmp_path / "ref" / "torchrun.log").read_text()[-3000:]
    run = tmp_path / "run"
    r = run_workload(run, 2, [*args, "--out", str(tmp_path / "run.pt")], kills=[(0, 9, 1)],
                     env={**env, "TITAN_CHECKPOINT_SNAPSHOT_DIR": str(tmp_path / "shm")})
    assert r.returncode == 0, (run / "torchrun.log").read_text()[-3000:]
    loaded = [e for e in step_events(run) if e["kind"] == "ckpt.loaded"]
    assert loaded and all(e["data"]["source"] == "snapshot:restart" and e["step"] >= 8 for e in loaded), \
        f"expected a restore from a snapshot newer than disk step 6: {[e['data'] for e in loaded]}"
    assert not bitwise_diff(load_out(tmp_path / "ref.pt"), load_out(tmp_path / "run.pt"))
    assert losses(run) == losses(tmp_path / "ref")
