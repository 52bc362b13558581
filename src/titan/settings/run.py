"""Settings of ``titan run`` (the launcher) and of torchrun's rendezvous."""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_section, require
from titan.settings.env import TITAN_NODE_ID

__all__ = ["RunConfig"]


@register_section("run")
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Where runs go and how torchrun's elastic agent is configured.

    The rendezvous defaults are tuned (measured: re-rendezvous after a node loss 6.7 s
    instead of ~40 s with torchrun's defaults; see docs/failure-model.md).
    """

    runs_dir: str = "runs"
    node_id: str | None = dataclasses.field(default=None, metadata={"env": TITAN_NODE_ID})
    max_restarts: int = 3
    #: Polling intervals are bounded below: a near-zero one spins a core.
    monitor_interval_s: float = dataclasses.field(default=0.1, metadata={"range": (0.01, 60)})
    rdzv_last_call_timeout_s: float = 3.0
    rdzv_keep_alive_interval_s: float = 1.0
    rdzv_keep_alive_max_attempt: int = 3
    rdzv_join_timeout_s: float = 600.0
    #: Restarted workers must not reuse the dead workers' gloo addresses from the store
    #: shared with the agent (measured: 3 of 13 default runs failed; 8/8 clean with this).
    disable_shared_rdzv_store: bool = True
    start_agent: bool = True
    #: When every worker that exited so far is a peer's communication fault (exit 10: it lost
    #: the rank that failed), the launcher waits up to this long for the rest of the group to
    #: exit by itself before torchelastic stops it: the rank that left first is then recorded
    #: with its own exit code as the root cause, not as stopped (its gloo teardown takes 1-2 s
    #: here after its sockets closed; docs/failure-model.md). 0 turns the wait off.
    consequence_grace_s: float = dataclasses.field(default=3.0, metadata={"range": (0, 600)})

    def __post_init__(self) -> None:
        require(self.max_restarts >= 0, "max_restarts must be >= 0", "set run.max_restarts to 0 or more")
        require(self.monitor_interval_s > 0, "monitor_interval_s must be > 0", "use e.g. 0.1")
        require(self.rdzv_last_call_timeout_s > 0, "rdzv_last_call_timeout_s must be > 0", "use e.g. 3")
        require(self.rdzv_keep_alive_interval_s > 0 and self.rdzv_keep_alive_max_attempt >= 1,
                "rendezvous keep-alive must be positive", "use keep_alive_interval_s=1, max_attempt=3")
        require(self.rdzv_join_timeout_s > 0, "rdzv_join_timeout_s must be > 0", "use e.g. 600")
        # A dead node is dropped from the rendezvous after the heartbeat; if that took longer
        # than joining may take, the re-rendezvous after a node loss would always time out.
        require(self.rdzv_heartbeat_s < self.rdzv_join_timeout_s,
                f"timeout hierarchy violated: the rendezvous heartbeat rdzv_keep_alive_interval_s × "
                f"rdzv_keep_alive_max_attempt ({self.rdzv_keep_alive_interval_s:g} × {self.rdzv_keep_alive_max_attempt} = "
                f"{self.rdzv_heartbeat_s:g} s) must be < rdzv_join_timeout_s ({self.rdzv_join_timeout_s:g} s)",
                "lower run.rdzv_keep_alive_interval_s (default 1) or run.rdzv_keep_alive_max_attempt (default 3); "
                "see docs/failure-model.md")
        if self.node_id is not None:
            from titan.inputs import check_id  # ids name files: refuse '/', escapes, …

            check_id(self.node_id, "node id (run.node_id)")

    @property
    def rdzv_heartbeat_s(self) -> float:
        """How long before a silent node is declared dead by the rendezvous."""
        return self.rdzv_keep_alive_interval_s * self.rdzv_keep_alive_max_attempt
