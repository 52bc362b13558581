"""Costs measured in a run directory, for ``titan plan --from RUN_DIR``."""

from __future__ import annotations

import statistics
from typing import Any

from titan.sla.accounting import Accounting

__all__ = ["measured_costs"]


def measured_costs(acc: Accounting) -> dict[str, Any]:
    """Mean checkpoint stall and mean restart cost (onset → first step of the next attempt).

    ``None`` for a cost the run did not exercise. Restart cost here is the model's ``R``:
    detection latency plus restart, without the lost work (the model adds that itself).
    """
    stalls = [b - a for a, b, lab in acc.segments if lab == "ckpt_stall"]
    restarts: list[float] = []
    for inc in acc.incidents:
        if inc.kind != "restart" or inc.recovered_t is None:
            continue
        first = next((e for e in acc.execs if e.t_end == inc.recovered_t), None)
        start = first.start if first is not None else inc.recovered_t
        restarts.append(start - inc.onset_t)
    return {
        "ckpt_stall_s": statistics.fmean(stalls) if stalls else None,
        "ckpt_stall_samples": len(stalls),
        "restart_s": statistics.fmean(restarts) if restarts else None,
        "restart_samples": len(restarts),
        "source": acc.run_dir,
    }
