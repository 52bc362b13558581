"""The synthetic corpus is learnable: the loss falls well below uniform within ~100 steps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tinygpt_runner import run_tinygpt, step_data


@pytest.mark.timeout(240)
def test_loss_falls_over_100_steps(tmp_path: Path) -> None:
    run_tinygpt(tmp_path / "r", ["--steps", "100", "--threads", "1", "--no-ckpt", "--log-every", "0"], timeout=200)
    losses = [d["loss"] for _, d in step_data(tmp_path / "r")[0]]
    first, last = losses[0], sum(losses[-10:]) / 10
    assert abs(first - math.log(256)) < 0.5, f"initial loss {first:.3f}, expected about ln(256) = 5.55"
    assert last < 2.5, f"mean loss of the last 10 steps {last:.3f}, expected < 2.5 (from {first:.3f})"
    assert all(math.isfinite(x) for x in losses)
