"""What the workers of one launch told the run directory — the facts of ``titan run``'s last line.

* **steps**: how many distinct optimizer steps the workers reported (``step`` events) and
  the last one; a script that trains nothing reports none.
* **worker context**: whether any worker used Titan's worker context (``titan.worker``:
  it opens the worker's event file). Without it nothing was guarded, checkpointed or
  watched — a plain torchrun script still runs and succeeds under ``titan run``, but the
  user is told what it did not get.
* **checkpoints lost**: every checkpoint was corrupt at a restore (``ckpt.all_corrupt``),
  and whether training then started from scratch (allowed by a setting) or stopped.

Kept in one small module so the any-script work can extend it (which capabilities were
live). Cost: reads this node's worker event files written during the launch, once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from titan.events import EVENT_FILE_RE, Event, RunDir, read_file

__all__ = ["LaunchFacts", "launch_facts", "node_worker_events", "describe"]


@dataclasses.dataclass(frozen=True)
class LaunchFacts:
    """What one node's workers reported during one ``titan run`` (see the module docstring)."""

    worker_context: bool
    steps_reported: int
    last_step: int | None
    all_corrupt: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def fresh_start(self) -> bool:
        """Training restarted from step 0 after every checkpoint was lost (allowed by a setting)."""
        return any(d.get("fresh_start") for d in self.all_corrupt)

    def to_dict(self) -> dict[str, Any]:
        return {"worker_context": self.worker_context, "steps_reported": self.steps_reported,
                "last_step": self.last_step, "all_checkpoints_corrupt": list(self.all_corrupt),
                "notes": list(self.notes)}


def node_worker_events(rd: RunDir, node: str, started_at: float) -> list[Event]:
    """Events of this node's worker files written since ``started_at`` (one read of each file)."""
    out: list[Event] = []
    if not rd.events_dir.is_dir():
        return out
    for f in sorted(rd.events_dir.glob(f"{node}.rank*.jsonl")):
        m = EVENT_FILE_RE.match(f.name)
        try:
            if not m or m.group("node") != node or f.stat().st_mtime < started_at - 1.0:
                continue
            evs, _ = read_file(f)
        except OSError:
            continue
        out.extend(ev for ev in evs if ev.t >= started_at - 1.0)
    return out


def launch_facts(rd: RunDir, node: str, started_at: float, events: list[Event] | None = None) -> LaunchFacts:
    """What this node's workers reported since ``started_at`` (``events``: already read)."""
    evs = node_worker_events(rd, node, started_at) if events is None else events
    steps = {int(ev.step) for ev in evs if ev.kind == "step" and ev.step is not None}
    lost = [dict(ev.data) for ev in evs if ev.kind == "ckpt.all_corrupt" and ev.rank in (0, None)]
    used = bool(evs)
    notes: list[str] = []
    if not used:
        notes.append("no worker used Titan's worker context (titan.worker): nothing was guarded, "
                     "checkpointed or watched (docs/integrate.md)")
    for d in lost:
        n = d.get("checkpoints", "every")
        if d.get("fresh_start"):
            notes.append(f"every checkpoint ({n}) was corrupt: training restarted from step 0 "
                         f"(allowed by checkpoint.allow_fresh_start)")
        else:
            notes.append(f"every checkpoint ({n}) was corrupt: stopped instead of restarting from step 0 "
                         f"(allow it with --set checkpoint.allow_fresh_start=true)")
    return LaunchFacts(used, len(steps), max(steps) if steps else None, tuple(lost), tuple(notes))


def describe(*, exit_name: str, root_causes: int, consequences: int, restarts: int, facts: LaunchFacts | None,
             reason: str | None = None) -> str:
    """``titan run``'s final line (without the run directory), in plain text."""
    parts = [f"titan run: {exit_name}"]
    fail = f"{root_causes} worker failure(s)"
    if consequences:
        fail += f" + {consequences} consequence(s) (peers that lost the failed rank)"
    body = [fail, f"{restarts} restart(s)"]
    if facts is not None:
        if facts.steps_reported:
            body.append(f"workers reported {facts.steps_reported} step(s), last step {facts.last_step}")
        else:
            body.append("workers reported no steps")
    line = f"{parts[0]} — " + ", ".join(body)
    if reason:
        line += f"; {reason}"
    if facts is not None and facts.notes:
        line += "; " + "; ".join(facts.notes)
    return line
