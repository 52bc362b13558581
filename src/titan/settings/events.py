"""Settings of the event writer."""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_section, require

__all__ = ["EventsConfig"]


@register_section("events")
@dataclasses.dataclass(frozen=True, kw_only=True)
class EventsConfig:
    """``step_every`` samples per-step events; flagged steps are always kept."""

    step_every: int = 1
    slow_write_s: float = 0.5
    queue_on_slow: bool = True
    queue_size: int = 10_000

    def __post_init__(self) -> None:
        require(self.step_every >= 1, "step_every must be >= 1", "use 1 to keep every step event")
        require(self.slow_write_s > 0, "slow_write_s must be > 0", "use e.g. 0.5")
        require(self.queue_size >= 1, "queue_size must be >= 1", "use e.g. 10000")
