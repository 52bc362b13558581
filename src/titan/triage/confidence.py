"""Confidence from the evidence: how likely class, culprit and action are all right.

A verdict's *prior* comes from how it was reached (``titan.triage.method``: a specific rule's
message, a generic exception, the timeouts' pattern, exits, consequences only, silence, the
last-resort word vote — each path's prior is the share of such verdicts a person reading the
same lines would accept). The evidence then moves it:

- **corroboration** (+0.05 each, at most +0.10): other findings of the same class in other files
  or by other rules — independent witnesses of the same fault;
- **explained consequences** (+0.05): later timeouts, exits or peer losses on other ranks/files
  that the first anomaly accounts for (the story holds together);
- **rival causes** (−0.05 each, at most −0.15): causes of other classes in the window about as
  specific as the chosen one (priority within 10) — the cause-vs-cause margin is thin;
- **identity** (−0.05): the scope is a process or a node but no rank or node is named;
- **order** (−0.05 each): the first anomaly's time is inherited from an earlier line, or it is
  untimed while causes sit in several files (their order across files is unknown).

The result is clamped to [0.05, 0.95] and every factor is said in the reasoning. Calibration on
the public corpus (accuracy per band) is in docs/triage.md. Cost: linear in the findings kept.
"""

from __future__ import annotations

from titan.triage.model import Finding, Verdict

__all__ = ["adjust", "prior_for_cause"]

#: consequences a first anomaly can account for
_CONSEQUENCE_ROLES = ("timeout", "exit", "symptom")


def prior_for_cause(priority: int) -> float:
    """The prior of a verdict read from one rule's message: specific messages are right far more often."""
    return 0.85 if priority >= 80 else 0.8 if priority >= 70 else 0.6 if priority >= 40 else 0.45


def adjust(v: Verdict, kept: list[Finding]) -> tuple[float, list[str]]:
    """(confidence, the factors that moved it from the verdict's prior) for a diagnosed verdict."""
    f = v.first_anomaly
    conf = v.confidence
    why = [f"prior {conf:.2f} ({v.reason.split(':', 1)[0] if f is None or f.rule != 'lexical' else 'a reading of words'})"]
    if f is None or f.rule == "lexical":
        return round(max(0.05, min(0.95, conf)), 2), why
    who = (f.file, f.rank)
    same = {(x.file, x.rule) for x in kept if x is not f and x.role == "cause" and x.cls == v.cls
            and ((x.file, x.rank) != who or x.rule != f.rule)}
    if same:
        bonus = min(0.10, 0.05 * len(same))
        conf += bonus
        why.append(f"+{bonus:.2f} corroborated by {len(same)} other {v.cls} finding(s)")
    t0 = f.t
    later = [x for x in kept if x is not f and x.role in _CONSEQUENCE_ROLES and (x.file, x.rank) != who
             and (t0 is None or x.t is None or x.t >= t0)]
    if later and f.role == "cause":
        conf += 0.05
        why.append(f"+0.05 it accounts for {len(later)} later consequence(s) elsewhere")
    rivals = {x.cls for x in kept if x.role == "cause" and x is not f and x.cls and x.cls != v.cls
              and x.priority >= f.priority - 10}
    if rivals and f.role == "cause":
        pen = min(0.15, 0.05 * len(rivals))
        conf -= pen
        why.append(f"-{pen:.2f} rival causes of {', '.join(sorted(rivals))} about as specific")
    if v.scope in ("process", "node") and v.culprit.get("rank") is None and not v.culprit.get("node"):
        conf -= 0.05
        why.append("-0.05 the culprit is not localised")
    if f.t_inherited:
        conf -= 0.05
        why.append("-0.05 its time is inherited from an earlier line")
    elif f.t is None and len({x.file for x in kept if x.role == "cause"}) >= 2:
        conf -= 0.05
        why.append("-0.05 untimed, with causes in several files (their order is unknown)")
    return round(max(0.05, min(0.95, conf)), 2), why
