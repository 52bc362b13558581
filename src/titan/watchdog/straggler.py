"""Straggler detection: a rank whose compute time is persistently above its peers'.

Input: per rank, ``(step, compute_s)`` from the beacons' step rings (compute = the
``data``, ``forward`` and ``optimizer`` phases and the step's unmarked time — not
``backward``, where a fast rank waits for a slow one's gradients; ``titan.beacon.core``). Every ``window // 2`` steps, over the last ``window``
steps common to all ranks: each rank's median compute time vs the median ``pm`` and MAD
of its peers' samples pooled (works from two ranks up). A rank is *slow* in a check when
its median exceeds ``pm × (1 + margin)`` **and** ``pm + k × MAD`` **and** ``pm + min_excess``
(``straggler_min_excess_s``, 2 ms: below it a rank costs the job little, and on a shared
host the scheduler alone makes a millisecond step 30 % slower — a clean 2-rank run of ~0.7 ms
steps flagged rank 0 at 1.40×, 0.29 ms). Flagged after ``persist`` consecutive slow
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
        self.min_excess = float(cfg.straggler_min_excess_s)
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
        """Run every check that new common steps allow; returns the flags raised now.

        Checks fall on steps (the ``window``-th common step, then every ``window // 2``),
        not on calls: the watchdog calls this once per poll, and with fast steps one poll
        brings tens of new steps (a 1 ms step at 0.1 s polls: ~30). Before, one call ran one
        check, over the newest window only, so a straggler's second check — and its flag —
        came at whatever step the polls happened to land on (step 57 or 60 instead of 30).
        A flag's ``step`` is the last step of the window that decided it.
        """
        ranks = sorted(self._samples)
        if len(ranks) < 2:
            return []
        common = sorted(set.intersection(*(set(self._samples[r]) for r in ranks)))
        half = max(1, self.window // 2)
        out: list[Flag] = []
        for i in range(self.window - 1, len(common)):
            end = common[i]
            if end <= self._last_check_step or (self._last_check_step and end - self._last_check_step < half):
                continue
            self._last_check_step = end
            out += self._check_window(ranks, common[i - self.window + 1:i + 1])
        self.flags.extend(out)
        return out

    def _check_window(self, ranks: list[int], steps: list[int]) -> list[Flag]:
        med = {r: statistics.median(self._samples[r][s] for s in steps) for r in ranks}
        out: list[Flag] = []
        for r in ranks:
            pool = [self._samples[p][s] for p in ranks if p != r for s in steps]
            pm = statistics.median(pool)
            pmad = statistics.median(abs(x - pm) for x in pool)
            slow = (pm > 0 and med[r] > pm * (1 + self.margin) and med[r] > pm + self.k * pmad
                    and med[r] - pm > self.min_excess)
            self._slow_runs[r] = self._slow_runs[r] + 1 if slow else 0
            if slow and self._slow_runs[r] % self.persist == 0:
                out.append(Flag(rank=r, slowdown=med[r] / pm, step=steps[-1], median_s=med[r], peers_median_s=pm,
                                window=self.window, checks=self._slow_runs[r]))
        return out
