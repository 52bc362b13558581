"""The documented field mapping from Titan events to Elasticsearch and Loki.

The Vector and fluent-bit examples in ``deploy/`` implement this mapping; this module is
its executable definition (used by tests, and by users who ship with their own code).
Loki labels are low-cardinality only (run, node, level, kind); rank, step and data go into
the log line, as Loki's docs ask.
"""

from __future__ import annotations

import json
from typing import Any

from titan.events.schema import Event, utc_iso

__all__ = ["to_elasticsearch", "to_loki", "LOKI_LABELS", "ES_FIELDS"]

LOKI_LABELS = ("job", "run", "node", "level", "kind")
#: Elasticsearch document fields (ECS names where ECS has one).
ES_FIELDS = ("@timestamp", "message", "log.level", "event.kind", "event.dataset", "host.name",
             "titan.run", "titan.rank", "titan.local_rank", "titan.world", "titan.attempt",
             "titan.pid", "titan.seq", "titan.step", "titan.phase", "titan.data", "titan.schema")


def to_elasticsearch(ev: Event) -> dict[str, Any]:
    """One event → one Elasticsearch document (nested objects, ECS-style)."""
    return {
        "@timestamp": utc_iso(ev.t),
        "message": ev.msg or ev.kind,
        "log": {"level": ev.level},
        "event": {"kind": ev.kind, "dataset": "titan.events"},
        "host": {"name": ev.node},
        "titan": {"run": ev.run, "rank": ev.rank, "local_rank": ev.local_rank, "world": ev.world,
                  "attempt": ev.attempt, "pid": ev.pid, "seq": ev.seq, "step": ev.step, "phase": ev.phase,
                  "data": dict(ev.data), "schema": ev.v},
    }


def to_loki(ev: Event) -> tuple[dict[str, str], str, int]:
    """One event → (stream labels, log line, timestamp in ns) for Loki's push API."""
    labels = {"job": "titan", "run": ev.run, "node": ev.node, "level": ev.level, "kind": ev.kind}
    line = json.dumps({"msg": ev.msg, "rank": ev.rank, "attempt": ev.attempt, "step": ev.step,
                       "phase": ev.phase, "pid": ev.pid, "data": dict(ev.data)}, separators=(",", ":"), default=str)
    whole = int(ev.t)  # split first: t * 1e9 loses the sub-microsecond digits of a 2020s time
    return labels, line, whole * 1_000_000_000 + int(round((ev.t - whole) * 1e9))
