"""Monte-Carlo simulation of checkpoint/restart under Poisson interruptions.

Simulates exactly the process of ``titan.sla.plan``'s closed form, so the two must agree
within sampling error: segments of ``τ`` s work plus a ``δ`` s checkpoint; exponential
inter-failure times of mean ``M``; an interruption loses the segment in progress and is
followed by a restart of ``R`` s that must itself finish uninterrupted. Every simulated
second lands in one bucket: work (kept), checkpoint, lost work (rework), restart.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

__all__ = ["SimResult", "simulate_goodput"]

_MAX_DRAWS = 3_000_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimResult:
    """Mean over replicas, with the standard error of the goodput."""

    replicas: int
    wall_s: float
    goodput: float
    goodput_stderr: float
    interruptions_per_day: float
    fractions: dict[str, float]
    truncated: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _one(rng: np.random.Generator, tau: float, ckpt: float, restart: float, mtbi: float,
         horizon: float, budget: int) -> tuple[dict[str, float], int, int]:
    acc = {"work": 0.0, "ckpt": 0.0, "lost": 0.0, "restart": 0.0}
    wall = 0.0
    failures = 0
    draws = 0
    seg = tau + ckpt
    batch = rng.exponential(mtbi, 4096)
    bi = 0
    while wall < horizon and draws < budget:
        need_restart = False
        while draws < budget:  # bounded here too: a restart longer than the MTBI may never finish
            if bi == len(batch):
                batch, bi = rng.exponential(mtbi, 4096), 0
            x = float(batch[bi])
            bi += 1
            draws += 1
            pre = restart if need_restart else 0.0
            if x >= pre + seg:
                acc["restart"] += pre
                acc["work"] += tau
                acc["ckpt"] += ckpt
                wall += pre + seg
                break
            failures += 1
            wall += x
            if x < pre:
                acc["restart"] += x
            else:
                acc["restart"] += pre
                acc["lost"] += x - pre
            need_restart = True
    return acc, failures, draws


def simulate_goodput(*, interval_s: float, ckpt_s: float, restart_s: float, mtbi: float,
                     horizon_s: float = 30 * 86400.0, replicas: int = 16, seed: int = 0) -> SimResult:
    """Run ``replicas`` independent simulated jobs of about ``horizon_s`` wall seconds each.

    Cost: one Python iteration per segment attempt (bounded at 3 M draws in total;
    ``truncated`` says when the bound cut a replica short).
    """
    rng = np.random.default_rng(seed)
    per_budget = max(1, _MAX_DRAWS // max(replicas, 1))
    goodputs: list[float] = []
    totals = {"work": 0.0, "ckpt": 0.0, "lost": 0.0, "restart": 0.0}
    fails = 0
    truncated = False
    for _ in range(replicas):
        acc, f, draws = _one(rng, interval_s, ckpt_s, restart_s, mtbi, horizon_s, per_budget)
        truncated |= draws >= per_budget
        wall = sum(acc.values())
        goodputs.append(acc["work"] / wall if wall else 0.0)
        for k, v in acc.items():
            totals[k] += v
        fails += f
    wall_total = sum(totals.values())
    arr = np.asarray(goodputs)
    stderr = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else float("nan")
    return SimResult(
        replicas=replicas, wall_s=wall_total / replicas,
        goodput=float(totals["work"] / wall_total) if wall_total else 0.0, goodput_stderr=stderr,
        interruptions_per_day=fails / wall_total * 86400.0 if wall_total else 0.0,
        fractions={k: v / wall_total for k, v in totals.items()} if wall_total else {}, truncated=truncated,
    )
