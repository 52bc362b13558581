"""Follow a run directory's event files while the run is writing them.

Cost: one ``stat``/``read`` of each new byte range per poll; only whole lines are parsed,
so a line being written is picked up on the next poll.
"""

from __future__ import annotations

import json
from pathlib import Path

from titan.events.rundir import RunDir
from titan.events.schema import Event, SchemaError

__all__ = ["EventTail"]


class EventTail:
    """Incrementally read every event file of a run (workers', launchers', chaos)."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def poll(self) -> list[Event]:
        """New complete events since the last poll (file order within a file)."""
        out: list[Event] = []
        try:
            files = self.run_dir.event_files()
        except OSError:
            return out
        for path in files:
            off = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    fh.seek(off)
                    chunk = fh.read()
            except OSError:
                continue
            if not chunk:
                continue
            self._offsets[path] = off + len(chunk)
            buf = self._partial.pop(path, b"") + chunk
            *lines, rest = buf.split(b"\n")
            if rest:
                self._partial[path] = rest
            for raw in lines:
                if not raw.strip():
                    continue
                try:
                    out.append(Event.from_obj(json.loads(raw.decode("utf-8")), source=str(path)))
                except (UnicodeDecodeError, json.JSONDecodeError, SchemaError):
                    continue
        return out
