"""What a running drill is doing, for its progress bar: the phase, from the run's events.

The bar's count is the highest step reached; it stands still during start-up, while a fault
is detected, during a restart and while lost steps are recomputed. :class:`DrillPhase` reads
the events the driver reads (in arrival order) and names the phase:

``starting`` (launch, rendezvous, first step) → ``training`` → an injected fault that ends
workers: ``killed rank 1, detecting`` / ``hang on rank 0, detecting`` → on its detection
``restarting (hang.detected)`` → new workers: ``restoring`` (loading the checkpoint) →
``recomputing 2/5`` (steps past the checkpoint done again: 2 of the 5 lost) → ``training``.
A guard skip shows as ``guard skipped step 4`` for two seconds of event time. Pure: no
I/O, no clock (event timestamps only), O(1) per event.
"""

from __future__ import annotations

from titan.events import Event
from titan.launch.causes import is_comm_fault

__all__ = ["DrillPhase"]

#: Injections after which workers go away: what the bar says until they are detected.
_ENDING = {"inject.kill": "killed", "inject.kill_for_restore": "killed", "inject.hang": "hang on",
           "inject.exception": "exception on"}
_DETECT = ("worker.failed", "hang.detected", "launcher.worker_failed", "launcher.failure", "dist.timeout",
           "worker.fault")
_NOTE_S = 2.0


class DrillPhase:
    """Feed every event with :meth:`feed`; :meth:`text` is the phase to show now."""

    def __init__(self) -> None:
        self.now = 0.0  # the latest event time seen
        self.state = "starting"
        self.detail = ""
        self.best = 0  # highest step any attempt reached
        self.target = 0  # the highest step reached before the current restart
        self.resume = 0  # the step the current attempt resumed after
        self.last = 0  # rank 0's latest step
        self.note: tuple[float, str] | None = None

    def _restart(self, why: str) -> None:
        if self.state not in ("restarting", "restoring"):
            self.target = max(self.target, self.best)
            self.state, self.detail = "restarting", why

    def feed(self, ev: Event) -> None:
        """Update the phase with one event (any kind; unknown kinds are ignored)."""
        k = ev.kind
        self.now = max(self.now, ev.t)
        if k in _ENDING:
            rank = ev.data.get("rank", ev.rank)
            self.state, self.detail = "fault", f"{_ENDING[k]} rank {rank}" if rank is not None else _ENDING[k]
            self.target = max(self.target, self.best)
        elif k == "inject.preempt":
            self.state, self.detail = "fault", "preempted (SIGTERM), saving"
        elif k in _DETECT and self.state in ("fault", "training") and not (
                k == "worker.fault" and is_comm_fault(ev.data)):  # a peer that lost the rank: a consequence
            self._restart(f"detected: {k}")
        elif k == "launcher.restart" or (k == "launcher.started" and self.best):
            self._restart("resubmitted" if k == "launcher.started" else self.detail or "group restart")
        elif k == "worker.started" and self.state == "restarting":
            self.state = "restoring"
        elif k == "ckpt.loaded" and self.state in ("restoring", "restarting"):
            step = ev.data.get("step", ev.step)
            if isinstance(step, int):
                self.resume = self.last = step
                self.state = "recomputing" if self.target > step else "restoring"
        elif k == "guard.skip" and ev.step is not None:
            self.note = (ev.t + _NOTE_S, f"guard skipped step {ev.step}")
        elif k == "step" and ev.step is not None and (ev.rank or 0) == 0:
            if self.state in ("restoring", "restarting") and self.target:
                self.resume = min(self.resume or ev.step - 1, ev.step - 1)
                self.state = "recomputing"
            if self.state == "recomputing" and ev.step > self.target:
                self.state, self.target = "training", 0
            elif self.state != "recomputing":
                self.state = "training"
            self.best = max(self.best, ev.step)
            self.last = ev.step

    def text(self) -> str:
        """The phase as the bar shows it."""
        if self.state == "fault":
            return f"{self.detail}, detecting"
        if self.state == "restarting":
            return f"restarting ({self.detail})" if self.detail else "restarting"
        if self.state == "restoring":
            return "restoring from the checkpoint"
        if self.state == "recomputing":
            done = max(0, self.last - self.resume)
            return f"recomputing {min(done, self.target - self.resume)}/{self.target - self.resume} lost steps"
        if self.state == "training" and self.note and self.now < self.note[0]:
            return self.note[1]
        return self.state
