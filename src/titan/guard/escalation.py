"""Escalation: what the guard does when faults keep coming.

``persistent_k`` persistent events within ``persistent_window`` steps — or
``max_consecutive_skips`` skipped steps in a row — take the next rung of the policy's
ladder (default ``rollback`` → ``lower_lr`` → ``abort``):

* ``rollback``: call the rollback hook (``Checkpointer.rollback`` on the in-memory
  ``/dev/shm`` snapshot, wired by :meth:`StepGuard.use_checkpointer`); without a hook the
  rung is reported as unavailable and the next one is taken at once;
* ``lower_lr``: multiply every param group's LR (and a scheduler's ``base_lrs``) by
  ``lr_factor``;
* ``abort``: raise ``TitanAbort(..., ExitCode.GAVE_UP)``. A worker that exits with
  GAVE_UP makes ``titan run`` end the job instead of letting torchrun restart it.

The ladder is decided from counters every rank keeps identically, so every rank takes the
same rung at the same step.
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["Escalator"]


class Escalator:
    """Counts persistent events and consecutive skips; says when to climb the ladder."""

    def __init__(self, *, k: int, window: int, max_consecutive_skips: int, ladder: tuple[str, ...]) -> None:
        self.k = k
        self.window = window
        self.max_consecutive_skips = max_consecutive_skips
        self.ladder = ladder
        self.level = 0  # rungs taken so far
        self.consecutive_skips = 0
        self._persistent: collections.deque[int] = collections.deque()

    def record_step(self, *, skipped: bool) -> None:
        self.consecutive_skips = self.consecutive_skips + 1 if skipped else 0

    def record_persistent(self, step: int) -> None:
        self._persistent.append(step)

    def due(self, step: int) -> str | None:
        """The reason to escalate at ``step`` (or None); pure bookkeeping."""
        while self._persistent and self._persistent[0] <= step - self.window:
            self._persistent.popleft()
        if len(self._persistent) >= self.k:
            return f"{len(self._persistent)} persistent faults within {self.window} steps"
        if self.consecutive_skips >= self.max_consecutive_skips:
            return f"{self.consecutive_skips} consecutive skipped steps"
        return None

    def next_rung(self) -> str:
        """Take the next rung (the last one, normally ``abort``, repeats) and reset counters."""
        rung = self.ladder[min(self.level, len(self.ladder) - 1)] if self.ladder else "abort"
        self.level += 1
        self._persistent.clear()
        self.consecutive_skips = 0
        return rung

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "consecutive_skips": self.consecutive_skips,
                "persistent": list(self._persistent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level = int(state["level"])
        self.consecutive_skips = int(state["consecutive_skips"])
        self._persistent = collections.deque(int(s) for s in state["persistent"])
