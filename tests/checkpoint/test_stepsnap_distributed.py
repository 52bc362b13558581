"""Per-step in-memory snapshots under real torchrun + gloo (issue 23).

A rank SIGKILLed at a random step resumes from the last step's in-memory state (at most one
step lost) and ends bitwise equal to the uninterrupted run; when the killed rank's snapshots
are corrupt or gone (a replacement node), every rank falls back to the disk checkpoint
together, still bitwise, and ``ckpt.loaded`` says why memory was not used.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from _ckpt_launch import bitwise_diff, load_out, losses, run_workload, step_events

STEPS = 14
DISK_EVERY = 6
ARGS = ["--steps", str(STEPS), "--ckpt-every", str(DISK_EVERY), "--seq-len", "32", "--batch-size", "4"]
ENV = {"TITAN_CHECKPOINT_SNAPSHOT_EVERY_STEPS": "1", "TITAN_SDC_ENABLED": "false"}


def _run(tmp: Path, name: str, **kw) -> Path:
    run = tmp / name
    env = {**ENV, "TITAN_CHECKPOINT_SNAPSHOT_DIR": str(tmp / f"shm-{name}")}
    r = run_workload(run, 2, [*ARGS, "--out", str(tmp / f"{name}.pt")], env=env, timeout_s=200, **kw)
    assert r.returncode == 0, (run / "torchrun.log").read_text()[-3000:]
    return run


def _rank_slots(tmp: Path, name: str, rank: int) -> list[Path]:
    return sorted((tmp / f"shm-{name}").glob(f"*/rank{rank}/step"))


def _loaded(run: Path) -> list[dict]:
    return [e for e in step_events(run) if e["kind"] == "ckpt.loaded" and e["attempt"] == 1]


def _assert_bitwise(tmp: Path, name: str, what: str) -> None:
    diff = bitwise_diff(load_out(tmp / "ref.pt"), load_out(tmp / f"{name}.pt"))
    assert not diff, f"{what}: {len(diff)} tensors differ from the uninterrupted run, e.g. {diff[:3]}"
    assert losses(tmp / name) == losses(tmp / "ref"), f"{what}: the loss sequence differs"


@pytest.mark.timeout(480)
def test_kill_at_a_random_step_resumes_from_the_last_step_and_corrupt_memory_falls_back_to_disk(tmp_path):
    _run(tmp_path, "ref")
    rng = random.Random()
    kill = rng.randrange(DISK_EVERY + 2, STEPS - 3)  # disk 6 committed, memory newer, disk 12 not reached
    run = _run(tmp_path, "kill", kills=[(0, kill, 1)])
    before = max(e["step"] for e in step_events(run) if e["kind"] == "step" and e["attempt"] == 0)
    loaded = _loaded(run)
    assert sorted(e["rank"] for e in loaded) == [0, 1], f"kill after step {kill}: restores {loaded}"
    assert all(e["data"]["source"] == "snapshot:restart" and e["data"]["tier"] == "step" for e in loaded), \
        f"kill after step {kill}: expected a restore from the per-step tier, saw {[e['data'] for e in loaded]}"
    resumed = {e["step"] for e in loaded}
    assert len(resumed) == 1 and before - resumed.pop() <= 1, \
        f"kill after step {kill}: furthest step before the kill {before}, resumed from {[e['step'] for e in loaded]}"
    _assert_bitwise(tmp_path, "kill", f"kill after step {kill}")

    # The killed rank's slots corrupt (a flipped byte in each): every rank goes to disk step 6.
    def corrupt(rank: int) -> None:
        bins = [b for d in _rank_slots(tmp_path, "corrupt", rank) for b in d.glob("slot*.bin")]
        assert bins, f"rank {rank} wrote no per-step snapshot slots"
        for b in bins:
            with open(b, "r+b") as f:
                first = f.read(1)
                f.seek(0)
                f.write(bytes([first[0] ^ 0x20]))

    run = _run(tmp_path, "corrupt", kills=[(0, kill, 1)], before_kill=corrupt)
    loaded = _loaded(run)
    assert loaded and all(e["data"]["source"] == "disk" and e["step"] == DISK_EVERY for e in loaded), \
        f"corrupt memory: expected every rank on disk step {DISK_EVERY}, saw {[(e['rank'], e['step'], e['data']) for e in loaded]}"
    assert all("rank 1 holds no valid per-step snapshot" in (e["data"].get("memory") or "") for e in loaded), \
        [e["data"].get("memory") for e in loaded]
    _assert_bitwise(tmp_path, "corrupt", "corrupt memory")


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_memory_of_the_killed_rank_gone_falls_back_to_disk_bitwise(tmp_path):
    """The killed rank's tmpfs folder removed (a reboot or a replacement node)."""
    _run(tmp_path, "ref")
    run = _run(tmp_path, "lost", kills=[(0, DISK_EVERY + 3, 1)],
               before_kill=lambda rank: [shutil.rmtree(d) for d in _rank_slots(tmp_path, "lost", rank)])
    loaded = _loaded(run)
    assert loaded and all(e["data"]["source"] == "disk" and e["step"] == DISK_EVERY for e in loaded), \
        [(e["rank"], e["step"], e["data"]) for e in loaded]
    _assert_bitwise(tmp_path, "lost", "memory gone")
