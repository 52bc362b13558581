"""Settings of ``titan triage`` (see docs/triage.md)."""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_section, require

__all__ = ["TriageConfig", "MAX_JOBS"]

#: More scanner processes than this only add start-up cost.
MAX_JOBS = 64


@register_section("triage")
@dataclasses.dataclass(frozen=True, kw_only=True)
class TriageConfig:
    """``window_s``: ± seconds around the failure; ``skew_s``: clock skew tolerated between
    nodes' raw logs; ``rules_file``: an extra rules TOML (besides ``--rules``); ``jobs``:
    scanner processes for large inputs (0: up to 4)."""

    window_s: float = 30.0
    skew_s: float = 2.0
    rules_file: str = ""
    jobs: int = dataclasses.field(default=0, metadata={"range": (0, MAX_JOBS)})

    def __post_init__(self) -> None:
        require(self.window_s > 0, "triage.window_s must be > 0", "use e.g. 30")
        require(self.skew_s >= 0, "triage.skew_s must be >= 0", "use e.g. 2")
