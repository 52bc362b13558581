"""Name the rank a hang waits for, from beacon snapshots (and flight-recorder dumps).

Rule, in order:

1. **Behind in collective sequence numbers**: on any process-group slot where ranks
   disagree, the rank(s) with the lowest *issued* count never entered the collective the
   others are waiting in. Among several, the one whose beacon stopped first.
2. **Flight recorder** (when beacons carry no counts, e.g. a loop without the comm hook):
   the lowest last ``collective_seq_id`` per process group in the per-rank dumps.
3. **Stopped first**: the rank whose beacon's last update is the oldest.

Every input here is a plain snapshot, so nodes that exchange their snapshots compute the
same verdict.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["RankView", "Verdict", "identify", "fr_last_seq"]


@dataclasses.dataclass
class RankView:
    """One rank at the moment of detection, as exchanged between nodes (JSON-safe)."""

    node: str
    rank: int
    local_rank: int
    pid: int
    attempt: int
    step: int
    phase: str
    issued: list[int]
    completed: list[int]
    last_wall_ns: int
    phase_wall_ns: int
    stalled_s: float
    timeout_s: float
    fr_seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RankView":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclasses.dataclass
class Verdict:
    """The culprit and why."""

    rank: int
    node: str
    phase: str
    step: int
    reason: str  # "collective-seq" | "flight-recorder" | "stopped-first"
    detail: dict[str, Any]


def identify(views: Sequence[RankView]) -> Verdict | None:
    """Apply the rule above to ``views`` (one per rank); ``None`` for no views."""
    if not views:
        return None
    by_rank = {v.rank: v for v in views}
    vs = sorted(by_rank.values(), key=lambda v: v.rank)
    slots = max(len(v.issued) for v in vs)
    for slot in range(slots):
        counts = {v.rank: (v.issued[slot] if slot < len(v.issued) else 0) for v in vs}
        lo, hi = min(counts.values()), max(counts.values())
        if lo != hi:
            behind = [v for v in vs if counts[v.rank] == lo]
            c = min(behind, key=lambda v: (v.last_wall_ns, v.rank))
            return Verdict(c.rank, c.node, c.phase, c.step, "collective-seq",
                           {"slot": slot, "issued": {str(k): n for k, n in counts.items()}, "behind_by": hi - lo})
    fr = {v.rank: v.fr_seq for v in vs if v.fr_seq is not None}
    if len(fr) == len(vs) and len(set(fr.values())) > 1:
        lo = min(fr.values())
        c = min((v for v in vs if fr[v.rank] == lo), key=lambda v: (v.last_wall_ns, v.rank))
        return Verdict(c.rank, c.node, c.phase, c.step, "flight-recorder", {"fr_seq": {str(k): n for k, n in fr.items()}})
    c = min(vs, key=lambda v: (v.last_wall_ns, v.rank))
    return Verdict(c.rank, c.node, c.phase, c.step, "stopped-first",
                   {"last_update_ns": {str(v.rank): v.last_wall_ns for v in vs}})


def fr_last_seq(path: str | Path) -> int | None:
    """Highest ``collective_seq_id`` this rank *entered*, from a flight-recorder JSON dump."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    entries = obj.get("entries") if isinstance(obj, dict) else None
    if not isinstance(entries, list):
        return None
    seqs = [int(e.get("collective_seq_id", 0)) for e in entries if isinstance(e, dict)]
    return max(seqs) if seqs else 0
