"""A rank slowed 2x (a sleep equal to its median compute time: data + forward + optimizer + the
step's unmarked time, what the straggler detector compares — in its forward, or before its
step with no phase open) is flagged within 50 steps by the watchdog of a real run; the clean
reference run flags nothing. The slowed run computes 8,192 rows a step (~5 ms of compute), so
that 2x is above the detector's floor (``straggler_min_excess_s``, 2 ms per step); the
reference run's ~0.7 ms steps are below it, where a clean run once showed rank 0 at 1.40x."""

from __future__ import annotations

from pathlib import Path

import pytest

from wdhelpers import events, run_titan


@pytest.mark.slow  # ~70 s with the reference run; the detector's logic is tested fast in test_learning.py
@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["forward", "gap"])
def test_a_rank_slowed_2x_is_flagged_within_50_steps(hang_reference, tmp_path: Path, where: str):
    assert not events(hang_reference["run_dir"], "straggler.detected"), "the clean run must flag nothing"
    r = run_titan(tmp_path, "slow", ["--steps", "60", "--slow", "1", "--slow-where", where, "--batch", "8192"])
    assert r.returncode == 0, r.stdout[-2000:]
    flags = events(tmp_path / "runs" / "slow", "straggler.detected")
    assert flags, "no straggler.detected for the slowed rank"
    first = flags[0]["data"]
    assert first["rank"] == 1 and first["step"] <= 50, f"expected rank 1 by step 50, saw {first}"
    assert first["slowdown"] > 1.3, first
    assert {f["data"]["rank"] for f in flags} == {1}, "only the slowed rank may be flagged"
