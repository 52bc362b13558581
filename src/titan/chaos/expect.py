"""The documented expected outcome of every fault kind: which detector must see it, how the
job recovers, and what the final model must be (docs/chaos.md, "Expected outcome").

Every kind has a named detector — an event a Titan component writes while the job runs:

| kind | detector (event) | component |
|---|---|---|
| ``nan_grad``, ``inf_loss``, ``poison_sample`` | ``guard.nonfinite`` | guard |
| ``spike`` | ``guard.spike`` | guard |
| ``bitflip`` (param / optimizer state) | ``sdc.mismatch`` (``guard.*`` when the flip made a value non-finite) | sdc |
| ``gemm_perturb`` | ``sdc.canary`` / ``sdc.mismatch`` | sdc |
| ``kill``, ``exception`` | ``worker.failed`` / ``worker.fault`` | launcher / worker |
| ``kill`` with ``SIGSTOP`` (``Plan.stop``) | ``hang.detected`` (rank + phase) | watchdog |
| ``node_loss`` | ``launcher.node_lost`` (a survivor sees a new incarnation under the node's id) | launcher |
| ``hang``, ``net partition_long`` | ``hang.detected`` (+ ``agent.alert net_link_down`` first for a link) | watchdog |
| ``slow`` | ``straggler.detected`` | watchdog |
| ``preempt`` | ``ckpt.preempted`` | checkpoint |
| ``disk enospc`` / ``corrupt`` / ``truncate`` | ``ckpt.failed`` / ``ckpt.corrupt`` | checkpoint |
| ``disk slow_fsync`` | ``ckpt.slow`` (save time vs its learned baseline, node + path) | checkpoint |
| ``stress`` | ``agent.alert host_pressure`` (step time + PSI / run queue / memory, node) | agent |
| ``net loss`` | ``agent.alert net_link_loss`` / ``net_probe_loss`` (probe loss, TCP retransmits, the link) | agent |
| ``net bandwidth`` / ``delay`` | ``agent.alert net_link_slow`` (probe RTT vs its baseline, the link) | agent |
| ``net partition`` | ``agent.alert net_link_down`` (probes lost, the link; ``net_link_loss`` for a cut < 2 s) | agent |
"""

from __future__ import annotations

import dataclasses

from titan.chaos.plan import FaultSpec

__all__ = ["Detector", "Expect", "EXPECT", "expect_for", "inject_kind"]


@dataclasses.dataclass(frozen=True)
class Detector:
    """An event that counts as detection: its kind, the component, and for ``agent.alert``
    the rule that must have fired."""

    event: str
    component: str
    rule: str | None = None

    @property
    def name(self) -> str:
        return f"{self.event} {self.rule}" if self.rule else self.event


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a fault kind should lead to."""

    outcome: str  # detected | undetected
    detectors: tuple[Detector, ...]
    recovery: str  # skip | restart | resubmit | fallback | continue | rollback | none
    final_equal: bool = True
    text: str = ""


def _d(event: str, component: str, rule: str | None = None) -> Detector:
    return Detector(event, component, rule)


_GUARD_NF = (_d("guard.nonfinite", "guard"),)
_SDC = (_d("sdc.mismatch", "sdc"), _d("guard.nonfinite", "guard"), _d("guard.spike", "guard"))
EXPECT: dict[str, Expect] = {
    "nan_grad": Expect("detected", _GUARD_NF, "skip", text="guard: non-finite gradient, replay clean -> step skipped on every rank"),
    "inf_loss": Expect("detected", _GUARD_NF, "skip", text="guard: non-finite loss -> step skipped"),
    "spike": Expect("detected", (_d("guard.spike", "guard"),), "skip", text="guard: loss spike (robust z) -> step skipped"),
    "poison_sample": Expect("detected", _GUARD_NF, "skip", text="guard: replay is bad again -> persistent, samples logged, skipped"),
    "bitflip": Expect("detected", _SDC, "rollback",
                      text="sdc: replica fingerprints disagree at the next round -> repaired from a verified snapshot"),
    "gemm_perturb": Expect("detected", (_d("sdc.canary", "sdc"), _d("sdc.mismatch", "sdc")), "rollback",
                           text="sdc: GEMM canary / fingerprints flag the rank"),
    "kill": Expect("detected", (_d("worker.failed", "launcher"),), "restart",
                   text="launcher: worker.failed with the signal -> group restart from the last checkpoint"),
    "node_loss": Expect("detected", (_d("launcher.node_lost", "launcher"),), "restart",
                        text="launcher: the survivors' next round names the replaced node (launcher.node_lost) -> "
                             "group restart; its shards come from the buddy copy"),
    "hang": Expect("detected", (_d("hang.detected", "watchdog"),), "restart",
                   text="watchdog: hang.detected names rank and phase, kills the group -> restart"),
    "slow": Expect("detected", (_d("straggler.detected", "watchdog"),), "continue",
                   text="watchdog: straggler.detected names the rank; training continues"),
    "exception": Expect("detected", (_d("worker.fault", "worker"), _d("worker.failed", "launcher")), "restart",
                        text="worker exits with the fault's class code -> restart"),
    "preempt": Expect("detected", (_d("ckpt.preempted", "checkpoint"),), "resubmit",
                      text="checkpoint saved on SIGTERM, exit 9 -> resubmitted job resumes, nothing lost"),
    "stress": Expect("detected", (_d("agent.alert", "agent", "host_pressure"),), "none",
                     text="agent: host_pressure (steps slower + CPU/memory pressure) names the node; no restart"),
}
#: A rank stopped by SIGSTOP: alive to the launcher, silent to its peers — a hang.
_STOPPED = Expect("detected", (_d("hang.detected", "watchdog"),), "restart",
                  text="watchdog: hang.detected names the stopped rank and its phase, kills the group -> restart")
_DISK = {
    "enospc": Expect("detected", (_d("ckpt.failed", "checkpoint"),), "continue",
                     text="checkpoint: save fails (ckpt.failed), training continues, a later save succeeds"),
    "slow_fsync": Expect("detected", (_d("ckpt.slow", "checkpoint"),), "none",
                         text="checkpoint: ckpt.slow (save time vs its learned baseline) names node and path; "
                              "nothing lost"),
    "corrupt": Expect("detected", (_d("ckpt.corrupt", "checkpoint"),), "fallback",
                      text="checkpoint: checksum mismatch on restore -> previous checkpoint, more steps recomputed"),
    "truncate": Expect("detected", (_d("ckpt.corrupt", "checkpoint"),), "fallback",
                       text="checkpoint: short file on restore -> previous checkpoint"),
}
_NET = {
    "loss": Expect("detected", (_d("agent.alert", "agent", "net_link_loss"), _d("agent.alert", "agent", "net_probe_loss")),
                   "none", text="agent: net_link_loss (probe loss / TCP retransmits in seconds) or net_probe_loss "
                                "(> 0.1 % of the last 300 probes) names the link; no restart"),
    # A token-bucket squeeze shows as queueing (RTT) or, once its queue overflows, as drops:
    # CI 2026-12-05, a 3 s squeeze to 4 mbit gave TCP retransmits 0.78 % and probe loss on the
    # link with the RTT unchanged. Either names the link.
    "bandwidth": Expect("detected", (_d("agent.alert", "agent", "net_link_slow"),
                                     _d("agent.alert", "agent", "net_link_loss")), "none",
                        text="agent: net_link_slow (probe RTT above its baseline) or, when the shaper's queue "
                             "overflows, net_link_loss names the link; no restart"),
    "delay": Expect("detected", (_d("agent.alert", "agent", "net_link_slow"),), "none",
                    text="agent: net_link_slow (probe RTT above its baseline) names the link; no restart"),
    "partition": Expect("detected", (_d("agent.alert", "agent", "net_link_down"),
                                     _d("agent.alert", "agent", "net_link_loss")), "none",
                        text="agent: net_link_down (or, for a cut shorter than its 2 s window, net_link_loss) "
                             "names the link; collectives resume when it heals, no restart"),
    "partition_long": Expect("detected", (_d("agent.alert", "agent", "net_link_down"), _d("hang.detected", "watchdog")),
                             "restart", text="agent: net_link_down names the link; watchdog: hang in phase comm; "
                                             "restart once healed"),
}


def expect_for(f: FaultSpec) -> Expect:
    """The documented expectation of fault ``f`` (disk/net depend on ``what``)."""
    if f.kind == "disk":
        return _DISK.get(str(f.get("what")), _DISK["enospc"])
    if f.kind == "net":
        return _NET.get(str(f.get("what")), _NET["loss"])
    if f.kind == "kill" and str(f.get("signal")) == "SIGSTOP":
        return _STOPPED
    if f.kind == "bitflip" and f.get("target") == "grad":
        return Expect("undetected", (), "none", final_equal=False,
                      text="a gradient flip is all-reduced identically on every rank: invisible to replica checks")
    return EXPECT[f.kind]


def inject_kind(f: FaultSpec) -> str:
    """The ``inject.*`` event kind a fault's injection writes."""
    return {"nan_grad": "inject.grad", "inf_loss": "inject.loss", "spike": "inject.loss"}.get(f.kind, f"inject.{f.kind}")
