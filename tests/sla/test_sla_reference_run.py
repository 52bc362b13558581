"""Accounting of the shared clean reference run (tests/conftest.py): a real 2-rank tinygpt
job under ``titan run`` with no fault. Read-only: nothing is written into its run dir."""

from __future__ import annotations

import pytest

from titan.sla.accounting import account_run

pytestmark = pytest.mark.timeout(300)


def test_clean_reference_run_has_no_interruption_and_reconciles(reference_run):
    acc = account_run(reference_run.run_dir.path)
    hard = [i for i in acc.incidents if i.kind in ("restart", "fatal")]
    assert hard == [], f"a clean run must show no interruption, seen {hard}"
    assert acc.outcome["succeeded"], acc.outcome
    assert acc.reconciliation["error_fraction"] <= 0.01, acc.reconciliation
    kept = [e for e in acc.execs if e.label == "goodput"]
    assert len(kept) == reference_run.steps, f"expected {reference_run.steps} kept steps, seen {len(kept)}"
    assert acc.buckets["recompute"] == 0 and acc.buckets["detection"] == 0 and acc.buckets["restart"] == 0
    assert acc.buckets["ckpt_stall"] > 0, "checkpoints were saved, so some stall must be charged"
