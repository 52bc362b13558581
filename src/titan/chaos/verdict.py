"""Per-fault verdicts of a drill, computed from the run directory's events alone.

For each planned fault: the ground truth (its ``inject.*`` event), whether the defence that
should see it did (``detected_by`` names the component: guard, sdc, watchdog, launcher,
checkpoint, agent), how fast, whether it blamed the right rank/node/phase, how the job
recovered, the steps lost, and whether the final model equals the reference run's bits.
:data:`EXPECT` is the documented expected outcome of each kind (docs/chaos.md); a fault
passes when every expectation of its kind holds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from titan.chaos.plan import KINDS, FaultSpec, Plan
from titan.chaos.runtime import fault_id
from titan.events import Event

__all__ = ["Expect", "EXPECT", "FaultVerdict", "expect_for", "judge", "inject_kind", "skipped_steps"]


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a fault kind should lead to."""

    outcome: str  # detected | tolerated | undetected
    detectors: tuple[tuple[str, str], ...]  # (event kind, component) that count as detection
    recovery: str  # skip | restart | resubmit | fallback | continue | rollback | none
    final_equal: bool = True
    text: str = ""


_GUARD_NF = (("guard.nonfinite", "guard"),)
EXPECT: dict[str, Expect] = {
    "nan_grad": Expect("detected", _GUARD_NF, "skip", text="guard: non-finite gradient, replay clean -> step skipped on every rank"),
    "inf_loss": Expect("detected", _GUARD_NF, "skip", text="guard: non-finite loss -> step skipped"),
    "spike": Expect("detected", (("guard.spike", "guard"),), "skip", text="guard: loss spike (robust z) -> step skipped"),
    "poison_sample": Expect("detected", _GUARD_NF, "skip", text="guard: replay is bad again -> persistent, samples logged, skipped"),
    "bitflip": Expect("detected", (("sdc.mismatch", "sdc"),), "rollback",
                      text="sdc: replica fingerprints disagree -> repaired from a verified snapshot"),
    "gemm_perturb": Expect("detected", (("sdc.canary", "sdc"), ("sdc.mismatch", "sdc")), "rollback",
                           text="sdc: GEMM canary / fingerprints flag the rank"),
    "kill": Expect("detected", (("worker.failed", "launcher"),), "restart",
                   text="launcher: worker.failed with the signal -> group restart from the last checkpoint"),
    "hang": Expect("detected", (("hang.detected", "watchdog"),), "restart",
                   text="watchdog: hang.detected names rank and phase, kills the group -> restart"),
    "slow": Expect("detected", (("straggler.detected", "watchdog"),), "continue",
                   text="watchdog: straggler.detected names the rank; training continues"),
    "exception": Expect("detected", (("worker.fault", "worker"), ("worker.failed", "launcher")), "restart",
                        text="worker exits with the fault's class code -> restart"),
    "preempt": Expect("detected", (("ckpt.preempted", "checkpoint"),), "resubmit",
                      text="checkpoint saved on SIGTERM, exit 9 -> resubmitted job resumes, nothing lost"),
    "stress": Expect("tolerated", (("straggler.detected", "watchdog"), ("agent.alert", "agent")), "none",
                     text="tolerated: slower steps, no restart, same bits"),
}
_DISK = {
    "enospc": Expect("detected", (("ckpt.failed", "checkpoint"),), "continue",
                     text="checkpoint: save fails (ckpt.failed), training continues, a later save succeeds"),
    "slow_fsync": Expect("tolerated", (), "none",
                         text="tolerated: saves take longer (ckpt.saved total_s, shown as impact), nothing lost"),
    "corrupt": Expect("detected", (("ckpt.corrupt", "checkpoint"),), "fallback",
                      text="checkpoint: checksum mismatch on restore -> previous checkpoint, more steps recomputed"),
    "truncate": Expect("detected", (("ckpt.corrupt", "checkpoint"),), "fallback",
                       text="checkpoint: short file on restore -> previous checkpoint"),
}
_NET = {
    "loss": Expect("tolerated", (), "none", text="TCP retransmits; no restart, same bits"),
    "bandwidth": Expect("tolerated", (), "none", text="slower all-reduce; no restart, same bits"),
    "delay": Expect("tolerated", (), "none", text="slower all-reduce; no restart, same bits"),
    "partition": Expect("tolerated", (), "none", text="short: collectives resume when the link heals, no restart"),
    "partition_long": Expect("detected", (("hang.detected", "watchdog"),), "restart",
                             text="hang in phase comm, culprit: link between nodes; restart once healed"),
}


def expect_for(f: FaultSpec) -> Expect:
    """The documented expectation of fault ``f`` (disk/net depend on ``what``)."""
    if f.kind == "disk":
        return _DISK.get(str(f.get("what")), _DISK["enospc"])
    if f.kind == "net":
        return _NET.get(str(f.get("what")), _NET["loss"])
    if f.kind == "bitflip" and f.get("target") == "grad":
        return Expect("undetected", (), "none", final_equal=False,
                      text="a gradient flip is all-reduced identically on every rank: invisible to replica checks")
    return EXPECT[f.kind]


def inject_kind(f: FaultSpec) -> str:
    """The ``inject.*`` event kind a fault's injection writes."""
    return {"nan_grad": "inject.grad", "inf_loss": "inject.loss", "spike": "inject.loss"}.get(f.kind, f"inject.{f.kind}")


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


def _link_culprit(data: dict[str, Any]) -> bool:
    """True when a hang verdict shows every rank, on two or more nodes, waiting in the same
    collective: all issued the same ones and none completed the last (in flight in ``comm``),
    so no rank is behind — the link between the nodes is the culprit."""
    views = data.get("views") or []
    nodes = {v.get("node") for v in views}
    issued = {tuple(v.get("issued") or []) for v in views}
    in_flight = all(any(i > c for i, c in zip(v.get("issued") or [], v.get("completed") or [])) for v in views)
    return len(nodes) >= 2 and len(issued) == 1 and in_flight and data.get("reason") != "collective-seq"


def judge(plan: Plan, events: Sequence[Event], *, final_equal: bool | None, launcher_ok: bool) -> list[FaultVerdict]:
    """One verdict per planned fault (see the module doc). Cost: linear scans of ``events``."""
    evs = sorted(events, key=lambda e: e.t)
    steps = [e for e in evs if e.kind == "step" and e.step is not None]
    out = []
    for i, f in enumerate(plan.faults):
        exp = expect_for(f)
        what = str(f.get("where")) if f.kind == "hang" else (
            str(f.get("what")) if "what" in KINDS[f.kind] else None)
        inj = next((e for e in evs if e.kind == inject_kind(f) and (e.step == f.step or e.data.get("planned_step") == f.step)
                    and (f.rank is None or e.data.get("rank") in (None, f.rank))), None)
        v = FaultVerdict(id=fault_id(i, f), kind=f.kind, what=what, rank=f.rank, node=f.node, step=f.step,
                         expected=f"{exp.outcome}; {exp.recovery}", expected_text=exp.text, injected=inj is not None,
                         detected=False, detected_by=None, detection_s=None, attributed_ok=None, attribution=None,
                         recovered=False, recovery=None, rto_s=None, steps_lost=None, final_state_equal=final_equal,
                         passed=False)
        if inj is None:
            v.checks = {"injected": False}
            out.append(v)
            continue
        t0 = inj.t
        # This fault's window ends where the next fault's injection begins.
        t_end = min((e.t for e in evs if e.kind.startswith("inject.") and e.t > t0 + 0.05
                     and e.data.get("planned_step", e.step) != f.step), default=float("inf"))
        rank = f.rank if f.rank is not None else inj.data.get("rank")
        det_kinds = [k for k, _ in exp.detectors]

        def pred(e: Event) -> bool:
            if e.kind == "worker.failed":
                return rank is None or e.data.get("global_rank", e.rank) == rank
            if e.kind in ("guard.nonfinite", "guard.spike"):
                return e.step is not None and e.step >= f.step
            return True
        det = _first(evs, det_kinds, t0, pred)
        if det is not None:
            v.detected = True
            v.detected_by = dict(exp.detectors)[det.kind] + f" ({det.kind})"
            v.detection_s = _r(max(det.t - t0, 0.0))
            blame = det
            if det.kind.startswith("sdc."):  # the culprit is named after the replay, in a later sdc event
                blame = next((e for e in evs if e.kind.startswith("sdc.") and e.t >= det.t and e.t <= det.t + 60
                              and _sdc_ranks(e.data)), det)
            v.attributed_ok, v.attribution = _attribution(f, inj, blame, rank)
        # The node agent, where it ran, is a second witness of host-level faults.
        alerts = [e for e in evs if e.kind == "agent.alert" and t0 - 0.5 <= e.t <= min(t_end, t0 + 60)]
        if alerts and f.kind in ("disk", "stress", "net"):
            rules = ", ".join(sorted({str(e.data.get("rule") or e.msg[:40]) for e in alerts}))
            if v.detected:
                v.detected_by = f"{v.detected_by}; agent ({rules})"
            else:
                v.detected, v.detected_by = True, f"agent ({rules})"
                v.detection_s = _r(max(alerts[0].t - t0, 0.0))
        # Recovery.
        restart = _first(evs, ["launcher.restart"], t0)
        after = [e for e in steps if e.t > t0]
        later_attempt = [e for e in after if restart is not None and e.t > restart.t]
        if exp.recovery == "skip":
            sk = _first(evs, ["guard.skip"], t0, lambda e: e.step == f.step)
            v.recovered, v.recovery, v.steps_lost = sk is not None, "step skipped on every rank" if sk else None, 0
        elif exp.recovery in ("restart", "fallback") or (f.kind == "net" and restart is not None):
            if later_attempt:
                first = later_attempt[0]
                loaded = _first(evs, ["ckpt.loaded"], restart.t if restart else t0)
                resumed = int(loaded.data.get("step", loaded.step or 0)) if loaded else first.step - 1
                before = max((e.step for e in steps if e.t <= t0), default=0)
                v.recovered = True
                v.rto_s = _r(first.t - t0)
                v.steps_lost = max(before - resumed, 0)
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
            v.recovered = (restart is None or restart.t >= t_end) and bool(after)
            v.recovery, v.steps_lost = ("no restart needed" if v.recovered else "restarted"), 0
        if f.kind in ("net", "stress", "slow", "disk"):
            v.impact = _impact(f, inj, evs, steps)
        v.checks.update({"injected": True})
        if exp.outcome == "detected":
            v.checks["detected"] = v.detected
            v.checks["attributed"] = bool(v.attributed_ok)
        elif exp.outcome == "undetected":
            v.checks["undetected (as documented)"] = not v.detected
        if exp.recovery not in ("none",):
            v.checks["recovered"] = v.recovered
        elif f.kind in ("net", "stress", "disk"):
            v.checks["no restart"] = restart is None or restart.t >= t_end
        v.checks["job finished"] = launcher_ok
        if final_equal is not None:
            v.checks["final state as expected"] = final_equal == exp.final_equal
        v.passed = all(v.checks.values())
        out.append(v)
    return out


def _impact(f: FaultSpec, inj: Event, evs: Sequence[Event], steps: Sequence[Event]) -> str | None:
    """What a tolerated fault did to the job: median step time before vs during it, and
    the evidence the driver recorded when it healed (e.g. packets dropped)."""
    import statistics

    healed = next((e for e in evs if e.kind == "inject.net_healed" and e.t > inj.t
                   and e.data.get("what") == inj.data.get("what")), None)
    t_end = healed.t if healed else inj.t + float(inj.data.get("seconds") or 5.0)
    r0 = [e for e in steps if (e.rank or 0) == 0 and "step_time_s" in e.data]
    before = [float(e.data["step_time_s"]) for e in r0 if e.t < inj.t][-5:]
    # Steps that were running at some point of the fault's window.
    during = [float(e.data["step_time_s"]) for e in r0 if e.t >= inj.t and e.t - float(e.data["step_time_s"]) <= t_end]
    parts = []
    if before and during:
        b, d = statistics.median(before), max(during)
        parts.append(f"step time {b:.2f} -> {d:.2f} s ({d / b:.1f}x)" if b > 0 else "")
    if f.kind == "disk" and f.get("what") == "slow_fsync":
        saves = [e for e in evs if e.kind == "ckpt.saved" and (e.rank or 0) == 0]
        # By the step saved, not the event time: an async save finishes after later steps.
        pre = [float(e.data.get("total_s") or 0) for e in saves if int(e.data.get("step", e.step or 0)) < f.step]
        post = next((float(e.data.get("total_s") or 0) for e in saves if int(e.data.get("step", e.step or 0)) >= f.step
                     and e.t > inj.t), None)
        if pre and post is not None:
            parts.append(f"checkpoint save {statistics.median(pre):.2f} -> {post:.2f} s")
    if healed and "dropped_packets" in healed.data:
        parts.append(f"{healed.data['dropped_packets']} packets dropped")
    return ", ".join(p for p in parts if p) or None


def _sdc_ranks(d: dict[str, Any]) -> set[int]:
    """Culprit ranks in an ``sdc.*`` event's data (``culprits`` keyed by rank, ``rank(s)``)."""
    out: set[int] = set()
    c = d.get("culprits")
    if isinstance(c, dict):
        out |= {int(k) for k in c if str(k).lstrip("-").isdigit()}
    elif isinstance(c, list):
        out |= {int(x["rank"] if isinstance(x, dict) else x) for x in c
                if isinstance(x, (int, dict)) and (not isinstance(x, dict) or "rank" in x)}
    for k in ("rank", "culprit_rank"):
        if isinstance(d.get(k), int):
            out.add(d[k])
    if isinstance(d.get("ranks"), list):
        out |= {int(x) for x in d["ranks"] if isinstance(x, int)}
    return out


def _attribution(f: FaultSpec, inj: Event, det: Event, rank: int | None) -> tuple[bool | None, str | None]:
    d = det.data
    if det.kind in ("guard.nonfinite", "guard.spike"):
        ranks = d.get("ranks") or []
        return (rank in ranks if rank is not None else None), f"ranks {ranks}"
    if det.kind in ("hang.detected", "hang.observed"):
        c = d.get("culprit") or {}
        if f.kind == "net":
            ok = _link_culprit(d)
            if not ok:
                return False, f"rank {c.get('rank')}, phase {c.get('phase')}"
            v0 = (d.get("views") or [{}])[0]
            return True, (f"link between nodes, phase comm (every rank issued {max(v0.get('issued') or [0])} "
                          f"collectives, none completed the last; beacon phase {c.get('phase')})")
        want_phase = inj.data.get("phase")
        ok = c.get("rank") == rank and (want_phase is None or c.get("phase") == want_phase)
        return ok, f"rank {c.get('rank')} node {c.get('node')} phase {c.get('phase')} step {c.get('step')}"
    if det.kind == "straggler.detected":
        return d.get("rank") == rank, f"rank {d.get('rank')} ({d.get('slowdown', 0):.2f}x)"
    if det.kind in ("worker.failed",):
        return d.get("global_rank", det.rank) == rank, f"rank {d.get('global_rank', det.rank)} {d.get('signal') or 'exit ' + str(d.get('exit_code'))}"
    if det.kind == "worker.fault":
        return det.rank == rank, f"rank {det.rank} {d.get('class')} in {det.phase}"
    if det.kind.startswith("sdc."):
        rs = _sdc_ranks(d)
        return (rank in rs if rank is not None else None), f"ranks {sorted(rs)} ({det.kind})"
    return True, det.kind
