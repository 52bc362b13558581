"""The restart decision: ``titan run`` backs off, restarts or gives up — from the events alone.

torchrun restarts a failed worker group at once and keeps going until ``--max-restarts`` is
used up (958 restarts in two minutes for a script that fails at its first step). The
launcher decides instead, before every restart, from what the run directory recorded since
the last one — the same for any script, with or without Titan calls in it:

* **progress** of an attempt: a step higher than any earlier attempt reached (``step``
  events), or a checkpoint newer than any earlier one (``ckpt.saved``). A script that
  reports neither counts an attempt that lived ``watchdog.giveup_min_uptime_s`` as progress.
* **root cause** of an attempt: the first failure that is not a consequence of another —
  a classified ``worker.fault`` (class, error, message), else a ``hang.detected`` (phase),
  else the launcher's ``worker.failed`` (signal or exit code, ``@record`` message). A peer
  that saw the connection close (exit 10) or was stopped by the agent is a consequence.
* **backoff**: ``0`` after an attempt that progressed (recovery time matters), then
  ``restart_backoff_s × 2^(n-2)`` capped at ``restart_backoff_max_s`` for the n-th
  attempt in a row without progress.
* **give up** (exit 3, one-line reason) when ``giveup_restarts`` restarts in a row brought
  no progress, or when ``giveup_same_failure`` attempts in a row failed with the same root
  cause at the same step — a deterministic failure (one attempt more when nothing but an
  exit code is known).
* **restart storm**: ``storm_restarts`` restarts within ``storm_window_s`` is a
  ``launcher.restart_storm`` event (once per storm) and a line in ``titan run``'s summary.

Every decision is a ``launcher.restart_decision`` event with its evidence.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable

from titan.events import Event, EventTail, RunDir

__all__ = ["Attempt", "Decision", "RestartPolicy", "backoff_s", "root_cause", "clear_stale_giveup", "POLICY_BY"]

#: Failure classes that follow from another rank's failure (the connection it used closed).
CONSEQUENCE_CLASSES = frozenset({"peer_closed", "comm_timeout", "comm_backend", "comm_network", "store"})
#: Worker exit codes that say "communication failed" (a consequence when a peer failed first).
_COMM_EXIT = 10
_SIGTERM_EXIT = -15
#: The ``by`` of the abort file the policy writes when it gives up.
POLICY_BY = "titan run (restart policy)"


def backoff_s(no_progress_in_a_row: int, base_s: float, max_s: float) -> float:
    """Seconds to wait before the next attempt: 0 unless the last two or more attempts made
    no progress, then ``base_s × 2^(n-2)`` capped at ``max_s``."""
    if no_progress_in_a_row <= 1:
        return 0.0
    return min(max_s, base_s * 2 ** (no_progress_in_a_row - 2))


def _norm(text: str | None) -> str:
    """A message with addresses, pids and long numbers blanked: equal causes compare equal."""
    if not text:
        return ""
    t = str(text).strip().splitlines()[0][:300] if str(text).strip() else ""
    t = re.sub(r"0x[0-9a-fA-F]+", "0x#", t)
    return re.sub(r"\d{4,}", "#", t)


@dataclasses.dataclass
class Attempt:
    """What one attempt of the worker group did, as far as the events tell."""

    index: int
    t_start: float
    t_end: float | None = None
    max_step: int | None = None
    max_ckpt: int | None = None
    resumed_from: int | None = None
    cause: str | None = None  # the root cause's signature
    cause_text: str | None = None  # the same for people
    cause_step: int | None = None
    strong: bool = False  # the cause carries a class or message, not only an exit code
    progress: bool = False

    @property
    def uptime_s(self) -> float:
        return (self.t_end or time.time()) - self.t_start


@dataclasses.dataclass(frozen=True)
class Decision:
    """Before restart ``attempt``: wait ``backoff_s`` and restart, or give up with ``reason``."""

    attempt: int
    give_up: bool
    backoff_s: float
    reason: str


def root_cause(evs: list[Event], failed_step: int | None) -> tuple[str | None, str | None, int | None, bool]:
    """(signature, text, step, strong) of the first failure in ``evs`` that is not a consequence.

    Order of evidence: a classified fault of the script's own (``worker.fault`` not of a
    communication class), a hang verdict, a worker that died of something other than a
    closed connection, and only then a communication fault (the network itself failed).
    """
    faults = [e for e in evs if e.kind == "worker.fault"]
    own = [e for e in faults if e.data.get("class") not in CONSEQUENCE_CLASSES]
    hangs = [e for e in evs if e.kind == "hang.detected"]
    failed = [e for e in evs if e.kind == "worker.failed"]
    died = [e for e in failed if e.data.get("exit_code") not in (_SIGTERM_EXIT, _COMM_EXIT)]
    if own:
        return _fault_cause(own[0], failed_step)
    if hangs:
        c = hangs[0].data.get("culprit") or {}
        phase = c.get("phase") or hangs[0].phase
        step = c.get("step") if c.get("step") is not None else hangs[0].step
        return f"hang:{phase}", f"hang in phase {phase}", step, True
    if died or not faults:
        if not failed:
            return None, None, failed_step, False
        d = (died or failed)[0].data
        how = f"signal {d['signal']}" if d.get("signal") else f"exit code {d.get('exit_code')}"
        msg = _norm(d.get("error"))
        return (f"exit:{d.get('signal') or d.get('exit_code')}:{msg}", how + (f" ({d.get('error')})" if msg else ""),
                failed_step, bool(msg))
    return _fault_cause(faults[0], failed_step)


def _fault_cause(e: Event, failed_step: int | None) -> tuple[str, str, int | None, bool]:
    d = e.data
    text = f"{d.get('error') or d.get('class')}: {d.get('message') or ''}".strip().rstrip(":")
    return (f"fault:{d.get('class')}:{d.get('error')}:{_norm(d.get('message'))}", text,
            e.step if e.step is not None else failed_step, True)


class RestartPolicy:
    """Decides before each restart (see the module doc). Thread-compatible, not thread-safe:
    the agent calls it from its own loop.

    ``emit(kind, msg, level=..., data=...)`` records events (the launcher's recorder).
    Cost per decision: reading the event bytes written since the previous one.
    """

    def __init__(self, rd: RunDir, cfg: Any, emit: Callable[..., None], *, clock: Callable[[], float] = time.time):
        self.rd, self.cfg, self._emit, self._clock = rd, cfg, emit, clock
        self._tail = EventTail(rd)
        self.attempts: list[Attempt] = [Attempt(0, clock())]
        self.restart_times: list[float] = []
        self.storms: list[dict[str, Any]] = []
        self._storm_open = False
        # An earlier submission of this run directory is history: its best step and checkpoint
        # are what a new attempt must beat; its events are not this launch's attempts.
        old = self._tail.poll()
        steps = [e.step for e in old if e.kind == "step" and e.step is not None]
        saved = [int(e.data.get("step", e.step or 0)) for e in old if e.kind == "ckpt.saved"]
        self._best_step: int | None = max(steps) if steps else None
        self._best_ckpt: int | None = max(saved) if saved else None
        self._reported_steps = bool(steps)

    # -- reading --------------------------------------------------------------------------
    def _close_attempt(self) -> Attempt:
        a = self.attempts[-1]
        a.t_end = self._clock()
        evs = [e for e in self._tail.poll() if e.attempt in (None, a.index) or e.kind.startswith(("launcher.",
                                                                                                   "hang.", "worker.failed"))]
        steps = [e.step for e in evs if e.kind == "step" and e.step is not None]
        saved = [int(e.data.get("step", e.step or 0)) for e in evs if e.kind == "ckpt.saved"]
        loaded = [int(e.data.get("step", e.step or 0)) for e in evs if e.kind == "ckpt.loaded"]
        a.max_step = max(steps) if steps else None
        a.max_ckpt = max(saved) if saved else None
        a.resumed_from = loaded[0] if loaded else None
        self._reported_steps = self._reported_steps or bool(steps)
        new_step = a.max_step is not None and (self._best_step is None or a.max_step > self._best_step)
        new_ckpt = a.max_ckpt is not None and (self._best_ckpt is None or a.max_ckpt > self._best_ckpt)
        if self._reported_steps:
            a.progress = new_step or new_ckpt
        else:  # a script that reports nothing: only its uptime tells
            a.progress = a.uptime_s >= self.cfg.giveup_min_uptime_s
        if new_step:
            self._best_step = a.max_step
        if new_ckpt:
            self._best_ckpt = a.max_ckpt
        a.cause, a.cause_text, a.cause_step, a.strong = root_cause(evs, a.max_step)
        return a

    # -- deciding -------------------------------------------------------------------------
    def before_restart(self, attempt: int) -> Decision:
        """Close the attempt that just failed and decide about ``attempt`` (the next one).

        Emits ``launcher.restart_decision`` (and ``launcher.restart_storm`` when one starts).
        """
        last = self._close_attempt()
        c = self.cfg
        streak = []  # the attempts without progress, ending with the last
        for a in reversed(self.attempts):
            if a.progress:
                break
            streak.append(a)
        in_row = len(streak)
        restarts_in_row = sum(1 for a in streak if a.index >= 1)
        reason = ""
        if restarts_in_row >= c.giveup_restarts:
            best = f"step {self._best_step}" if self._best_step is not None else "no step reported"
            ck = f", checkpoint {self._best_ckpt}" if self._best_ckpt is not None else ""
            reason = (f"no progress: {restarts_in_row} restarts in a row reached no new step and no new "
                      f"checkpoint (best so far: {best}{ck})")
        same = self._same_cause_run()
        need = c.giveup_same_failure + (0 if last.strong else 1)
        if not reason and last.cause is not None and same >= need:
            at = f"at step {last.cause_step}" if last.cause_step is not None else "before any step"
            reason = (f"deterministic failure: {same} attempts in a row failed the same way {at} "
                      f"({last.cause_text})")
        wait = 0.0 if reason else backoff_s(in_row, c.restart_backoff_s, c.restart_backoff_max_s)
        dec = Decision(attempt, bool(reason), wait, reason or (f"restart after {wait:g} s backoff" if wait else
                                                                "restart now"))
        self._emit("launcher.restart_decision", ("giving up: " + reason) if reason else
                   f"attempt {attempt}: {dec.reason}", level="critical" if reason else "info", data={
                       "attempt": attempt, "give_up": dec.give_up, "backoff_s": wait, "reason": dec.reason,
                       "no_progress_in_a_row": in_row, "same_failure_in_a_row": same,
                       "failed_attempt": dataclasses.asdict(last), "best_step": self._best_step,
                       "best_checkpoint": self._best_ckpt})
        if not dec.give_up:
            self._note_restart()
            self.attempts.append(Attempt(attempt, self._clock()))
        return dec

    def _same_cause_run(self) -> int:
        """How many attempts in a row, ending with the last, share its cause and step."""
        last = self.attempts[-1]
        n = 0
        for a in reversed(self.attempts):
            if a.cause is None or a.cause != last.cause or a.cause_step != last.cause_step:
                break
            n += 1
        return n

    def _note_restart(self) -> None:
        now = self._clock()
        self.restart_times.append(now)
        c = self.cfg
        recent = [t for t in self.restart_times if now - t <= c.storm_window_s]
        if len(recent) >= c.storm_restarts and not self._storm_open:
            self._storm_open = True
            causes = sorted({a.cause_text for a in self.attempts[-len(recent):] if a.cause_text})
            storm = {"restarts": len(recent), "window_s": c.storm_window_s, "since": recent[0], "causes": causes}
            self.storms.append(storm)
            self._emit("launcher.restart_storm", f"restart storm: {len(recent)} restarts within "
                       f"{c.storm_window_s:g} s ({'; '.join(causes) or 'causes unknown'})", level="error", data=storm)
        elif len(recent) < c.storm_restarts:
            self._storm_open = False
        if self._storm_open and self.storms:
            self.storms[-1]["restarts_total"] = sum(1 for t in self.restart_times if t >= self.storms[-1]["since"])

    def summary(self) -> dict[str, Any]:
        """For ``titan run``'s result: storms and the attempts' causes."""
        return {"storms": list(self.storms), "attempts": len(self.attempts),
                "causes": [a.cause_text for a in self.attempts if a.cause_text]}


def clear_stale_giveup(rd: RunDir) -> bool:
    """Remove a run-wide abort that an earlier launch's restart policy wrote (a resubmitted
    run gets a fresh decision); an operator's abort stays. Returns whether one was removed."""
    import json

    from titan.events import abort_file

    path = abort_file(rd, None)
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(obj, dict) or obj.get("by") != POLICY_BY:
        return False
    path.unlink(missing_ok=True)
    return True
