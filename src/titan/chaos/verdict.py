"""Per-fault verdicts of a drill, computed from the run directory's events alone.

For each planned fault: the ground truth (its ``inject.*`` event), whether it **bit** (its
measured effect against a reference measured in the same run, :mod:`titan.chaos.effect`),
which named detector saw it (``detector``, ``detected_by``: guard, sdc, watchdog,
launcher, checkpoint, agent) and how fast, whom it blamed (``culprit``: rank, node, path,
link — checked against the injected target), how the job recovered, the steps lost, and
whether the final model equals the reference run's bits. :mod:`titan.chaos.expect` is the
documented expected outcome of each kind; a fault passes when every expectation holds.
A fault that had no measurable effect fails ("no measurable effect"); one that nobody
detected fails unless the plan marks it ``survive_only`` (with the reason). A fault's RTO and
steps lost are those of the incident it caused in the run's accounting
(:func:`titan.sla.figures.incident_in_window`): the numbers ``titan report`` shows for the
same run, computed once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from titan.chaos.attribution import attribute, sdc_ranks
from titan.chaos.effect import measure_effect
from titan.chaos.expect import EXPECT, Detector, Expect, expect_for, inject_kind
from titan.chaos.plan import KINDS, FaultSpec, Plan
from titan.chaos.runtime import fault_id
from titan.events import Event
from titan.sla.accounting import Accounting, account
from titan.sla.figures import incident_in_window

__all__ = ["Expect", "EXPECT", "FaultVerdict", "expect_for", "judge", "inject_kind", "skipped_steps"]

#: How long after a transient fault ended its detector may still speak (one agent tick plus
#: the detector's window, with margin for a loaded machine).
LATE_S = 15.0
#: End events of faults with a duration (their data: the injector's measurements).
_END_KINDS = ("inject.net_healed", "inject.stress_end")


@dataclasses.dataclass
class FaultVerdict:
    """One row of the drill's verdict table (see the module doc)."""

    id: str
    kind: str
    what: str | None
    rank: int | None
    node: str | None
    step: int
    expected: str
    expected_text: str
    injected: bool
    detected: bool
    detected_by: str | None
    detection_s: float | None
    attributed_ok: bool | None
    attribution: str | None
    recovered: bool
    recovery: str | None
    rto_s: float | None
    steps_lost: int | None
    final_state_equal: bool | None
    passed: bool
    checks: dict[str, bool] = dataclasses.field(default_factory=dict)
    impact: str | None = None
    detector: str | None = None  # the named detector that saw it (event kind, agent rule)
    culprit: str | None = None  # whom it blamed (= attribution)
    effect: dict[str, Any] | None = None  # titan.chaos.effect.Effect as a dict
    survive_only: str | None = None  # the plan's reason for not requiring detection
    reasons: list[str] = dataclasses.field(default_factory=list)  # why it failed, one line each
    #: the report's incident number (``#n``) this fault caused, when it caused one
    incident: int | None = None
    #: updates the guard skipped because of this fault (not lost: nothing recomputed)
    steps_skipped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _r(x: float | None) -> float | None:
    return round(x, 3) if x is not None else None


def skipped_steps(plan: Plan, events: Sequence[Event]) -> list[int]:
    """Steps whose update a reference run must skip: those of skip-kind faults that fired and
    whose step was not recomputed after a restart (a recomputed step is clean)."""
    out = set()
    steps = [e for e in events if e.kind == "step" and e.step is not None]
    for f in plan.faults:
        if expect_for(f).recovery != "skip":
            continue
        inj = [e for e in events if e.kind == inject_kind(f) and e.step == f.step]
        if not inj:
            continue
        t = inj[0].t
        redone = [e for e in steps if e.step == f.step and e.t > t and not e.data.get("skipped")]
        if not redone:
            out.add(f.step)
    return sorted(out)


def _first(events: Sequence[Event], kinds: Sequence[str], t0: float, pred: Any = None) -> Event | None:
    for e in events:
        if e.kind in kinds and e.t >= t0 - 0.5 and (pred is None or pred(e)):
            return e
    return None


def _matches(d: Detector, e: Event) -> bool:
    return e.kind == d.event and (d.rule is None or e.data.get("rule") == d.rule)


def _detection(f: FaultSpec, exp: Expect, evs: Sequence[Event], t0: float, t_stop: float,
               rank: int | None) -> tuple[Event | None, Detector | None]:
    """The first event of one of the kind's named detectors in ``[t0 − 0.5, t_stop]`` — for an
    agent alert that says when its evidence happened (``evidence_t``: the newest lost probe's
    send time), that time: an alert counted late, after the next fault began, is still this
    fault's, and not the next one's."""
    for e in evs:
        if e.t < t0 - 0.5:
            continue
        if e.t > t_stop + LATE_S:
            break
        t_ev = _evidence_t(e)
        if not t0 - 0.5 <= t_ev <= t_stop:
            continue
        for d in exp.detectors:
            if not _matches(d, e):
                continue
            if e.kind == "worker.failed" and rank is not None and e.data.get("global_rank", e.rank) != rank:
                continue
            if e.kind in ("guard.nonfinite", "guard.spike") and (e.step is None or e.step < f.step):
                continue
            return e, d
    return None, None


def _evidence_t(e: Event) -> float:
    """When an event's evidence happened: ``data.evidence_t`` of an agent alert (bounded by the
    alert's own time and at most ``LATE_S`` before it), else the event's time."""
    v = e.data.get("evidence_t") if e.kind == "agent.alert" else None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and e.t - LATE_S <= v <= e.t:
        return float(v)
    return e.t


def _injection(f: FaultSpec, evs: Sequence[Event]) -> Event | None:
    return next((e for e in evs if e.kind == inject_kind(f) and (e.step == f.step or e.data.get("planned_step") == f.step)
                 and (f.rank is None or e.data.get("rank") in (None, f.rank))), None)


def _end_of(f: FaultSpec, inj: Event, evs: Sequence[Event]) -> Event | None:
    """The fault's own end event (healed link, finished stress), if it has one."""
    fid_what = inj.data.get("what")
    return next((e for e in evs if e.kind in _END_KINDS and e.t > inj.t
                 and (e.data.get("planned_step") == f.step or (e.data.get("planned_step") is None
                                                              and e.data.get("what") == fid_what))), None)


def _accounting(events: Sequence[Event]) -> Accounting | None:
    try:
        return account(events)
    except ValueError:  # no events: nothing ran
        return None


def judge(plan: Plan, events: Sequence[Event], *, final_equal: bool | None, launcher_ok: bool,
          acc: Accounting | None = None, run_dir: str | None = None) -> list[FaultVerdict]:
    """One verdict per planned fault (see the module doc). ``acc`` is the run's accounting
    (``titan.sla.account`` of the same events and run.json; computed here when absent).
    Cost: linear scans of ``events`` (one per fault), plus the accounting when not given."""
    evs = sorted(events, key=lambda e: e.t)
    acc = acc if acc is not None else _accounting(evs)
    steps = [e for e in evs if e.kind == "step" and e.step is not None]
    injections = [(f, _injection(f, evs)) for f in plan.faults]
    out = []
    for i, (f, inj) in enumerate(injections):
        exp = expect_for(f)
        what = str(f.get("where")) if f.kind == "hang" else (
            str(f.get("what")) if "what" in KINDS[f.kind] else None)
        v = FaultVerdict(id=fault_id(i, f), kind=f.kind, what=what, rank=f.rank, node=f.node, step=f.step,
                         expected=f"{exp.outcome}; {exp.recovery}", expected_text=exp.text, injected=inj is not None,
                         detected=False, detected_by=None, detection_s=None, attributed_ok=None, attribution=None,
                         recovered=False, recovery=None, rto_s=None, steps_lost=None, final_state_equal=final_equal,
                         passed=False, survive_only=f.survive_only)
        if inj is None:
            v.checks = {"injected": False}
            v.reasons = ["not injected (no inject.* event)"]
            out.append(v)
            continue
        t0 = inj.t
        end = _end_of(f, inj, evs)
        # This fault's window ends where the next fault's injection begins — the next one a
        # detector of this kind could also see (an SDC round comes long after the flip, and
        # the disk fault injected meanwhile raises no sdc.mismatch).
        t_next = min((j.t for g, j in injections if j is not None and j.t > t0 + 0.05 and g is not f),
                     default=float("inf"))
        mine = {d.name for d in exp.detectors}
        t_rival = min((j.t for g, j in injections if j is not None and j.t > t0 + 0.05 and g is not f
                       and mine & {d.name for d in expect_for(g).detectors}), default=float("inf"))
        rank = f.rank if f.rank is not None else inj.data.get("rank")
        # Transients (no restart expected) must be seen during the fault or just after it.
        t_stop = t_rival
        if exp.recovery == "none":
            dur = float(inj.data.get("seconds") or 0.0)
            t_stop = min(t_rival, (end.t if end is not None else t0 + dur) + LATE_S)
        det, dspec = _detection(f, exp, evs, t0, t_stop, rank)
        if det is not None and dspec is not None:
            v.detected = True
            v.detector = dspec.name
            v.detected_by = f"{dspec.component} ({dspec.name})"
            v.detection_s = _r(max(det.t - t0, 0.0))
            blame = None
            if det.kind.startswith("sdc."):  # the culprit is named after the replay, in a later sdc event
                blame = next((e for e in evs if e.kind.startswith("sdc.") and det.t <= e.t <= det.t + 60
                              and sdc_ranks(e.data)), None)
            v.attributed_ok, v.attribution = attribute(f, inj, det, rank, run_dir=run_dir, blame=blame)
            v.culprit = v.attribution
        # Other alerts of the node agent inside a host-level fault's window: second witnesses.
        if f.kind in ("disk", "stress", "net"):
            others = sorted({str(e.data.get("rule") or e.msg[:40]) for e in evs if e.kind == "agent.alert"
                             and t0 - 0.5 <= e.t <= min(t_stop, t0 + 60) and e is not det})
            if others and v.detected:
                v.detected_by = f"{v.detected_by}; agent also: {', '.join(others)}"
        _recovery(v, f, exp, inj, det, evs, steps, t_next)
        if f.kind == "node_loss":  # the replacement's shards must come from the buddy copy
            lost = str(inj.data.get("lost_node") or f.node or "node1")
            loaded = _first(evs, ["ckpt.loaded"], t0, lambda e: e.node == lost)
            held = (loaded.data.get("fetched_from") or {}) if loaded is not None else {}
            v.checks["lost node restored from its buddy"] = bool(held) and lost not in held
            if not v.checks["lost node restored from its buddy"]:
                v.reasons.append(f"{lost} loaded " + (f"step {loaded.data.get('step')} fetching from {held or 'nobody'}"
                                                      if loaded else "nothing after the loss"))
        # RTO and steps lost: the incident this fault caused, as the report counts it.
        inc = incident_in_window(acc, t0, t_next, kinds=("guard",) if exp.recovery == "skip" else ("restart", "fatal")) \
            if acc is not None else None
        if inc is not None:
            # Unrounded: the drill and the report format the same float (a rounded copy can print
            # differently, 31.775 -> '31.77' vs 31.77507 -> '31.78').
            v.incident, v.rto_s, v.steps_lost, v.steps_skipped = inc.index, inc.rto_s, inc.rpo_steps, inc.skipped_steps
        elif exp.recovery in ("restart", "fallback"):
            v.rto_s, v.steps_lost = None, None  # no incident: the run never recovered from it
        eff = measure_effect(f, inj, evs, end=end)
        v.effect = eff.to_dict()
        v.impact = eff.text
        v.checks["injected"] = True
        v.checks["measurable effect"] = eff.bit
        if not eff.bit:
            v.reasons.append(f"no measurable effect: {eff.text}")
        if exp.outcome == "detected":
            if f.survive_only is None:
                v.checks["detected"] = v.detected
                if not v.detected:
                    v.reasons.append("not detected by " + " / ".join(d.name for d in exp.detectors))
            if v.detected:
                v.checks["attributed"] = bool(v.attributed_ok)
                if not v.attributed_ok:
                    v.reasons.append(f"blamed the wrong target: {v.attribution}")
        elif exp.outcome == "undetected":
            v.checks["undetected (as documented)"] = not v.detected
        restart = _first(evs, ["launcher.restart"], t0)
        if exp.recovery != "none":
            v.checks["recovered"] = v.recovered
            if not v.recovered:
                v.reasons.append(f"not recovered ({exp.recovery} expected)")
        elif f.kind in ("net", "stress", "disk"):
            v.checks["no restart"] = restart is None or restart.t >= t_next
            if not v.checks["no restart"]:
                v.reasons.append("the job restarted for a fault it should ride out")
        v.checks["job finished"] = launcher_ok
        if final_equal is not None:
            v.checks["final state as expected"] = final_equal == exp.final_equal
            if not v.checks["final state as expected"]:
                v.reasons.append(f"final model {'equal' if final_equal else 'not equal'} to the reference")
        v.passed = all(v.checks.values())
        out.append(v)
    return out


def _recovery(v: FaultVerdict, f: FaultSpec, exp: Expect, inj: Event, det: Event | None,
              evs: Sequence[Event], steps: Sequence[Event], t_next: float) -> None:
    """Fill ``recovered``, ``recovery``, ``rto_s``, ``steps_lost`` from the events after ``inj``."""
    t0 = inj.t
    restart = _first(evs, ["launcher.restart"], t0)
    after = [e for e in steps if e.t > t0]
    later_attempt = [e for e in after if restart is not None and e.t > restart.t]
    if exp.recovery == "skip":
        sk = _first(evs, ["guard.skip"], t0, lambda e: e.step == f.step)
        v.recovered, v.recovery, v.steps_lost = sk is not None, "step skipped on every rank" if sk else None, 0
    elif exp.recovery in ("restart", "fallback") or (f.kind == "net" and restart is not None and restart.t < t_next):
        if later_attempt:
            first = later_attempt[0]
            loaded = _first(evs, ["ckpt.loaded"], restart.t if restart else t0)
            resumed = int(loaded.data.get("step", loaded.step or 0)) if loaded else first.step - 1
            v.recovered = True
            v.recovery = f"restart, resumed from step {resumed}"
            healed = _first(evs, ["inject.net_healed"], t0)
            if f.kind == "net" and healed is not None and healed.t <= first.t:
                v.recovery += " once the link healed (no shrink)"
            if exp.recovery == "fallback":
                dmg = int(inj.data.get("ckpt_step", -1))
                v.recovery = f"fell back to step {resumed} (damaged: {dmg})"
                v.checks["fell back past the damaged checkpoint"] = resumed < dmg
    elif exp.recovery == "resubmit":
        starts = [e for e in evs if e.kind == "launcher.started" and e.t > t0]
        res_steps = [e for e in steps if starts and e.t > starts[0].t]
        if res_steps:
            loaded = _first(evs, ["ckpt.loaded"], starts[0].t)
            resumed = int(loaded.data.get("step", loaded.step or 0)) if loaded else res_steps[0].step - 1
            before = max((e.step for e in steps if e.t <= starts[0].t), default=0)
            v.recovered, v.rto_s = True, _r(res_steps[0].t - t0)
            v.steps_lost = max(before - resumed, 0)
            v.recovery = f"resubmitted, resumed from step {resumed}"
    elif exp.recovery == "rollback":
        rep = _first(evs, ["sdc.repaired", "guard.rollback"], t0)
        v.recovered, v.recovery = rep is not None, (f"{rep.kind} at step {rep.step}" if rep else None)
        v.steps_lost = 0
    elif exp.recovery == "continue" and f.kind == "disk":
        failed_step = int(det.data.get("step", det.step or 0) or 0) if det else f.step
        ok = _first(evs, ["ckpt.saved"], det.t if det else t0,
                    lambda e: int(e.data.get("step", e.step or 0) or 0) > failed_step)
        v.recovered, v.recovery, v.steps_lost = ok is not None, (f"next save ok (step {ok.step})" if ok else None), 0
    else:
        v.recovered = (restart is None or restart.t >= t_next) and bool(after)
        v.recovery, v.steps_lost = ("no restart needed" if v.recovered else "restarted"), 0
