"""Step executions of a run, and which of them were kept.

A *step execution* is one run of optimizer step ``s`` by the job, seen as the ``step``
events of every rank for the same ``(attempt, step, occurrence)``; it ends when the
slowest rank reports it. The *lineage* is the chain of executions the final model
descends from: a restart that resumes from checkpoint step ``c`` discards the executions
of steps ``> c`` (they are *recomputed*), and a step executed again inside the same
attempt (a guard replay) discards the earlier execution (*replayed*). A kept execution
whose update was skipped by the guard is *skipped*, not goodput.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Iterable, Sequence

from titan.events import Event

__all__ = ["StepExec", "step_executions", "resolve_lineage", "resume_step", "event_attempt"]

KEPT = "goodput"
RECOMPUTE = "recompute"
SKIPPED = "skipped_replayed"


@dataclasses.dataclass
class StepExec:
    """One job-level execution of a step; ``label`` is set by ``resolve_lineage``."""

    attempt: int
    step: int
    occurrence: int
    t_end: float
    dur: float
    skipped: bool
    loss: float | None
    ranks: tuple[int, ...]
    label: str = KEPT
    start: float = 0.0  # set when the timeline is tiled

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.attempt, self.step, self.occurrence)


def event_attempt(ev: Event) -> int:
    """The attempt of an event (0 when the writer did not know it)."""
    return ev.attempt if ev.attempt is not None else 0


def _num(x: object) -> float | None:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v


def step_executions(events: Iterable[Event]) -> list[StepExec]:
    """Group ``step`` events into job-level executions ordered by completion time. O(n)."""
    occ: dict[tuple[int, int, int], int] = defaultdict(int)  # (attempt, rank, step) -> seen
    groups: dict[tuple[int, int, int], list[Event]] = defaultdict(list)
    for ev in events:
        if ev.kind != "step" or ev.step is None:
            continue
        a, r = event_attempt(ev), ev.rank if ev.rank is not None else 0
        k = occ[(a, r, ev.step)]
        occ[(a, r, ev.step)] = k + 1
        groups[(a, ev.step, k)].append(ev)
    out: list[StepExec] = []
    for (a, s, k), evs in groups.items():
        durs = [d for d in (_num(e.data.get("step_time_s")) for e in evs) if d is not None and d >= 0]
        losses = [v for v in (_num(e.data.get("loss")) for e in sorted(evs, key=lambda e: e.rank or 0)) if v is not None]
        out.append(StepExec(
            attempt=a, step=s, occurrence=k, t_end=max(e.t for e in evs), dur=max(durs) if durs else 0.0,
            skipped=any(bool(e.data.get("skipped")) for e in evs), loss=losses[0] if losses else None,
            ranks=tuple(sorted({e.rank if e.rank is not None else 0 for e in evs})),
        ))
    out.sort(key=lambda x: (x.t_end, x.attempt, x.step))
    return out


def resume_step(events: Sequence[Event], attempt: int, first_step: int) -> int:
    """The step an attempt resumed after: its ``ckpt.loaded`` step, else ``first_step − 1``."""
    loaded = [ev for ev in events if ev.kind == "ckpt.loaded" and event_attempt(ev) == attempt]
    steps: list[int] = []
    for ev in loaded:
        v = ev.data.get("step", ev.step)
        if v is not None:
            steps.append(int(v))
    return max(steps) if steps else first_step - 1


def resolve_lineage(execs: list[StepExec], events: Sequence[Event]) -> dict[int, list[StepExec]]:
    """Label every execution ``goodput``/``recompute``/``skipped_replayed`` in place.

    Returns, per attempt that rolled back, the executions it discarded (for RPO).
    """
    # In-process rollbacks (guard.rollback with restored_step) turn a re-execution inside one
    # attempt into lost work, like a restart; without one it is a replay.
    rollbacks = sorted((ev.t, event_attempt(ev)) for ev in events
                       if ev.kind == "guard.rollback" and ev.data.get("restored_step") is not None)
    used: set[int] = set()
    lineage: dict[int, StepExec] = {}
    top = -1  # highest step in the lineage (kept in a variable: max() per step would be O(n²))
    cur: int | None = None
    discarded: dict[int, list[StepExec]] = defaultdict(list)
    for e in execs:
        if e.attempt != cur:
            if cur is not None:
                c = resume_step(events, e.attempt, e.step)
                if top > c:
                    for s in [s for s in lineage if s > c]:
                        lineage[s].label = RECOMPUTE
                        discarded[e.attempt].append(lineage.pop(s))
                    top = max(lineage, default=-1)
            cur = e.attempt
        elif e.step <= top:
            rb = next((i for i, (t, a) in enumerate(rollbacks) if i not in used and a == e.attempt and t <= e.t_end), None)
            if rb is not None:
                used.add(rb)
            for s in [s for s in lineage if s >= e.step]:
                x = lineage.pop(s)
                x.label = RECOMPUTE if rb is not None else SKIPPED
                if rb is not None:
                    discarded[e.attempt].append(x)
            top = max(lineage, default=-1)
        lineage[e.step] = e
        top = max(top, e.step)
    for e in lineage.values():
        e.label = SKIPPED if e.skipped else KEPT
    return dict(discarded)
