"""SLA figures across several runs: job success rate and uninterrupted-run length.

Definitions (``docs/sla.md``), after the spec's "99 % of jobs run > 7 days without an
infrastructure-caused interruption":

* **job success rate**: runs whose final exit status is success ÷ runs.
* **interruption**: an attempt failure (incident kind ``restart`` or ``fatal``). Guard
  skips are not interruptions: the job kept running.
* **uninterrupted-run length**: each stretch from the run's start, or from recovery (the
  first kept step after an interruption), to the next interruption's onset or the run's end.
* **SLA met**: the run's first stretch lasted at least ``threshold_h``, or the run
  finished successfully with no interruption.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from titan.sla.accounting import Accounting

__all__ = ["uninterrupted_stretches", "summarize_runs"]


def uninterrupted_stretches(acc: Accounting) -> list[float]:
    """Lengths (s) of the stretches between interruptions of one run."""
    out: list[float] = []
    start: float | None = acc.t0
    for inc in acc.incidents:
        if inc.kind not in ("restart", "fatal"):
            continue
        if start is not None:
            out.append(max(0.0, inc.onset_t - start))
        start = inc.recovered_t
    if start is not None:
        out.append(max(0.0, acc.t1 - start))
    return out


def summarize_runs(accs: Sequence[Accounting], *, threshold_h: float = 168.0) -> dict[str, Any]:
    """Aggregate SLA figures over runs (any number ≥ 1)."""
    n = len(accs)
    per_run = []
    all_stretches: list[float] = []
    met = 0
    for a in accs:
        st = uninterrupted_stretches(a)
        interrupts = sum(1 for i in a.incidents if i.kind in ("restart", "fatal"))
        ok = bool(a.outcome.get("succeeded"))
        sla = (st[0] >= threshold_h * 3600.0 if interrupts else ok) if st else False
        met += sla
        all_stretches.extend(st)
        per_run.append({"run_dir": a.run_dir, "succeeded": ok, "interruptions": interrupts, "wall_s": a.wall_s,
                        "goodput_fraction": a.goodput_fraction, "longest_uninterrupted_s": max(st, default=0.0),
                        "sla_met": sla})
    total_wall = sum(a.wall_s for a in accs)
    total_int = sum(r["interruptions"] for r in per_run)
    return {
        "runs": n,
        "job_success_rate": sum(r["succeeded"] for r in per_run) / n if n else None,
        "interruption_free_rate": sum(r["interruptions"] == 0 for r in per_run) / n if n else None,
        "sla_threshold_h": threshold_h,
        "sla_met_fraction": met / n if n else None,
        "interruptions": total_int,
        "mtbi_s": total_wall / total_int if total_int else None,
        "uninterrupted_s": {
            "count": len(all_stretches),
            "mean": statistics.fmean(all_stretches) if all_stretches else None,
            "median": statistics.median(all_stretches) if all_stretches else None,
            "min": min(all_stretches, default=None), "max": max(all_stretches, default=None),
        },
        "goodput_fraction_overall": (sum(a.buckets["goodput"] for a in accs) / total_wall) if total_wall else None,
        "per_run": per_run,
        "note": "every attempt failure counts as an interruption; triage verdicts (when present) say which were infrastructure-caused",
    }
