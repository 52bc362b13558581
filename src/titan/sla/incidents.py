"""Failures of attempts and in-process incidents: onset, detection, RTO and RPO.

An *attempt failure* is an attempt (one generation of workers) that stopped making
progress and was followed by another attempt or by the end of the job. Its **onset** is
the injected fault (the latest ``inject.*`` event during or after the attempt's last
step) or, for a real fault, the last progress beacon (the attempt's last ``step``
event). Its **detection** is the first detection event (``DETECT_KINDS``) after the last
step. **RTO** runs from onset to the first kept step after recovery; **RPO** is the
number of steps whose results were lost and must be recomputed (and the seconds spent
computing them). A step whose update the guard *skipped* is not lost — nothing is
recomputed — and is counted in ``skipped_steps`` instead.

An incident's **step** is the step the fault struck (the injection's step, else the step in
progress: one after the last completed one); its **rank** comes from the evidence — the
culprit a detector named (``culprit``, ``ranks``/``culprits`` of a guard event), else the
injected fault's rank, else the worker that died of a signal — never from which rank wrote
the event. :func:`titan.sla.figures.run_figures` derives the run's totals (worst RTO, steps
lost) that the report and the drill summary both print.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from titan.events import Event
from titan.sla.steps import KEPT, RECOMPUTE, SKIPPED, StepExec, event_attempt

__all__ = ["DETECT_KINDS", "GUARD_KINDS", "Failure", "Incident", "attempt_failures", "build_incidents",
           "culprit_ranks", "stepless_failures"]

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
    ranks: tuple[int, ...] = ()  # every culprit rank the evidence names
    cause: dict[str, Any] | None = None  # the injected fault (kind, t, step, rank), when one was


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
    #: every culprit rank named by the evidence (``rank`` is set only when there is one)
    ranks: list[int] = dataclasses.field(default_factory=list)
    #: the last step completed before the fault (attempt failures)
    last_step: int | None = None
    #: steps whose update the guard skipped (not lost: nothing is recomputed)
    skipped_steps: int = 0
    #: the injected fault behind it: ``{"kind", "t", "step", "rank"}`` (drills), else None
    cause: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _int(x: Any) -> int | None:
    if isinstance(x, bool):
        return None
    try:
        return int(x) if x is not None else None
    except (TypeError, ValueError):
        return None


def culprit_ranks(ev: Event) -> list[int]:
    """The ranks an event's evidence blames (not the rank that wrote it). O(size of data)."""
    d = ev.data
    out: list[int] = []
    c = d.get("culprit")
    if isinstance(c, dict) and _int(c.get("rank")) is not None:
        out.append(_int(c["rank"]))  # type: ignore[arg-type]
    for x in d.get("ranks") or [] if isinstance(d.get("ranks"), list) else []:
        if _int(x) is not None:
            out.append(_int(x))  # type: ignore[arg-type]
    cs = d.get("culprits")
    for x in cs if isinstance(cs, list) else []:
        r = _int(x.get("rank")) if isinstance(x, dict) else _int(x)
        if r is not None:
            out.append(r)
    if not out:
        for k in ("rank", "global_rank", "culprit_rank"):
            if _int(d.get(k)) is not None:
                out.append(_int(d[k]))  # type: ignore[arg-type]
                break
    return sorted(set(out))


def _rank_of(ev: Event) -> int | None:
    rs = culprit_ranks(ev)
    return rs[0] if len(rs) == 1 else None


def _cause(inj: Event | None) -> dict[str, Any] | None:
    if inj is None:
        return None
    step = _int(inj.data.get("planned_step", inj.step))
    return {"kind": inj.kind, "t": inj.t, "step": step, "rank": _rank_of(inj)}


def _signalled(events: Sequence[Event], t0: float, t1: float) -> int | None:
    """The rank of the one worker that died of a signal in ``[t0, t1]`` (a kill, an OOM)."""
    rs = {culprit_ranks(ev)[0] for ev in events if ev.kind == "worker.failed" and t0 <= ev.t <= t1
          and ev.data.get("signal") and culprit_ranks(ev)}
    return rs.pop() if len(rs) == 1 else None


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
            detect, detect_kind = det.t, det.kind
            # The first detector may be a peer that saw the culprit go (exit 1, no culprit):
            # any detection in the window that names one counts.
            named = [r for ev in cands if ev.kind != "worker.failed" for r in culprit_ranks(ev)]
        else:  # the next generation started without any detection event: the restart is the detection
            starts = [ev.t for ev in events if ev.rank is not None and event_attempt(ev) == nxt]
            detect, detect_kind, named = (min(starts) if starts else horizon), "next attempt started", []
        injects = [ev for ev in events if ev.kind.startswith("inject.") and prev_end <= ev.t <= detect]
        inj = max(injects, key=lambda ev: ev.t) if injects else None
        if inj is not None:
            onset, src = _onset_time(inj), inj.kind
        else:
            onset, src = last_end, "last progress"
        ranks = sorted(set(named)) or (culprit_ranks(inj) if inj is not None else [])
        if not ranks:
            sig = _signalled(events, last_end, horizon)
            ranks = [sig] if sig is not None else []
        later = nxt is not None or any(ev.rank is not None and event_attempt(ev) > a and ev.t >= last_end
                                       for ev in events)
        out[a] = Failure(attempt=a, last_step=max(e.step for e in ex), last_end=last_end, onset=onset,
                         onset_source=src, detect=max(detect, onset), detect_kind=detect_kind,
                         rank=ranks[0] if len(ranks) == 1 else None, next_attempt=nxt, restarted=later,
                         ranks=tuple(ranks), cause=_cause(inj))
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
        inj = max(injects, key=lambda ev: ev.t) if injects else None
        if inj is not None:
            onset, src = _onset_time(inj), inj.kind
        else:
            onset, src = max(own, default=det.t), "last progress"
        ranks = culprit_ranks(det) if det.kind != "worker.failed" else []
        ranks = ranks or (culprit_ranks(inj) if inj is not None else []) or (
            [r] if (r := _signalled(events, first[a], end)) is not None else [])
        later = [b for b in order[i + 1:] if b in stepping]
        out.append(Failure(attempt=a, last_step=-1, last_end=onset, onset=onset, onset_source=src,
                           detect=max(det.t, onset), detect_kind=det.kind, rank=ranks[0] if len(ranks) == 1 else None,
                           next_attempt=later[0] if later else None, restarted=i + 1 < len(order), stepless=True,
                           ranks=tuple(ranks), cause=_cause(inj)))
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
        struck = None if f.stepless else (f.cause or {}).get("step") or f.last_step + 1
        incidents.append(Incident(
            index=0, kind=kind, attempt=f.attempt, onset_t=f.onset, onset_source=f.onset_source,
            detect_t=f.detect, detect_kind=f.detect_kind, rank=f.rank, step=struck,
            detection_s=f.detect - f.onset, rto_s=(rec.t_end - f.onset) if rec else None,
            rpo_steps=rpo_steps, rpo_s=0.0, resumed_from=resumed,
            recovered_t=rec.t_end if rec else None, caught_up_t=caught.t_end if caught else None,
            data={"stepless": True} if f.stepless else
            {"lost_window": (min([e.start for e in lost] + [f.last_end]), max(f.onset, f.last_end))},
            ranks=list(f.ranks), last_step=None if f.stepless else f.last_step, cause=f.cause,
        ))
    seen: dict[tuple[int, int], Incident] = {}
    for ev in events:
        if ev.kind not in GUARD_KINDS or ev.step is None:
            continue
        key = (event_attempt(ev), ev.step)
        if key in seen:
            inc = seen[key]
            if ev.kind not in inc.data["kinds"]:
                inc.data["kinds"].append(ev.kind)
            if not inc.ranks and culprit_ranks(ev):  # a later guard event of the step names the culprit
                inc.ranks = culprit_ranks(ev)
                inc.rank = inc.ranks[0] if len(inc.ranks) == 1 else None
            continue
        injects = [x for x in events if x.kind.startswith("inject.") and x.t <= ev.t
                   and event_attempt(x) == key[0] and (x.step is None or x.step >= ev.step - 1)]
        onset_ev = max(injects, key=lambda x: x.t) if injects else None
        onset = _onset_time(onset_ev) if onset_ev else ev.t
        rec = first_kept(ev.t)
        wasted = [e for e in execs if (e.attempt, e.step) == key and e.label != KEPT]
        ranks = culprit_ranks(ev) or (culprit_ranks(onset_ev) if onset_ev else [])
        inc = Incident(
            index=0, kind="guard", attempt=key[0], onset_t=onset,
            onset_source=onset_ev.kind if onset_ev else ev.kind, detect_t=ev.t, detect_kind=ev.kind,
            rank=ranks[0] if len(ranks) == 1 else None, step=ev.step, detection_s=ev.t - onset,
            rto_s=(rec.t_end - onset) if rec else None,
            rpo_steps=sum(1 for e in wasted if e.label == RECOMPUTE),
            rpo_s=sum(e.t_end - e.start for e in wasted), recovered_t=rec.t_end if rec else None,
            data={"kinds": [ev.kind]}, ranks=ranks,
            skipped_steps=1 if any(e.label == SKIPPED for e in wasted) else 0, cause=_cause(onset_ev),
        )
        seen[key] = inc
        incidents.append(inc)
    incidents.sort(key=lambda i: i.onset_t)
    for n, inc in enumerate(incidents, start=1):
        inc.index = n
    return incidents
