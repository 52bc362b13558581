"""Across runs: job success rate, interruption-free rate, uninterrupted-run lengths, SLA."""

from __future__ import annotations

import pytest

from titan.sla.accounting import account
from titan.sla.runs import summarize_runs, uninterrupted_stretches
from titan.sla.synthetic import SynthRun

pytestmark = pytest.mark.timeout(30)


def _runs():
    clean = SynthRun(world=1).startup(1).steps(10).end(0)  # 11 s, no interruption
    restarted = (SynthRun(world=1).startup(1).steps(5).fault(after=0.5).detect(1).restart(2, resume_from=5)
                 .steps(5).end(0))  # onset at 6.5 s; recovered at 10.5 s (first step after restart); end 14.5 s
    fatal = SynthRun(world=1).startup(1).steps(2).fault(after=0.2).detect(1).end(1, exit_code=1)  # onset 3.2 s
    return [account(r.events, {"exit_code": r.exit_code}) for r in (clean, restarted, fatal)]


def test_uninterrupted_stretches_are_split_at_onsets_and_restart_at_recovery():
    clean, restarted, fatal = _runs()
    assert uninterrupted_stretches(clean) == pytest.approx([11.0])
    assert uninterrupted_stretches(restarted) == pytest.approx([6.5, 4.0])
    assert uninterrupted_stretches(fatal) == pytest.approx([3.2]), "no recovery after a fatal failure"


def test_job_success_rate_and_sla_over_runs():
    agg = summarize_runs(_runs(), threshold_h=5.0 / 3600)  # SLA: 5 s uninterrupted
    assert agg["runs"] == 3
    assert agg["job_success_rate"] == pytest.approx(2 / 3)
    assert agg["interruption_free_rate"] == pytest.approx(1 / 3)
    assert agg["interruptions"] == 2
    # clean: finished without interruption; restarted: first stretch 6.5 s ≥ 5 s; fatal: 3.2 s < 5 s.
    assert [r["sla_met"] for r in agg["per_run"]] == [True, True, False]
    assert agg["uninterrupted_s"]["min"] == pytest.approx(3.2) and agg["uninterrupted_s"]["max"] == pytest.approx(11.0)
    assert agg["mtbi_s"] == pytest.approx((11.0 + 14.5 + 5.2) / 2)
