"""Costs measured in a run directory, for ``titan plan --from RUN_DIR``."""

from __future__ import annotations

import statistics
from typing import Any

from titan.sla.accounting import Accounting

__all__ = ["measured_costs"]


def measured_costs(acc: Accounting) -> dict[str, Any]:
    """Checkpoint stall per checkpoint and mean restart cost (onset → first step of the next attempt).

    ``None`` for a cost the run did not exercise. The stall is the run's ``ckpt_stall`` time
    over its checkpoints (distinct saves, ``Accounting.counts``): what the model charges once
    per interval. Not the mean of the stall segments: the ranks of one save stall at offset
    times, and a stall is cut where a step ends, so one save is 1–3 segments (a 20-minute soak:
    2,058 segments, mean 0.053 s, for 1,118 saves of 0.101 s each — the planner, fed 0.053 s,
    predicted 2.8 points too much goodput). Restart cost here is the model's ``R``: detection
    latency plus restart, without the lost work (the model adds that itself).
    """
    stall_s = sum(b - a for a, b, lab in acc.segments if lab == "ckpt_stall")
    saves = int(acc.counts.get("checkpoints") or 0)
    restarts: list[float] = []
    for inc in acc.incidents:
        if inc.kind != "restart" or inc.recovered_t is None:
            continue
        first = next((e for e in acc.execs if e.t_end == inc.recovered_t), None)
        start = first.start if first is not None else inc.recovered_t
        restarts.append(start - inc.onset_t)
    return {
        "ckpt_stall_s": stall_s / saves if saves and stall_s > 0 else None,
        "ckpt_stall_samples": saves,
        "restart_s": statistics.fmean(restarts) if restarts else None,
        "restart_samples": len(restarts),
        "source": acc.run_dir,
    }
