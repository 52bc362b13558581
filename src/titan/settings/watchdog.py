"""Settings of the hang watchdog, straggler detection, restart policy and node ledger."""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_check, register_section, require

__all__ = ["WatchdogConfig", "AUTO_FRACTION"]

#: Unset ``ceiling_s`` / ``checkpoint_budget_s`` become this fraction of ``dist.pg_timeout_s``.
AUTO_FRACTION = 0.4


@register_section("watchdog")
@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchdogConfig:
    """Learned beacon timeouts, hang handling, stragglers, restart backoff, ledger.

    A phase's timeout is ``clamp(factor × p<percentile> of its observed durations,
    floor_s, ceiling_s)`` once ``warmup_samples`` durations were seen (before that:
    ``warmup_timeout_s``, itself capped by the ceiling). ``checkpoint`` and ``init`` phases
    have their own budgets. The ceiling must stay below ``dist.pg_timeout_s`` so that the
    watchdog, not a collective timeout on an innocent rank, reports a hang
    (docs/failure-model.md). ``ceiling_s`` and ``checkpoint_budget_s`` left unset are
    resolved to 40 % of ``dist.pg_timeout_s`` when the settings are built (120 s by default).
    """

    enabled: bool = True
    poll_interval_s: float = dataclasses.field(default=0.1, metadata={"range": (0.01, 60)})
    floor_s: float = 4.0
    factor: float = 3.0
    percentile: float = 99.0
    warmup_samples: int = 20
    window: int = 500
    warmup_timeout_s: float = 60.0
    #: Time outside any marked phase (``idle``, after the first step) is never declared hung
    #: sooner than this: an unmarked evaluation or save must not kill the job. Mark long
    #: work with ``titan.beacon.phase()`` to get its own learned, tight timeout.
    idle_timeout_s: float = 30.0
    ceiling_s: float | None = None
    checkpoint_budget_s: float | None = None
    init_budget_s: float = 240.0
    dump_wait_s: float = 1.0
    agree_wait_s: float = 1.0
    #: Start collecting a stalled rank's evidence (stacks, flight recorder, py-spy) this long
    #: before its timeout (at the earliest half way), so nothing is awaited after the verdict;
    #: 0 = at the verdict.
    evidence_lead_s: float = 1.5
    py_spy: bool = True
    #: How long py-spy may still run after the verdict before the workers are killed (delays
    #: RTO only); also the most a native py-spy's pause of a suspect is not counted as stall.
    py_spy_wait_s: float = 2.0
    beacon_dir: str = ""
    # stragglers
    straggler_window: int = 20
    straggler_margin: float = 0.3
    straggler_mad_k: float = 3.0
    #: a rank is slow only when also this many seconds per step above its peers' median
    #: (scheduler noise on a shared host makes a millisecond step 30 % slower)
    straggler_min_excess_s: float = 0.002
    straggler_persist: int = 2
    straggler_strike_after: int = 3
    # restart policy (decided by `titan run` from the run directory's events: titan.launch.restarts)
    restart_backoff_s: float = 1.0
    restart_backoff_max_s: float = 30.0
    #: Give up when this many restarts in a row brought no new step and no new checkpoint.
    giveup_restarts: int = 3
    #: Give up when this many attempts in a row failed with the same root cause at the same
    #: step (a deterministic failure); one more when only the exit code is known.
    giveup_same_failure: int = 2
    #: Scripts that report no steps: an attempt that ran this long counts as progress.
    giveup_min_uptime_s: float = 60.0
    #: A restart storm: this many restarts within ``storm_window_s``.
    storm_restarts: int = 5
    storm_window_s: float = 60.0
    # node ledger
    ledger_path: str = ""
    strike_limit: int = 3
    strike_window_s: float = 86400.0
    #: Count faults injected on purpose (``inject.*`` events: drills, tests) as strikes too.
    strike_injected: bool = False

    def __post_init__(self) -> None:
        require(self.poll_interval_s > 0, "poll_interval_s must be > 0", "use e.g. 0.1")
        require(self.floor_s > 0 and (self.ceiling_s is None or self.floor_s <= self.ceiling_s),
                "need 0 < floor_s <= ceiling_s", "e.g. floor_s=4, ceiling_s=120")
        require(self.factor >= 1, "factor must be >= 1", "use e.g. 3")
        require(50 <= self.percentile <= 100, "percentile must be within [50, 100]", "use e.g. 99")
        require(self.warmup_samples >= 1 and self.window >= self.warmup_samples,
                "need 1 <= warmup_samples <= window", "e.g. 20 and 500")
        require(self.idle_timeout_s > 0, "idle_timeout_s must be > 0", "use e.g. 30")
        require(self.warmup_timeout_s > 0 and self.init_budget_s > 0 and (self.checkpoint_budget_s or 1) > 0,
                "budgets must be > 0", "use seconds > 0")
        require(self.dump_wait_s >= 0 and self.agree_wait_s >= 0 and self.py_spy_wait_s >= 0
                and self.evidence_lead_s >= 0, "waits must be >= 0", "e.g. 1")
        require(self.straggler_window >= 5, "straggler_window must be >= 5 steps", "use e.g. 20")
        require(self.straggler_margin > 0, "straggler_margin must be > 0", "use e.g. 0.3 (30 % slower)")
        require(self.straggler_min_excess_s >= 0, "straggler_min_excess_s must be >= 0",
                "use e.g. 0.002 (2 ms per step)")
        require(self.straggler_persist >= 1 and self.straggler_strike_after >= 1,
                "straggler_persist and straggler_strike_after must be >= 1", "e.g. 2 and 3")
        require(self.restart_backoff_s >= 0 and self.restart_backoff_max_s >= self.restart_backoff_s,
                "need 0 <= restart_backoff_s <= restart_backoff_max_s", "e.g. 1 and 30")
        require(self.giveup_restarts >= 1, "giveup_restarts must be >= 1", "use e.g. 3")
        require(self.giveup_same_failure >= 2, "giveup_same_failure must be >= 2",
                "a failure is deterministic only once a retry reproduced it; use e.g. 2")
        require(self.giveup_min_uptime_s > 0, "giveup_min_uptime_s must be > 0", "use e.g. 60")
        require(self.storm_restarts >= 2 and self.storm_window_s > 0,
                "need storm_restarts >= 2 and storm_window_s > 0", "e.g. 5 restarts within 60 s")
        require(self.strike_limit >= 1 and self.strike_window_s > 0, "strike_limit >= 1 and strike_window_s > 0",
                "e.g. 3 strikes per 86400 s")


@register_check
def _watchdog_below_pg(s) -> None:  # noqa: ANN001 - Settings (import cycle)
    # The learned beacon timeout (and every phase budget) must fire before a collective
    # times out on the innocent ranks, which itself must fire before the rendezvous stops
    # waiting for the restarted group: beacon < process group < rendezvous join.
    if not (hasattr(s, "watchdog") and hasattr(s, "dist")):
        return
    w, pg = s.watchdog, s.dist.pg_timeout_s
    for name in ("ceiling_s", "checkpoint_budget_s"):
        if getattr(w, name) is None:  # derived from the process-group timeout (frozen: set once, here)
            object.__setattr__(w, name, round(AUTO_FRACTION * pg, 3))
    hb = ""
    if hasattr(s, "run"):
        hb = (f" (rendezvous join {s.run.rdzv_join_timeout_s:g} s, heartbeat "
              f"{s.run.rdzv_keep_alive_interval_s:g}×{s.run.rdzv_keep_alive_max_attempt} = {s.run.rdzv_heartbeat_s:g} s)")
    for name, value in (("ceiling_s", w.ceiling_s), ("checkpoint_budget_s", w.checkpoint_budget_s)):
        require(value < pg,
                f"timeout hierarchy violated: watchdog.{name} ({value:g}) must be < dist.pg_timeout_s ({pg:g}){hb}",
                f"lower watchdog.{name} or raise dist.pg_timeout_s (docs/failure-model.md)")
    # A value set on purpose that the ceiling would silently cut is refused (defaults adapt:
    # their effective value is min(value, ceiling), docs/failure-model.md). The launcher's
    # JSON hand-over to the workers was validated by the launcher already.
    for name in ("warmup_timeout_s", "idle_timeout_s"):
        value, src = getattr(w, name), s.sources.get(f"watchdog.{name}")
        require(src in (None, "launcher") or value < pg,
                f"timeout hierarchy violated: watchdog.{name} ({value:g}) must be < dist.pg_timeout_s ({pg:g}){hb}",
                f"lower watchdog.{name} or raise dist.pg_timeout_s (docs/failure-model.md)")
    require(w.floor_s <= w.ceiling_s, f"watchdog.floor_s ({w.floor_s:g}) must be <= watchdog.ceiling_s ({w.ceiling_s:g})",
            "lower watchdog.floor_s or raise dist.pg_timeout_s")
