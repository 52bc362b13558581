"""A run that succeeded: the incidents it went through and handled, and which one cost most.

A Titan run directory whose ``run.json`` says the run succeeded (exit code 0) is no failure
to explain. Its incidents — restarts after a worker failure, guard skips/replays — come from
``titan.sla`` (the one accounting of onset, detection, RTO and RPO the report uses); each is
classified by the triage method on the findings around it (onset − window … detection +
window), so its culprit comes from the evidence of that incident. Cost = RTO (onset to the
first kept step after recovery) + the seconds of work lost (RPO).

Cost: one accounting pass over the events plus one triage decision per incident.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from titan.triage.model import Verdict
from titan.triage.scan import FileScan

__all__ = ["run_succeeded", "succeeded_verdict"]


def run_succeeded(run_dir: Path) -> bool:
    """Whether ``run.json`` records the run as succeeded (exit code 0 / a success status); never raises."""
    from titan.events import RunDir
    from titan.sla.accounting import run_outcome

    try:
        rj = RunDir(run_dir).read_run_json()
    except Exception:  # noqa: BLE001 - a garbled run.json is no success
        return False
    if not rj:
        return False
    out = run_outcome([], rj, final_failed=True)
    return bool(out.get("succeeded")) and str(out.get("source", "")).startswith("run.json")


def _span(scans: list[FileScan], lo: float, hi: float) -> list[FileScan]:
    out = []
    for s in scans:
        c = dataclasses.replace(s, findings=[f for f in s.findings if f.t is not None and lo <= f.t <= hi],
                                progress=[p for p in s.progress if p.t is not None and lo <= p.t <= hi], stacks=[])
        out.append(c)
    return out


def succeeded_verdict(run_dir: Path, scans: list[FileScan], decide: Callable[..., Verdict], *, window_s: float,
                      skew_s: float) -> Verdict:
    """The summary verdict of a succeeded run: ``outcome="succeeded"``, no class, its incidents costliest first."""
    from titan.sla.accounting import account_run

    try:
        acc = account_run(run_dir)
        incs = list(acc.incidents)
    except Exception:  # noqa: BLE001 - a run with no events has no incidents to account
        incs = []
    rows: list[dict[str, Any]] = []
    for inc in incs:
        lo = inc.onset_t - window_s - skew_s
        hi = max(inc.detect_t, inc.onset_t) + window_s + skew_s
        v = decide(_span(scans, lo, hi), window_s=window_s, skew_s=skew_s)
        cost = (inc.rto_s or 0.0) + (inc.rpo_s or 0.0)
        culprit = dict(v.culprit) if v.diagnosed else {"rank": inc.rank, "node": None, "gpu": None}
        rows.append({"index": inc.index, "kind": inc.kind, "attempt": inc.attempt, "step": inc.step,
                     "class": v.cls, "action": v.action, "culprit": culprit, "reason": v.reason,
                     "first_anomaly": v.first_anomaly.ref() if v.first_anomaly else None,
                     "rto_s": inc.rto_s, "rpo_steps": inc.rpo_steps, "rpo_s": inc.rpo_s, "cost_s": round(cost, 3)})
    rows.sort(key=lambda r: -r["cost_s"])
    if rows:
        top = rows[0]
        who = ", ".join(f"{k} {top['culprit'][k]}" for k in ("rank", "node") if top["culprit"].get(k) is not None)
        reason = (f"the run succeeded (run.json); {len(rows)} incident(s) handled; the costliest: #{top['index']} "
                  f"{top['class'] or top['kind']}" + (f" ({who})" if who else "")
                  + (f" at step {top['step']}" if top["step"] is not None else "")
                  + f", {top['cost_s']:.1f} s (recovery {top['rto_s'] or 0:.1f} s + {top['rpo_s'] or 0:.1f} s of lost "
                    f"work, {top['rpo_steps']} step(s))")
    else:
        reason = "the run succeeded (run.json) and went through no incident"
    steps = [f"outcome: succeeded — {run_dir}/run.json"] + [
        f"incident #{r['index']} ({r['kind']}, step {r['step']}): {r['class']} → {r['action']}, cost {r['cost_s']:.1f} s"
        for r in rows]
    return Verdict(cls=None, culprit={"rank": None, "node": None, "gpu": None}, scope=None, action=None,
                   first_anomaly=None, evidence=[], confidence=1.0, reason=reason, outcome="succeeded",
                   incidents=rows, steps=steps, window_s=window_s)
