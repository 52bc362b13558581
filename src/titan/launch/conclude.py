"""How one ``titan run`` ended, in full: the exit code checked against the evidence, the
failures split into root causes and consequences, what the workers reported.

``titan.launch.runner`` maps torchrun's outcome onto an exit code; :func:`conclude` then

* keeps ``PREEMPTED`` (9, "saved and stopped") only when the preemption save is on disk
  (``titan.launch.preempt``); otherwise the run was interrupted by the signal
  (``INTERRUPTED``) and the reason says why nothing was saved;
* classifies the failures (``titan.launch.causes``);
* collects the workers' facts (``titan.launch.facts``: steps, worker context, checkpoints lost).

The result feeds ``launcher.finished``, ``run.json`` and the final line alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from titan.events import RunDir
from titan.exitcodes import ExitCode
from titan.launch.causes import classify_failures, count_roles
from titan.launch.facts import LaunchFacts, describe, launch_facts, node_worker_events
from titan.launch.preempt import preemption_save

__all__ = ["Conclusion", "conclude"]


@dataclasses.dataclass(frozen=True)
class Conclusion:
    """The checked exit code and what is said about the run."""

    exit_code: ExitCode
    failures: list[dict[str, Any]]  # classified: each has "role"
    root_causes: int
    consequences: int
    facts: LaunchFacts
    preemption: dict[str, Any] | None
    reason: str | None
    disk: dict[str, Any] | None = None

    def data(self) -> dict[str, Any]:
        """Fields for ``launcher.finished`` and ``run.json``."""
        return {"root_causes": self.root_causes, "consequences": self.consequences, **self.facts.to_dict(),
                "preemption": self.preemption, "reason": self.reason, "disk": self.disk}

    def final_line(self, restarts: int) -> str:
        """One line for the terminal (plain text; the CLI adds the run directory)."""
        return describe(exit_name=self.exit_code.name, root_causes=self.root_causes, consequences=self.consequences,
                        restarts=restarts, facts=self.facts, reason=self.reason)


def conclude(code: ExitCode, rd: RunDir, node: str, started_at: float, failures: Sequence[Mapping[str, Any]],
             abort: Mapping[str, Any] | None, disk: Mapping[str, Any] | None = None) -> Conclusion:
    """Check ``code`` against the run directory and describe the run. Never raises for I/O.

    ``disk``: ``titan.launch.diskspace.disk_state`` of the run directory; a full one is said.
    """
    classified = classify_failures(failures)
    roots, cons = count_roles(classified)
    evs = node_worker_events(rd, node, started_at)  # read once, for the facts and the preemption check
    facts = launch_facts(rd, node, started_at, evs)
    refused = sorted({int(ev.data.get("step", ev.step or 0)) for ev in evs
                      if ev.kind == "ckpt.failed" and ev.data.get("kind") == "disk_full"})
    if refused and disk is not None:
        disk = {**disk, "full": True, "saves_refused": len(refused)}
    if disk and disk.get("full"):
        free = int(disk.get("free_bytes", 0)) >> 10
        when = ("has" if disk.get("full_at_end", True) else
                f"went full during the run (lowest {int(disk.get('lowest_free_bytes', 0)) >> 10} KiB free) and has")
        saves = (f"; {len(refused)} checkpoint save(s) failed for lack of space (steps {refused[0]}.."
                 f"{refused[-1]})" if refused else "")
        facts = dataclasses.replace(facts, notes=(*facts.notes, (
            f"disk full: the run directory's file system {when} {free} KiB free "
            f"({disk.get('path')}){saves}; events, logs and checkpoints written while it was full are lost")))
    reason = str(abort.get("reason")) if abort and abort.get("reason") else None
    pre = None
    if code == ExitCode.PREEMPTED:
        pre = preemption_save(rd, node, started_at, evs)
        # A worker that exits 9 itself claims its own save (the documented contract); only
        # a Titan checkpointer's save can be checked, and a failed one overrules the claim.
        claimed = any(int(f.get("exit_code") or 0) == int(ExitCode.PREEMPTED) for f in failures)
        if not pre["saved"] and claimed and pre["step"] is None:
            pre = {**pre, "saved": None, "why": "a worker exited 9 (saved and stopped) without titan.checkpoint: "
                                                "its own save, not checked"}
        elif not pre["saved"]:
            code = ExitCode.INTERRUPTED
            reason = f"stopped by SIGTERM without a save on disk: {pre['why']}"
    return Conclusion(code, classified, roots, cons, facts, pre, reason, dict(disk) if disk else None)
