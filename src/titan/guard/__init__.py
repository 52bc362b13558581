"""The step guard: catch non-finite and spiking steps before they spread, name the rank
that produced them, skip or replay identically on every rank.

Wiring (``docs/guard.md``)::

    from titan.guard import StepGuard
    guard = StepGuard(model, optimizer, scheduler=sched, scaler=scaler, max_norm=1.0, ctx=ctx)
    res = guard.step(fwd_bwd, samples=indices)   # replaces clip / optimizer.step / scheduler.step

Modules: ``core`` (StepGuard), ``checks``/``ddp``/``fsdp`` (where gradients are read),
``decision`` (the one exchange and the verdict), ``stats`` (rolling median/MAD),
``actions`` (skip, apply, strike, escalate), ``escalation`` (the ladder), ``rng``
(replay RNG capture). Policy: ``titan.settings.guard.GuardConfig`` (section ``guard``).
"""

from __future__ import annotations

from titan.guard.core import StepGuard, StepResult
from titan.guard.decision import Observation, Verdict, judge
from titan.guard.escalation import Escalator
from titan.guard.stats import RobustWindow
from titan.settings.guard import GuardConfig

__all__ = ["Escalator", "GuardConfig", "Observation", "RobustWindow", "StepGuard", "StepResult", "Verdict", "judge"]
