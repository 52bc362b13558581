"""A run's headline figures: one computation for every place that prints them.

``titan report`` (summary cards, the terminal table, ``summary.md``/``summary.json``) and
``titan drill`` (its summary line and every fault's RTO and steps lost) take them from
here, from the same :class:`~titan.sla.accounting.Accounting`, so on one run directory they
agree field by field (``tests/chaos/test_drill_report_agree.py``).

Definitions (``docs/sla.md``): **wall** is the accounted span ``T1 − T0``; an
**interruption** is an incident of kind ``restart`` or ``fatal``; the **worst RTO** is the
largest RTO among interruptions; **steps lost** is the sum of every incident's RPO steps
(work thrown away and recomputed); **steps skipped** the updates the guard dropped;
**restarts** counts ``launcher.restart`` events; **worker failures** counts every worker
process that exited with an error (``worker.failed``): the faulty rank *and* the peers that
failed because it went away, so one kill of a 2-rank group is 1 interruption, 1 restart
and up to 2 worker failures.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from titan.sla.accounting import Accounting
from titan.sla.incidents import Incident
from titan.sla.steps import RECOMPUTE

__all__ = ["RunFigures", "run_figures", "incident_in_window", "INTERRUPTION_KINDS"]

INTERRUPTION_KINDS = ("restart", "fatal")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFigures:
    """The figures both the report and the drill print (see the module doc)."""

    wall_s: float
    goodput_fraction: float
    interruptions: int
    restarts: int
    worker_failures: int
    worst_rto_s: float | None
    steps_lost: int
    steps_recomputed: int
    steps_skipped: int
    last_step: int | None
    incidents: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_figures(acc: Accounting) -> RunFigures:
    """The headline figures of one accounted run. Cost: O(incidents + step executions)."""
    hard = [i for i in acc.incidents if i.kind in INTERRUPTION_KINDS]
    rtos = [i.rto_s for i in hard if i.rto_s is not None]
    return RunFigures(
        wall_s=acc.wall_s, goodput_fraction=acc.goodput_fraction, interruptions=len(hard),
        restarts=int(acc.counts.get("restarts", 0)), worker_failures=int(acc.counts.get("worker_failures", 0)),
        worst_rto_s=max(rtos) if rtos else None, steps_lost=sum(i.rpo_steps for i in acc.incidents),
        steps_recomputed=sum(1 for e in acc.execs if e.label == RECOMPUTE),
        steps_skipped=sum(i.skipped_steps for i in acc.incidents),
        last_step=max((e.step for e in acc.execs), default=None), incidents=len(acc.incidents))


def incident_in_window(acc: Accounting, t0: float, t1: float = float("inf"), *,
                       kinds: tuple[str, ...] = ("restart", "fatal", "guard"), slack_s: float = 0.5) -> Incident | None:
    """The incident a fault injected at ``t0`` caused (its window ends where the next fault's
    begins at ``t1``); ``None`` when it caused none (a tolerated fault).

    The accounting names each incident's injection (``cause``, the ``inject.*`` event's time):
    the incident whose cause is the event at ``t0`` is the one. Else the incident of ``kinds``
    whose onset lies in ``[t0 − slack_s, t1)`` nearest to ``t0`` — not the first: steps can be
    a few ms apart, and the previous fault's incident may start within the slack (the onset
    can precede the event by the few ms between an injector's act and its write)."""
    cands = [inc for inc in acc.incidents if inc.kind in kinds and t0 - slack_s <= inc.onset_t < t1]
    own = [inc for inc in cands if isinstance((inc.cause or {}).get("t"), (int, float))
           and abs(float(inc.cause["t"]) - t0) < 1e-6]  # type: ignore[index]
    return min(own or cands, key=lambda inc: (abs(inc.onset_t - t0), inc.index), default=None)
