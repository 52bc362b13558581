"""Rolling robust statistics for spike detection: a recent median and the MAD of residuals.

A value is a spike when it lies more than ``z`` robust standard deviations *above* the
recent median (a falling loss is never a spike). The robust standard deviation is
``1.4826 × MAD`` of past residuals, floored at ``rel_floor × |median|`` so that a very flat
series does not turn ordinary noise into spikes. Cost: two medians of at most
``window × world`` floats per accepted step on the host (tens of microseconds).
"""

from __future__ import annotations

import collections
import math
import statistics
from typing import Any, Iterable

__all__ = ["RobustWindow"]

_MAD_TO_SIGMA = 1.4826


class RobustWindow:
    """Trend-robust spike statistics over the last ``window`` accepted steps.

    The *center* is the median of the last ``center_steps`` accepted steps (it follows a
    falling loss within a few steps); the *scale* is ``1.4826 × median |residual|`` over
    ``window`` steps, where a residual is a value minus the center at the time it was
    accepted — the noise around the trend, not the trend itself (a plain window MAD over a
    falling loss is inflated by the fall and hides spikes). ``log=True`` tracks
    ``log(x)`` (for grad norms, which are heavy-tailed).
    """

    def __init__(self, window: int, warmup: int, *, rel_floor: float, log: bool = False,
                 center_steps: int = 16) -> None:
        self.window = window
        self.warmup = warmup
        self.rel_floor = rel_floor
        self.log = log
        self.center_steps = min(center_steps, window)
        self._recent: collections.deque[list[float]] = collections.deque(maxlen=self.center_steps)
        self._resid: collections.deque[list[float]] = collections.deque(maxlen=window)
        self.accepted = 0
        self._cache: tuple[float, float] | None = None

    def _t(self, x: float) -> float:
        return math.log(max(x, 1e-30)) if self.log else x

    @property
    def ready(self) -> bool:
        """True once ``warmup`` accepted steps are in."""
        return self.accepted >= max(self.warmup, 2)

    def add(self, values: Iterable[float]) -> None:
        """Add one accepted step's finite values."""
        vals = [self._t(v) for v in values if math.isfinite(v)]
        if not vals:
            return
        if self._recent:
            center = self.center_scale()[0]
            self._resid.append([abs(v - center) for v in vals])
        self._recent.append(vals)
        self.accepted += 1
        self._cache = None

    def center_scale(self) -> tuple[float, float]:
        """(center, robust sigma) in tracked (possibly log) units."""
        if self._cache is None:
            med = statistics.median(v for step in self._recent for v in step)
            resid = [v for step in self._resid for v in step]
            mad = statistics.median(resid) if resid else 0.0
            floor = self.rel_floor if self.log else self.rel_floor * abs(med)
            self._cache = (med, max(_MAD_TO_SIGMA * mad, floor, 1e-12))
        return self._cache

    def z(self, x: float) -> float:
        """Robust z-score of ``x`` (positive above the center); 0 before warm-up."""
        if not self.ready:
            return 0.0
        med, sigma = self.center_scale()
        return (self._t(x) - med) / sigma

    def state_dict(self) -> dict[str, Any]:
        return {"recent": [list(s) for s in self._recent], "resid": [list(s) for s in self._resid],
                "accepted": self.accepted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._recent = collections.deque((list(s) for s in state["recent"]), maxlen=self.center_steps)
        self._resid = collections.deque((list(s) for s in state["resid"]), maxlen=self.window)
        self.accepted = int(state["accepted"])
        self._cache = None
