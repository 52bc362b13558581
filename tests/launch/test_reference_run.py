"""The shared reference run is a clean 2-rank run: both ranks, every step, no failure."""

from __future__ import annotations

import pytest

from titan.events import read_run


@pytest.mark.timeout(300)
def test_reference_run_is_clean_and_complete(reference_run):
    import torch

    res = read_run(reference_run.run_dir)
    evs = res.events
    assert not res.problems, res.problems
    steps = {(e.rank, e.step) for e in evs if e.kind == "step"}
    assert steps == {(r, s) for r in (0, 1) for s in range(1, reference_run.steps + 1)}, "missing step events"
    bad = [e.kind for e in evs if e.kind in ("worker.failed", "launcher.restart", "launcher.abort")]
    assert not bad, f"the reference run must be fault-free, saw {bad}"
    meta = reference_run.run_dir.read_run_json()
    assert meta["exit_code"] == 0 and meta["torchrun"]["outcome"] == "succeeded"
    params = torch.load(reference_run.params)
    assert params and all(isinstance(v, torch.Tensor) for v in params.values())
