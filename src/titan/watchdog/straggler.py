"""Straggler detection: a rank whose compute time is persistently above its peers'.

Input: per rank, ``(step, compute_s)`` from the beacons' step rings (compute = the
``data``, ``forward`` and ``optimizer`` phases — not ``backward``, where a fast rank
waits for a slow one's gradients). Every ``window // 2`` steps, over the last ``window``
steps common to all ranks: each rank's median compute time vs the median ``pm`` and MAD
of its peers' samples pooled (works from two ranks up). A rank is *slow* in a check when
its median exceeds ``pm × (1 + margin)`` **and** ``pm + k × MAD``. Flagged after ``persist`` consecutive slow
checks (one ``straggler.detected``); then every further ``persist`` checks again.
"""

from __future__ import annotations

import collections
import statistics
from typing import Any

__all__ = ["StragglerDetector", "Flag"]


class Flag(dict):
    """A straggler finding: rank, slowdown (its median / peers' median), step, medians."""


class StragglerDetector:
    """Feed it step samples; ``check()`` returns new flags. Cost: O(ranks × window) per check."""

    def __init__(self, cfg: Any) -> None:
        self.window = int(cfg.straggler_window)
        self.margin = float(cfg.straggler_margin)
        self.k = float(cfg.straggler_mad_k)
        self.persist = int(cfg.straggler_persist)
        self._samples: dict[int, dict[int, float]] = collections.defaultdict(dict)  # rank -> step -> s
        self._slow_runs: dict[int, int] = collections.defaultdict(int)
        self._last_check_step = 0
        self.flags: list[Flag] = []

    def reset(self) -> None:
        """Forget samples (a new attempt renumbers nothing but the group may have changed)."""
        self._samples.clear()
        self._slow_runs.clear()
        self._last_check_step = 0

    def add(self, rank: int, step: int, compute_s: float) -> None:
        d = self._samples[rank]
        d[step] = compute_s
        if len(d) > 4 * self.window:
            for s in sorted(d)[: len(d) - 2 * self.window]:
                del d[s]

    def check(self) -> list[Flag]:
        """Run a check when enough new common steps arrived; returns the flags raised now."""
        ranks = sorted(self._samples)
        if len(ranks) < 2:
            return []
        common = set.intersection(*(set(self._samples[r]) for r in ranks))
        if len(common) < self.window:
            return []
        newest = max(common)
        if newest - self._last_check_step < max(1, self.window // 2):
            return []
        self._last_check_step = newest
        steps = sorted(common)[-self.window:]
        med = {r: statistics.median(self._samples[r][s] for s in steps) for r in ranks}
        out: list[Flag] = []
        for r in ranks:
            pool = [self._samples[p][s] for p in ranks if p != r for s in steps]
            pm = statistics.median(pool)
            pmad = statistics.median(abs(x - pm) for x in pool)
            slow = pm > 0 and med[r] > pm * (1 + self.margin) and med[r] > pm + self.k * pmad
            self._slow_runs[r] = self._slow_runs[r] + 1 if slow else 0
            if slow and self._slow_runs[r] % self.persist == 0:
                f = Flag(rank=r, slowdown=med[r] / pm, step=newest, median_s=med[r], peers_median_s=pm,
                         window=self.window, checks=self._slow_runs[r])
                out.append(f)
        self.flags.extend(out)
        return out
