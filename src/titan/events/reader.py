"""The event reader: every file of a run merged into one time-ordered stream.

* Per-node clock offsets (``clock.offset`` events, measured at rendezvous against rank
  0's clock, or ``clock_offsets`` in ``run.json``) are subtracted before ordering.
* A torn last line (a writer killed mid-line, or a full disk) is skipped and reported.
* Lines of a newer schema version, or that are not events, are skipped and reported;
  the caller decides whether that is fatal.
* Within one file, order is the writer's sequence number, whatever the clocks say.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from titan.events.rundir import RunDir
from titan.events.schema import Event, SchemaError

__all__ = ["ReadProblem", "ReadResult", "read_file", "read_run", "filter_events"]


@dataclasses.dataclass(frozen=True)
class ReadProblem:
    """A line that was skipped, and why."""

    source: str
    line: int
    reason: str
    torn: bool = False


@dataclasses.dataclass
class ReadResult:
    events: list[Event]
    problems: list[ReadProblem]
    clock_offsets: dict[str, float]

    @property
    def torn_lines(self) -> list[ReadProblem]:
        return [p for p in self.problems if p.torn]


def read_file(path: str | os.PathLike[str]) -> tuple[list[Event], list[ReadProblem]]:
    """Parse one JSONL event file; never raises for bad content (only for I/O)."""
    p = Path(path)
    events: list[Event] = []
    problems: list[ReadProblem] = []
    with open(p, "rb") as f:
        data = f.read()
    if not data:
        return events, problems
    lines = data.split(b"\n")
    ends_clean = data.endswith(b"\n")
    if ends_clean:
        lines = lines[:-1]
    for i, raw in enumerate(lines, start=1):
        last = i == len(lines)
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
            events.append(Event.from_obj(obj, source=str(p), line=i))
        except (UnicodeDecodeError, json.JSONDecodeError, SchemaError) as e:
            torn = last and not ends_clean
            reason = "torn last line (writer stopped mid-line)" if torn else f"{type(e).__name__}: {e}"
            problems.append(ReadProblem(str(p), i, reason, torn=torn))
    return events, problems


def _offsets(events: Iterable[Event], run_json: dict) -> dict[str, float]:
    offsets: dict[str, float] = {}
    for node, off in (run_json.get("clock_offsets") or {}).items():
        try:
            offsets[str(node)] = float(off)
        except (TypeError, ValueError):
            continue
    for ev in events:
        if ev.kind == "clock.offset":
            for node, off in (ev.data.get("offsets_s") or {}).items():
                offsets[str(node)] = float(off)
    return offsets


def read_run(
    run: str | os.PathLike[str] | RunDir | Sequence[str | os.PathLike[str]],
) -> ReadResult:
    """Read a run directory (or a list of event files) into one ordered stream.

    Cost: reads every file whole into memory; fine for the event volume of a run
    (use sampling for very long runs). Raises ``titan.errors.UserError`` for a path
    that is not a run directory.
    """
    run_json: dict = {}
    if isinstance(run, (str, os.PathLike, RunDir)):
        rd = run if isinstance(run, RunDir) else RunDir.open(run)
        files = rd.event_files()
        run_json = rd.read_run_json()
    else:
        files = [Path(f) for f in run]
    per_file: list[list[Event]] = []
    problems: list[ReadProblem] = []
    for f in files:
        evs, probs = read_file(f)
        evs.sort(key=lambda e: e.seq)
        per_file.append(evs)
        problems.extend(probs)
    offsets = _offsets((e for evs in per_file for e in evs), run_json)

    def corrected(ev: Event) -> float:
        return ev.t - offsets.get(ev.node, 0.0)

    # Each file is ordered by seq; its corrected times are non-decreasing except for
    # wall-clock jumps, which keep their file order (merge is stable per file).
    def keyed(evs: list[Event], idx: int) -> Iterator[tuple[float, int, int, Event]]:
        lo = float("-inf")
        for ev in evs:
            lo = max(lo, corrected(ev))
            yield (lo, idx, ev.seq, ev)

    merged = [item[3] for item in heapq.merge(*(keyed(evs, i) for i, evs in enumerate(per_file)))]
    return ReadResult(merged, problems, offsets)


def filter_events(
    events: Iterable[Event],
    *,
    kinds: Sequence[str] | None = None,
    ranks: Sequence[int] | None = None,
    nodes: Sequence[str] | None = None,
    since: float | None = None,
    until: float | None = None,
    min_level: str | None = None,
) -> list[Event]:
    """Select events. A kind ``guard`` matches ``guard`` and ``guard.*``."""
    from titan.events.schema import LEVELS

    lvl = LEVELS.index(min_level) if min_level else 0
    out = []
    for ev in events:
        if kinds and not any(ev.kind == k or ev.kind.startswith(k + ".") for k in kinds):
            continue
        if ranks is not None and ev.rank not in ranks:
            continue
        if nodes is not None and ev.node not in nodes:
            continue
        if since is not None and ev.t < since:
            continue
        if until is not None and ev.t > until:
            continue
        if LEVELS.index(ev.level) < lvl:
            continue
        out.append(ev)
    return out
