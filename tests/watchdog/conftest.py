"""Fixtures of the watchdog tests."""

from __future__ import annotations

from typing import Any

import pytest

from wdhelpers import run_titan


@pytest.fixture(scope="session")
def hang_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A clean 50-step run of hang_worker.py: final weights and its run directory (the shared
    tinygpt ``reference_run`` has no comm-hook, data or spin injection points)."""
    tmp = tmp_path_factory.mktemp("reference")
    r = run_titan(tmp, "ref", ["--steps", "50", "--out", str(tmp / "ref.pt")])
    assert r.returncode == 0, f"reference run failed (exit {r.returncode}):\n{r.stdout[-3000:]}"
    return {"weights": tmp / "ref.pt", "run_dir": tmp / "runs" / "ref", "tmp": tmp}
