"""The versioned event schema: one JSON object per line, the same for every writer.

Field names are short because the files are large at scale; ``docs/events.md`` is the
reference. A reader refuses lines whose ``v`` is newer than ``SCHEMA_VERSION``.

Version 2 (strict JSON): a non-finite number is written as the string ``"nan"``,
``"inf"`` or ``"-inf"`` (``titan.events.strict``), never as a ``NaN`` token. Version 1
lines (which could hold ``NaN``) are still read; their data is normalised the same way.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from typing import Any, Mapping

from titan.events import strict

__all__ = ["INJECTED", "SCHEMA_VERSION", "LEVELS", "Event", "SchemaError", "utc_iso"]

SCHEMA_VERSION = 2
LEVELS = ("debug", "info", "warning", "error", "critical")


#: The data field that marks a fault injected on purpose (every ``inject.*`` event carries it).
INJECTED = "injected"


class SchemaError(ValueError):
    """A line is not a valid event of a schema version this reader understands."""


def utc_iso(t: float) -> str:
    """Format a UNIX time as an ISO-8601 UTC timestamp with microseconds."""
    return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
    """One event. ``t`` is UNIX time (UTC), ``mono`` the writer's monotonic clock."""

    kind: str
    t: float
    mono: float
    run: str
    node: str
    rank: int | None = None
    local_rank: int | None = None
    world: int | None = None
    attempt: int | None = None
    pid: int | None = None
    seq: int = 0
    step: int | None = None
    phase: str | None = None
    level: str = "info"
    msg: str = ""
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    v: int = SCHEMA_VERSION
    # Set by the reader, not stored: where the line came from.
    source: str | None = dataclasses.field(default=None, compare=False)
    line: int | None = dataclasses.field(default=None, compare=False)

    @property
    def injected(self) -> bool:
        """A fault put in on purpose (a drill, a test): an ``inject.*`` event, or one whose
        data says ``injected: true`` (e.g. the ``worker.fault`` of an injected exception).
        Triage, the node ledger and the report never count these as real faults."""
        return self.kind.startswith("inject.") or self.data.get(INJECTED) is True

    def to_json(self) -> str:
        """Serialise as one line (no newline) with the timestamp in ISO form."""
        obj: dict[str, Any] = {"v": self.v, "ts": utc_iso(self.t)}
        for f in dataclasses.fields(self):
            if f.name in ("v", "source", "line"):
                continue
            val = getattr(self, f.name)
            if val is None or (f.name == "data" and not val) or (f.name == "msg" and not val):
                continue
            obj[f.name] = val
        return strict.dumps(obj, separators=(",", ":"), default=_json_default)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any], *, source: str | None = None, line: int | None = None) -> "Event":
        """Build from a decoded JSON object; raises ``SchemaError`` if it is not an event."""
        if not isinstance(obj, Mapping):
            raise SchemaError("not a JSON object")
        v = obj.get("v")
        if not isinstance(v, int):
            raise SchemaError("missing schema version 'v'")
        if v > SCHEMA_VERSION:
            raise SchemaError(f"schema version {v} is newer than this reader's {SCHEMA_VERSION}")
        try:
            kind = obj["kind"]
            t = float(obj["t"])
            run = str(obj["run"])
            node = str(obj["node"])
        except (KeyError, TypeError, ValueError) as e:
            raise SchemaError(f"missing or bad field: {e}") from None
        if not isinstance(kind, str) or not kind:
            raise SchemaError("'kind' must be a non-empty string")
        level = obj.get("level", "info")
        if level not in LEVELS:
            raise SchemaError(f"unknown level {level!r}")
        data = obj.get("data") or {}
        if not isinstance(data, Mapping):
            raise SchemaError("'data' must be an object")
        if v < 2:  # migration: version 1 could write NaN/Infinity; give readers one form
            data = strict.finite(dict(data))
        return cls(
            kind=kind, t=t, mono=float(obj.get("mono", 0.0)), run=run, node=node,
            rank=_opt_int(obj.get("rank")), local_rank=_opt_int(obj.get("local_rank")),
            world=_opt_int(obj.get("world")), attempt=_opt_int(obj.get("attempt")),
            pid=_opt_int(obj.get("pid")), seq=int(obj.get("seq", 0)),
            step=_opt_int(obj.get("step")), phase=obj.get("phase"), level=level,
            msg=str(obj.get("msg", "")), data=dict(data), v=v, source=source, line=line,
        )

    def to_dict(self) -> dict[str, Any]:
        """A plain dict as stored, plus ``source``/``line`` when known (for ``--json``)."""
        d = strict.loads_strict(self.to_json())
        if self.source is not None:
            d["source"] = self.source
            d["line"] = self.line
        return d


def _opt_int(x: Any) -> int | None:
    if x is None:
        return None
    try:
        return int(x)
    except (TypeError, ValueError):
        raise SchemaError(f"expected an integer, got {x!r}") from None


def _json_default(o: Any) -> Any:
    # Tensors, numpy scalars, paths and enums end up in event data; make them plain.
    if hasattr(o, "item") and callable(o.item):
        try:
            return o.item()
        except (ValueError, RuntimeError):
            pass
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)
