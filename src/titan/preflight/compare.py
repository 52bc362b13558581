"""Compare fingerprints across members (ranks or nodes) and name the odd ones.

With ≥ 3 members the value held by a strict majority is the reference; with 2, a saved
known-good fingerprint (``--baseline``) decides, or both are reported as differing.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Mapping

from titan.preflight.fingerprint import VOLATILE_KEYS, flatten

__all__ = ["Difference", "compare_fingerprints"]


@dataclasses.dataclass(frozen=True)
class Difference:
    """``member`` holds ``value`` for ``key`` where the reference holds ``expected``."""

    member: str
    key: str
    value: str
    expected: str | None  # None: no reference (two members, no baseline)
    reference: str        # "majority", "baseline" or "none"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare_fingerprints(fps: Mapping[str, Mapping[str, Any]], baseline: Mapping[str, Any] | None = None) -> list[Difference]:
    """Return every (member, key) whose value departs from the reference. Pure; no I/O."""
    flat = {m: flatten(fp) for m, fp in fps.items()}
    base = flatten(baseline) if baseline is not None else None
    keys = sorted(set().union(*(f.keys() for f in flat.values())) | (set(base) if base else set()))
    diffs: list[Difference] = []
    for key in keys:
        if key in VOLATILE_KEYS:
            continue
        vals = {m: f.get(key, "<missing>") for m, f in flat.items()}
        if base is not None:
            exp = base.get(key, "<missing>")
            diffs += [Difference(m, key, v, exp, "baseline") for m, v in vals.items() if v != exp]
            continue
        counts = collections.Counter(vals.values())
        if len(counts) <= 1:
            continue
        (top, n), *_ = counts.most_common()
        if len(vals) >= 3 and n * 2 > len(vals):
            diffs += [Difference(m, key, v, top, "majority") for m, v in vals.items() if v != top]
        else:
            diffs += [Difference(m, key, v, None, "none") for m, v in vals.items()]
    return diffs
