"""Settings of distributed initialisation and of the process group."""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_check, register_section, require

__all__ = ["DistConfig"]


@register_section("dist")
@dataclasses.dataclass(frozen=True, kw_only=True)
class DistConfig:
    """Init retries (exponential backoff with jitter) and the two timeouts.

    ``init_timeout_s`` bounds one attempt to reach the store and form the group (the
    spec's 10 minutes); ``pg_timeout_s`` bounds one collective.
    """

    backend: str = "auto"
    init_attempts: int = 3
    init_timeout_s: float = 600.0
    init_backoff_s: float = 1.0
    init_backoff_max_s: float = 30.0
    init_jitter: float = 0.25
    pg_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        require(self.backend in ("auto", "gloo", "nccl"), f"unknown backend {self.backend!r}",
                "use auto, gloo or nccl")
        require(self.init_attempts >= 1, "init_attempts must be >= 1", "use e.g. 3")
        require(self.init_timeout_s > 0 and self.pg_timeout_s > 0, "timeouts must be > 0", "use seconds > 0")
        require(self.init_backoff_s >= 0 and self.init_backoff_max_s >= self.init_backoff_s,
                "init_backoff_max_s must be >= init_backoff_s >= 0", "e.g. 1 and 30")
        require(0 <= self.init_jitter <= 1, "init_jitter must be within [0, 1]", "e.g. 0.25")


@register_check
def _pg_below_rendezvous(s) -> None:  # noqa: ANN001 - Settings (import cycle)
    # A collective must time out before the rendezvous gives up on joining, or a hung
    # group would block the re-rendezvous that is meant to replace it.
    if hasattr(s, "run"):
        require(s.dist.pg_timeout_s < s.run.rdzv_join_timeout_s,
                f"timeout hierarchy violated: dist.pg_timeout_s ({s.dist.pg_timeout_s:g}) must be < "
                f"run.rdzv_join_timeout_s ({s.run.rdzv_join_timeout_s:g})",
                "lower dist.pg_timeout_s or raise run.rdzv_join_timeout_s (docs/failure-model.md)")
