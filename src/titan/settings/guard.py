"""Settings of the step guard (``titan.guard``): its policy.

One frozen dataclass; every decision the guard takes is parameterised here, so a test or
a run changes behaviour only through the documented precedence (defaults < TOML <
``TITAN_GUARD_*`` < ``--set guard.x=v``). See ``docs/guard.md``.
"""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_section, require

__all__ = ["GuardConfig", "ESCALATION_ACTIONS"]

ESCALATION_ACTIONS = ("rollback", "lower_lr", "abort")


@register_section("guard")
@dataclasses.dataclass(frozen=True, kw_only=True)
class GuardConfig:
    """Policy of the step guard.

    * non-finite gradients or loss always skip the update on every rank;
    * ``loss_spike`` / ``grad_spike``: a value more than ``spike_z`` robust z-scores
      (median/MAD over the last ``spike_window`` accepted steps; loss per rank, grad norm
      in log space) above the median, after ``spike_warmup`` accepted steps, is a spike;
      the scale is floored at ``spike_rel_floor`` × |median| so a flat series does not
      turn noise into spikes;
    * ``replay``: re-run the step's forward/backward once with the RNG restored to
      classify the fault as transient (clean replay: a strike against the culprit's node)
      or persistent (data/numerics: the batch is skipped, its samples logged);
    * ``transient_action``: after a clean replay, ``skip`` the step or ``apply_replay``
      (use the replay's gradients);
    * escalation: ``persistent_k`` persistent events within ``persistent_window`` steps
      (or ``max_consecutive_skips`` skips in a row) take the next rung of ``escalation``
      (``rollback`` to the in-memory snapshot, ``lower_lr`` by ``lr_factor``, ``abort``
      with exit code GAVE_UP, which ``titan run`` does not restart);
    * ``step_scheduler_on_skip``: whether a skipped step still advances the LR scheduler
      (default no: the schedule counts applied updates).
    """

    enabled: bool = True
    replay: bool = True
    transient_action: str = "skip"
    loss_spike: bool = True
    grad_spike: bool = True
    spike_z: float = 8.0
    spike_window: int = 100
    spike_warmup: int = 50
    spike_rel_floor: float = 0.02
    max_consecutive_skips: int = 10
    persistent_k: int = 3
    persistent_window: int = 200
    escalation: tuple[str, ...] = ESCALATION_ACTIONS
    lr_factor: float = 0.5
    strikes_to_report: int = 3
    step_scheduler_on_skip: bool = False

    def __post_init__(self) -> None:
        require(self.transient_action in ("skip", "apply_replay"),
                f"transient_action must be skip or apply_replay, not {self.transient_action!r}",
                "use guard.transient_action=skip")
        require(self.spike_z > 0, f"spike_z must be > 0 (got {self.spike_z:g})", "use e.g. 8.0")
        require(self.spike_window >= 8, f"spike_window must be >= 8 (got {self.spike_window})",
                "use e.g. 100 steps")
        require(0 <= self.spike_warmup, "spike_warmup must be >= 0", "use e.g. 50 steps")
        require(self.spike_warmup >= 8 or not (self.loss_spike or self.grad_spike),
                f"spike_warmup must be >= 8 when spike detection is on (got {self.spike_warmup})",
                "robust statistics need a few accepted steps; use e.g. 50")
        require(0 <= self.spike_rel_floor < 1, "spike_rel_floor must be within [0, 1)", "use e.g. 0.02")
        require(self.max_consecutive_skips >= 1, "max_consecutive_skips must be >= 1", "use e.g. 10")
        require(self.persistent_k >= 1, "persistent_k must be >= 1", "use e.g. 3")
        require(self.persistent_window >= 1, "persistent_window must be >= 1", "use e.g. 200 steps")
        bad = [a for a in self.escalation if a not in ESCALATION_ACTIONS]
        require(not bad, f"unknown escalation action(s) {', '.join(bad)}",
                f"use a comma-separated list of {', '.join(ESCALATION_ACTIONS)}")
        require(0 < self.lr_factor < 1, f"lr_factor must be within (0, 1) (got {self.lr_factor:g})",
                "use e.g. 0.5")
        require(self.strikes_to_report >= 1, "strikes_to_report must be >= 1", "use e.g. 3")
