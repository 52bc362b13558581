"""Failures of attempts and in-process incidents: onset, detection, RTO and RPO.

An *attempt failure* is an attempt (one generation of workers) that stopped making
progress and was followed by another attempt or by the end of the job. Its **onset** is
the injected fault (the latest ``inject.*`` event during or after the attempt's last
step) or, for a real fault, the last progress beacon (the attempt's last ``step``
event). Its **detection** is the first detection event (``DETECT_KINDS``) after the last
step. **RTO** runs from onset to the first kept step after recovery; **RPO** is the
number of steps whose results were lost (and the seconds spent computing them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from titan.events import Event
from titan.sla.steps import KEPT, StepExec, event_attempt

__all__ = ["DETECT_KINDS", "GUARD_KINDS", "Failure", "Incident", "attempt_failures", "build_incidents",
           "stepless_failures"]

#: Events that mean "the job noticed a fault" (the end of detection latency).
DETECT_KINDS = ("worker.failed", "hang.detected", "launcher.worker_failed", "launcher.failure",
                "launcher.restart", "dist.error", "dist.timeout", "guard.escalate", "worker.exception")
#: In-process defences that skip or replay a step without a restart.
GUARD_KINDS = ("guard.nonfinite", "guard.spike", "guard.skip", "guard.replay")


@dataclasses.dataclass
class Failure:
    """How one attempt ended: fault onset and its detection (UNIX seconds)."""

    attempt: int
    last_step: int
    last_end: float
    onset: float
    onset_source: str
    detect: float
    detect_kind: str
    rank: int | None
    next_attempt: int | None
    restarted: bool = False  # a later attempt started (it may have run no step)
    stepless: bool = False  # the attempt failed before its first step (e.g. in init)


@dataclasses.dataclass
class Incident:
    """One fault the job went through; times are UNIX seconds, durations seconds."""

    index: int
    kind: str  # restart | fatal | guard
    attempt: int
    onset_t: float
    onset_source: str
    detect_t: float
    detect_kind: str
    rank: int | None
    step: int | None
    detection_s: float
    rto_s: float | None
    rpo_steps: int
    rpo_s: float
    resumed_from: int | None = None
    recovered_t: float | None = None
    caught_up_t: float | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _rank_of(ev: Event) -> int | None:
    r = ev.data.get("rank", ev.rank)
    try:
        return int(r) if r is not None else None
    except (TypeError, ValueError):
        return None


def attempt_failures(events: Sequence[Event], execs: Sequence[StepExec], t1: float) -> dict[int, Failure]:
    """Find, for each attempt that ran steps, how it failed (absent: it did not fail)."""
    order: list[int] = []
    by_att: dict[int, list[StepExec]] = {}
    for e in execs:
        if e.attempt not in by_att:
            order.append(e.attempt)
            by_att[e.attempt] = []
        by_att[e.attempt].append(e)
    out: dict[int, Failure] = {}
    for i, a in enumerate(order):
        ex = by_att[a]
        last_end = ex[-1].t_end
        prev_end = ex[-2].t_end if len(ex) > 1 else ex[0].t_end - ex[0].dur
        nxt = order[i + 1] if i + 1 < len(order) else None
        horizon = (by_att[nxt][0].t_end - by_att[nxt][0].dur) if nxt is not None else t1
        cands = [ev for ev in events if ev.kind in DETECT_KINDS and last_end <= ev.t <= horizon]
        if not cands and nxt is None:
            continue
        if cands:
            det = min(cands, key=lambda ev: ev.t)
            detect, detect_kind, rank = det.t, det.kind, _rank_of(det)
        else:  # the next generation started without any detection event: the restart is the detection
            starts = [ev.t for ev in events if ev.rank is not None and event_attempt(ev) == nxt]
            detect, detect_kind, rank = (min(starts) if starts else horizon), "next attempt started", None
        injects = [ev for ev in events if ev.kind.startswith("inject.") and prev_end <= ev.t <= detect]
        if injects:
            inj = max(injects, key=lambda ev: ev.t)
            onset, src = _onset_time(inj), inj.kind
            rank = rank if rank is not None else _rank_of(inj)
        else:
            onset, src = last_end, "last progress"
        later = nxt is not None or any(ev.rank is not None and event_attempt(ev) > a and ev.t >= last_end
                                       for ev in events)
        out[a] = Failure(attempt=a, last_step=max(e.step for e in ex), last_end=last_end, onset=onset,
                         onset_source=src, detect=max(detect, onset), detect_kind=detect_kind, rank=rank,
                         next_attempt=nxt, restarted=later)
    return out


def stepless_failures(events: Sequence[Event], execs: Sequence[StepExec]) -> list[Failure]:
    """Attempts that failed before their first step (init, rendezvous, checkpoint load).

    Only attempts with a detection event inside them count; onset is an ``inject.*``
    event in the attempt or, failing that, its last event before the detection.
    """
    stepping = {e.attempt for e in execs}
    first: dict[int, float] = {}
    for ev in events:
        if ev.rank is not None:
            a = event_attempt(ev)
            first[a] = min(first.get(a, ev.t), ev.t)
    order = sorted(first, key=lambda a: first[a])
    out: list[Failure] = []
    for i, a in enumerate(order):
        if a in stepping:
            continue
        end = first[order[i + 1]] if i + 1 < len(order) else float("inf")
        cands = [ev for ev in events if ev.kind in DETECT_KINDS and first[a] <= ev.t <= end]
        if not cands:
            continue
        det = min(cands, key=lambda ev: ev.t)
        injects = [ev for ev in events if ev.kind.startswith("inject.") and first[a] <= ev.t <= det.t]
        own = [ev.t for ev in events if ev.rank is not None and event_attempt(ev) == a and ev.t <= det.t]
        if injects:
            inj = max(injects, key=lambda ev: ev.t)
            onset, src, rank = _onset_time(inj), inj.kind, _rank_of(inj)
        else:
            onset, src, rank = max(own, default=det.t), "last progress", None
        later = [b for b in order[i + 1:] if b in stepping]
        out.append(Failure(attempt=a, last_step=-1, last_end=onset, onset=onset, onset_source=src,
                           detect=max(det.t, onset), detect_kind=det.kind, rank=_rank_of(det) if rank is None else rank,
                           next_attempt=later[0] if later else None, restarted=i + 1 < len(order), stepless=True))
    return out


def _onset_time(ev: Event) -> float:
    # The injector may record the exact moment of the fault (e.g. the drill's t_kill,
    # taken just before os.kill) a few ms before it wrote the event.
    for k in ("t_onset", "t_kill", "t_inject"):
        v = ev.data.get(k)
        if isinstance(v, (int, float)) and abs(v - ev.t) < 60.0:
            return float(v)
    return ev.t


def _last_saved_step(events: Sequence[Event], before: float) -> int | None:
    steps = [int(ev.data.get("step", ev.step)) for ev in events
             if ev.kind == "ckpt.saved" and ev.t <= before and ev.data.get("step", ev.step) is not None]
    return max(steps) if steps else None


def build_incidents(events: Sequence[Event], execs: Sequence[StepExec], failures: dict[int, Failure],
                    discarded: dict[int, list[StepExec]], stepless: Sequence[Failure] = ()) -> list[Incident]:
    """Incidents in time order: attempt failures (restart/fatal) and guard skips/replays."""
    incidents: list[Incident] = []
    kept_after = sorted((e for e in execs if e.label == KEPT), key=lambda e: e.t_end)

    def first_kept(after: float, min_step: int | None = None) -> StepExec | None:
        for e in kept_after:
            if e.t_end > after and (min_step is None or e.step > min_step):
                return e
        return None

    for f in [*failures.values(), *stepless]:
        lost = discarded.get(f.next_attempt, []) if f.next_attempt is not None and not f.stepless else []
        if f.stepless:
            rec = first_kept(f.detect)
            resumed, caught, rpo_steps = None, None, 0
            kind = "restart" if f.restarted else "fatal"
        elif f.next_attempt is not None:
            nxt = [e for e in execs if e.attempt == f.next_attempt]
            resumed = min(e.step for e in nxt) - 1 if nxt else None
            rec = first_kept(f.detect)
            caught = first_kept(f.detect, f.last_step)
            rpo_steps = max(0, f.last_step - resumed) if resumed is not None else 0
            kind = "restart"
        else:  # no later attempt ran a step: the job ended here (after restarts that never stepped, or none)
            resumed, rec, caught = None, None, None
            saved = _last_saved_step(events, f.detect)
            rpo_steps = f.last_step - (saved or 0)
            kind = "restart" if f.restarted else "fatal"
        incidents.append(Incident(
            index=0, kind=kind, attempt=f.attempt, onset_t=f.onset, onset_source=f.onset_source,
            detect_t=f.detect, detect_kind=f.detect_kind, rank=f.rank, step=None if f.stepless else f.last_step,
            detection_s=f.detect - f.onset, rto_s=(rec.t_end - f.onset) if rec else None,
            rpo_steps=rpo_steps, rpo_s=0.0, resumed_from=resumed,
            recovered_t=rec.t_end if rec else None, caught_up_t=caught.t_end if caught else None,
            data={"stepless": True} if f.stepless else
            {"lost_window": (min([e.start for e in lost] + [f.last_end]), max(f.onset, f.last_end))},
        ))
    seen: dict[tuple[int, int], Incident] = {}
    for ev in events:
        if ev.kind not in GUARD_KINDS or ev.step is None:
            continue
        key = (event_attempt(ev), ev.step)
        if key in seen:
            kinds = seen[key].data["kinds"]
            if ev.kind not in kinds:
                kinds.append(ev.kind)
            continue
        injects = [x for x in events if x.kind.startswith("inject.") and x.t <= ev.t
                   and event_attempt(x) == key[0] and (x.step is None or x.step >= ev.step - 1)]
        onset_ev = max(injects, key=lambda x: x.t) if injects else None
        onset = _onset_time(onset_ev) if onset_ev else ev.t
        rec = first_kept(ev.t)
        wasted = [e for e in execs if (e.attempt, e.step) == key and e.label != KEPT]
        inc = Incident(
            index=0, kind="guard", attempt=key[0], onset_t=onset,
            onset_source=onset_ev.kind if onset_ev else ev.kind, detect_t=ev.t, detect_kind=ev.kind,
            rank=_rank_of(ev), step=ev.step, detection_s=ev.t - onset,
            rto_s=(rec.t_end - onset) if rec else None, rpo_steps=1 if wasted else 0,
            rpo_s=sum(e.t_end - e.start for e in wasted), recovered_t=rec.t_end if rec else None,
            data={"kinds": [ev.kind]},
        )
        seen[key] = inc
        incidents.append(inc)
    incidents.sort(key=lambda i: i.onset_t)
    for n, inc in enumerate(incidents, start=1):
        inc.index = n
    return incidents
