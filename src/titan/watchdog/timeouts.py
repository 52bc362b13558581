"""Per-phase timeouts learned from observed durations.

``timeout(phase) = clamp(factor × p<percentile>(last `window` durations), floor, ceiling)``
once ``warmup_samples`` durations of that phase were seen. Before that, the step-level
statistics stand in (any phase is shorter than the step that contains it), and before
*those* are warm, ``warmup_timeout_s``. The window slides, so timeouts follow drift (a
model that gets slower as sequences grow, a shared machine that gets busier).
Phases with their own budget (``checkpoint``, ``restore``, ``init``, ``setup`` — the time
before a worker's first step) are not learned; ``idle`` (time outside any marked phase) is
learned but never tighter than ``idle_timeout_s``. ``snapshot`` (the per-step in-memory tier)
is learned, with the checkpoint budget until it has ``warmup_samples`` durations: its first
copy allocates the tier and can outlast the steps around it.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Iterable

__all__ = ["PhaseTimeouts", "percentile", "BUDGET_PHASES"]

#: Phases that are never learned: their budget comes from settings.
BUDGET_PHASES = {"checkpoint": "checkpoint_budget_s", "restore": "checkpoint_budget_s", "init": "init_budget_s",
                 "setup": "init_budget_s",
                 # a drill's rank waiting at its fault's gate while the driver prepares it
                 "gate": "checkpoint_budget_s"}


#: Phases learned like any other once warm, with a budget (not the step statistics) before.
WARMUP_BUDGET_PHASES = {"snapshot": "checkpoint_budget_s"}

#: Used only for a ``WatchdogConfig`` built outside ``Settings`` (auto values unresolved).
_UNRESOLVED_S = 120.0


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank, 0 < q <= 100); 0.0 for no values."""
    xs = sorted(values)
    if not xs:
        return 0.0
    k = max(0, min(len(xs) - 1, math.ceil(q / 100.0 * len(xs)) - 1))
    return xs[k]


class PhaseTimeouts:
    """Learns timeouts per phase name from durations in seconds. Cost: O(window log window) per query."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self._d: dict[str, collections.deque[float]] = {}
        self._steps: collections.deque[float] = collections.deque(maxlen=cfg.window)

    def observe(self, phase: str, seconds: float) -> None:
        """Add one observed duration of ``phase``."""
        q = self._d.get(phase)
        if q is None:
            q = self._d[phase] = collections.deque(maxlen=self.cfg.window)
        q.append(seconds)

    def observe_step(self, seconds: float) -> None:
        """Add one observed step time (fallback statistics for phases still warming up)."""
        self._steps.append(seconds)

    def samples(self, phase: str) -> int:
        return len(self._d.get(phase, ()))

    def p(self, phase: str) -> float:
        """The configured percentile of ``phase``'s durations (0.0 when none)."""
        return percentile(self._d.get(phase, ()), self.cfg.percentile)

    def step_p(self) -> float:
        return percentile(self._steps, self.cfg.percentile)

    def timeout(self, phase: str) -> tuple[float, str]:
        """(seconds, basis) — the basis says how the value was obtained, for the evidence."""
        c = self.cfg
        ceiling = c.ceiling_s if c.ceiling_s is not None else _UNRESOLVED_S
        if phase in BUDGET_PHASES:
            v = getattr(c, BUDGET_PHASES[phase])
            return float(v if v is not None else _UNRESOLVED_S), "budget"
        if phase == "idle":  # unmarked code: learned, but never tighter than idle_timeout_s
            learned, basis = self._learned(phase, ceiling)
            return min(ceiling, max(learned, c.idle_timeout_s)), f"{basis}, at least idle_timeout_s"
        return self._learned(phase, ceiling)

    def _learned(self, phase: str, ceiling: float) -> tuple[float, str]:
        c = self.cfg
        n = self.samples(phase)
        if n >= c.warmup_samples:
            return min(ceiling, max(c.floor_s, c.factor * self.p(phase))), f"p{c.percentile:g} of {n} {phase}"
        if phase in WARMUP_BUDGET_PHASES:
            v = getattr(c, WARMUP_BUDGET_PHASES[phase])
            return float(v if v is not None else _UNRESOLVED_S), f"budget until {c.warmup_samples} {phase} samples"
        if len(self._steps) >= c.warmup_samples:
            return min(ceiling, max(c.floor_s, c.factor * self.step_p())), f"p{c.percentile:g} of {len(self._steps)} steps"
        return min(ceiling, c.warmup_timeout_s), "warm-up"

    def summary(self) -> dict[str, dict[str, float]]:
        """Per phase: samples, percentile and timeout (for ``watchdog.timeouts`` events)."""
        out = {ph: {"samples": float(len(q)), "p_s": self.p(ph), "timeout_s": self.timeout(ph)[0]}
               for ph, q in self._d.items()}
        out["<step>"] = {"samples": float(len(self._steps)), "p_s": self.step_p(), "timeout_s": 0.0}
        return out
