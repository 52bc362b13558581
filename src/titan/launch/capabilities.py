"""Loud when something is off: which of Titan's capabilities are live in this run, and why not.

A script gets hang detection only if its ranks write progress beacons, the step guard only
if it calls ``StepGuard.step``, checkpoints only with a ``Checkpointer`` — and nothing used to
say when one was missing (a run ended with "0 hangs handled" and hang detection silently
off). :class:`CapabilityWatch` runs beside the workers of ``titan run``; once every local rank
reported ``report_after_steps`` steps (or ``report_after_s`` after launch, or when the job
ends first) it judges each capability from the run directory alone — the ranks' events and
this node's beacons — and reports once: a ``launcher.capabilities`` event and a callback
(the CLI prints one line per capability). :func:`assess` is the judgement, usable on any
run directory.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Iterable

from titan.events import Event, EventTail, RunDir

__all__ = ["Capability", "CapabilityWatch", "assess", "rank_ranges"]

log = logging.getLogger(__name__)

#: The phases the step guard and the checkpointer mark (what a wired loop shows).
WIRED_PHASES = ("data", "forward", "backward", "comm", "optimizer", "ckpt_step", "snapshot", "checkpoint")


@dataclasses.dataclass(frozen=True)
class Capability:
    """One line of the report: ``name``, live or not, and why. ``judged`` is False when the
    run gave no evidence either way (the workers ended before their first step): then
    ``live`` is False but the line is not an "off"."""

    name: str
    live: bool
    why: str
    judged: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"live": self.live, "why": self.why, **({} if self.judged else {"judged": False})}


def rank_ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0–2, 5"``."""
    rs = sorted(set(ranks))
    out: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}–{rs[j]}")
        i = j + 1
    return ", ".join(out)


def assess(events: Iterable[Event], beacons: Iterable[Any], *, ranks: Iterable[int], watchdog_on: bool = True,
           agent_on: bool | None = None, ended: bool = False) -> list[Capability]:
    """Judge each capability from ``events`` (the workers') and ``beacons`` (this node's
    snapshots, ``titan.beacon.scan_beacons``) for the ranks ``ranks`` expected here.
    ``ended``: the job is over — if no rank reached a step, whether the loop marks steps is
    unknown (a run stopped at its restore said "hang detection OFF, call StepGuard.step" to a
    script that does), so those lines are *not judged* instead of off."""
    want = sorted(set(ranks))
    evs = list(events)
    started = {e.rank: e for e in evs if e.kind == "worker.started" and e.rank is not None}
    steps: dict[int, int] = {}
    for e in evs:
        if e.kind == "step" and e.rank is not None and e.step is not None:
            steps[e.rank] = max(steps.get(e.rank, 0), e.step)
    guard = {e.rank: e for e in evs if e.kind == "guard.armed"}
    ckpt = [e for e in evs if e.kind == "ckpt.armed"]
    out: list[Capability] = []
    who = rank_ranges(want)
    no_ctx = [r for r in want if r not in started]
    ctx_hint = "create titan.worker.WorkerContext.from_env() in the script (docs/integrate.md)"

    # hang detection: a beacon per rank, moving with the steps, with the loop's phases
    bcn = {b.rank: b for b in beacons if b.rank in want}
    no_step = ended and not steps and all(b.step == 0 and b.step_count == 0 for b in bcn.values())
    unjudged = "not judged — the workers ended before their first step"
    if not watchdog_on:
        out.append(Capability("hang detection", False, "off by setting (watchdog.enabled = false)"))
    elif not bcn:
        out.append(Capability("hang detection", False, f"off — no beacons from ranks {who}; {ctx_hint}"))
    else:
        missing = [r for r in want if r not in bcn]
        # A rank whose beacon is back in setup after a restart stepped before: its step events say so.
        stepping = [r for r, b in bcn.items() if b.step > 0 or b.step_count > 0 or steps.get(r, 0) > 0]
        names = {n for b in bcn.values() for n in b.names if n}
        phases = [p for p in WIRED_PHASES if p in names]
        restarting = not phases and all(b.step == 0 and b.step_count == 0 for b in bcn.values())
        phase_text = (", ".join(phases) if phases else "not seen yet: the ranks are starting again after a restart, "
                      "their steps before it were reported" if restarting else "none marked (only step progress)")
        if missing:
            out.append(Capability("hang detection", False, f"partial — no beacons from ranks {rank_ranges(missing)}"))
        elif no_step:
            out.append(Capability("hang detection", False, f"{unjudged} (beacons from ranks {who} are there)",
                                  judged=False))
        elif len(stepping) < len(bcn):
            out.append(Capability("hang detection", False,
                                  f"partial — beacons from ranks {who} show no step (only the "
                                  f"{'/'.join(sorted(names)) or 'setup'} phase); call StepGuard.step each step, or "
                                  f"titan.beacon's step_begin/step_end"))
        else:
            out.append(Capability("hang detection", True, f"on — beacons from ranks {who}, phases {phase_text}"))
    # the step guard
    if guard:
        modes = sorted({str(e.data.get("mode")) for e in guard.values()})
        on = [r for r, e in guard.items() if e.data.get("enabled", True)]
        out.append(Capability("step guard", bool(on), (f"on — {', '.join(modes)}" if on else
                                                      "off by setting (guard.enabled = false)")))
    else:
        out.append(Capability("step guard", False, "off — no StepGuard: NaN/Inf and spikes are not caught before "
                              "the all-reduce; use titan.guard.StepGuard(model, optimizer, ctx=…).step(loss)"))
    # checkpoints
    if ckpt:
        every = ckpt[0].data.get("every_steps")
        out.append(Capability("checkpoints", bool(every), f"on — every {every} steps, restored on restart" if every
                              else "off — checkpoint.every_steps = 0 (only on SIGTERM)"))
    else:
        out.append(Capability("checkpoints", False, "off — no titan.checkpoint.Checkpointer: a restart begins at "
                              "step 0 unless the script restores itself"))
    # the fault boundary: exit codes 10 (comm) / 11 (CUDA)
    bounded = [r for r, e in started.items() if e.data.get("fault_boundary") or e.data.get("wired")]
    if not started:
        out.append(Capability("fault classification", False, f"off — no worker context on ranks {who}; {ctx_hint}"))
    elif len(bounded) < len(started):
        out.append(Capability("fault classification", False, "off on ranks "
                              f"{rank_ranges(set(started) - set(bounded))} — the context was not wired "
                              "(WorkerContext.from_env() under titan run, or ctx.wire())"))
    else:
        out.append(Capability("fault classification", True, "on — exceptions become worker.fault and exit "
                              "codes 10 (communication) / 11 (CUDA)"))
    # step events
    if steps:
        out.append(Capability("step events", True, f"on — ranks {rank_ranges(steps)} (last step {max(steps.values())})"))
    elif no_step and started:
        out.append(Capability("step events", False, unjudged, judged=False))
    else:
        out.append(Capability("step events", False, "off — no `step` events: StepGuard writes one per step "
                              "(or ctx.events.emit('step', step=…))" + (f"; ranks {rank_ranges(no_ctx)} have no "
                                                                          "worker context" if no_ctx else "")))
    out.append(Capability("restart policy", True, "on — titan run backs off and gives up (exit 3) from the events"))
    if agent_on is not None:
        out.append(Capability("node agent", agent_on, "on" if agent_on else "off (--no-agent or it did not start)"))
    return out


class CapabilityWatch:
    """Reports once which capabilities are live (see the module doc); a daemon thread.

    ``emit(kind, msg, level=..., data=...)``: the launcher's recorder. ``on_report``: gets the
    capabilities (the CLI prints them). Cost: an event-tail poll and a beacon scan every
    ``poll_s`` until the report.
    """

    def __init__(self, rd: RunDir, node: str, *, ranks: Iterable[int] | None, watchdog_on: bool,
                 beacon_dir: Any, emit: Callable[..., None], on_report: Callable[[list[Capability]], None] | None = None,
                 report_after_steps: int = 3, report_after_s: float = 60.0, poll_s: float = 0.5,
                 agent_on: Callable[[], bool | None] = lambda: None) -> None:
        self.rd, self.node, self.ranks = rd, node, list(ranks) if ranks is not None else None
        self.watchdog_on, self.beacon_dir, self.emit, self.on_report = watchdog_on, beacon_dir, emit, on_report
        self.after_steps, self.after_s, self.poll_s, self.agent_on = report_after_steps, report_after_s, poll_s, agent_on
        self._tail = EventTail(rd)
        self._events: list[Event] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()
        self.report: list[Capability] | None = None
        self._lock = threading.Lock()

    def start(self) -> "CapabilityWatch":
        self._tail.poll()  # an earlier launch of this run directory is not this one
        self._thread = threading.Thread(target=self._loop, name="titan-capabilities", daemon=True)
        self._thread.start()
        return self

    def _mine(self, evs: list[Event]) -> list[Event]:
        return [e for e in evs if e.rank is not None and (e.node in (None, self.node))]

    def _expected(self) -> list[int]:
        if self.ranks is not None:
            return self.ranks
        return sorted({e.rank for e in self._events if e.rank is not None}) or [0]

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._events += self._mine(self._tail.poll())
            steps: dict[int, int] = {}
            for e in self._events:
                if e.kind == "step" and e.rank is not None:
                    steps[e.rank] = steps.get(e.rank, 0) + 1
            want = self._expected()
            ready = all(steps.get(r, 0) >= self.after_steps for r in want)
            if ready or time.monotonic() - self._t0 >= self.after_s:
                self._report("steps" if ready else "time")
                return

    def _report(self, why: str) -> None:
        with self._lock:
            if self.report is not None:
                return
            from titan.beacon import scan_beacons

            snaps = [b for b in scan_beacons(self.beacon_dir) if b.node == self.node]
            caps = assess(self._events, snaps, ranks=self._expected(), watchdog_on=self.watchdog_on,
                          agent_on=self.agent_on(), ended=why == "end of the job")
            self.report = caps
        off = [c.name for c in caps if not c.live and c.judged]
        unjudged = [c.name for c in caps if not c.judged]
        self.emit("launcher.capabilities", "capabilities: " + "; ".join(
                      f"{c.name} {'on' if c.live else 'OFF' if c.judged else 'not judged'}" for c in caps),
                  level="warning" if off else "info",
                  data={"capabilities": {c.name: c.to_dict() for c in caps}, "off": off, "after": why,
                        **({"not_judged": unjudged} if unjudged else {})})
        if self.on_report is not None:
            try:
                self.on_report(caps)
            except Exception as e:  # noqa: BLE001 - a printing problem must not end the launch
                log.warning("capability report callback failed: %s", e)

    def stop(self) -> None:
        """Stop watching; report now if the job ended before the report was due."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.report is None:
            self._events += self._mine(self._tail.poll())
            self._report("end of the job")
