"""Exit 9 (``PREEMPTED``: saved and stopped) only when the preemption save is on disk.

A SIGTERM to ``titan run`` (a scheduler's preemption) is forwarded to the workers; a
worker wired with ``titan.checkpoint`` finishes its step, saves, and exits. A worker that
ignores SIGTERM is SIGKILLed after torchelastic's grace period, and a plain script saves
nothing: that is not "saved and stopped". This module looks for the proof: a
``ckpt.preempted`` event of this node during the launch, a ``ckpt.saved`` of that step,
and the committed checkpoint directory of that step on disk (manifest present).

Cost: reads this node's worker event files written during the launch, once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from titan.events import Event, RunDir

__all__ = ["preemption_save"]


def preemption_save(rd: RunDir, node: str, started_at: float, events: list[Event] | None = None) -> dict[str, Any]:
    """``{"saved": bool, "step": int | None, "path": str | None, "why": str}`` for this launch.

    ``events``: this node's worker events of the launch, already read (``node_worker_events``).
    """
    from titan.launch.facts import node_worker_events

    evs = node_worker_events(rd, node, started_at) if events is None else events
    preempted = [int(ev.step) for ev in evs if ev.kind == "ckpt.preempted" and ev.step is not None]
    saved = {int(ev.step): str(ev.data["path"]) for ev in evs
             if ev.kind == "ckpt.saved" and ev.step is not None and ev.data.get("path")}
    if not preempted:
        return {"saved": False, "step": None, "path": None,
                "why": "no worker saved on SIGTERM (none used titan.checkpoint's preemption save, or none got to it "
                       "before it was killed)"}
    step = max(preempted)
    path = saved.get(step)
    if path is None:
        return {"saved": False, "step": step, "path": None,
                "why": f"the preemption save of step {step} did not complete (the workers were stopped first)"}
    if not _committed(Path(path)):
        return {"saved": False, "step": step, "path": path,
                "why": f"the preemption checkpoint of step {step} is not committed on disk ({path})"}
    return {"saved": True, "step": step, "path": path, "why": f"checkpoint of step {step} saved in {path}"}


def _committed(path: Path) -> bool:
    from titan.checkpoint.manifest import MANIFEST, parse_step

    return parse_step(path.name) is not None and (path / MANIFEST).is_file()
