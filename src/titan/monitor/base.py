"""Shared pieces of the collectors: results, metric keys, counter rates, /proc reading.

A collector turns one look at the machine into a ``Reading``: a flat dict of metric
key → float and a status (``"ok"`` or ``"unavailable: <reason>"``). Metric keys follow
Prometheus naming without the ``titan_`` prefix, with labels inline:
``gpu_temperature_celsius{gpu="0"}``. A name ending in ``_total`` is a counter;
everything else is a gauge. Collectors never raise for a missing source: they report it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import Any, Mapping, Protocol

__all__ = [
    "Reading", "Finding", "Collector", "ProcFS", "RateTracker", "metric_key", "parse_key",
    "unavailable",
]

log = logging.getLogger(__name__)

_KEY_RE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?$')
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_key(name: str, **labels: Any) -> str:
    """``name{a="x",b="y"}`` with labels sorted; just ``name`` without labels."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{_esc(str(v))}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def parse_key(key: str) -> tuple[str, dict[str, str]]:
    """Inverse of ``metric_key``; raises ``ValueError`` on a malformed key."""
    m = _KEY_RE.match(key)
    if not m:
        raise ValueError(f"malformed metric key {key!r}")
    labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL_RE.findall(m["labels"] or "")}
    return m["name"], labels


def unavailable(reason: str) -> str:
    """The status string of a collector that cannot run here."""
    return f"unavailable: {reason}"


@dataclasses.dataclass(frozen=True)
class Finding:
    """Something a collector saw that is an event by itself (a kernel Xid line, an NVML Xid)."""

    category: str  # xid | mce | edac | link | oom | nvlink …
    message: str
    level: str = "warning"
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Reading:
    """One collector's result for one tick."""

    collector: str
    status: str = "ok"
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "metrics": self.metrics, "info": self.info,
                "findings": [dataclasses.asdict(f) for f in self.findings]}


class Collector(Protocol):
    """What the agent calls once per tick. ``collect`` never raises."""

    name: str

    def collect(self, now: float) -> Reading: ...

    def close(self) -> None: ...


class ProcFS:
    """Reads files below a root (``/`` in production, a folder of recorded files in tests)."""

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root)

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read(self, rel: str) -> str | None:
        """The file's text, or None when it does not exist or cannot be read."""
        try:
            return self.path(rel).read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def exists(self, rel: str) -> bool:
        return self.path(rel).exists()


class RateTracker:
    """Per-second rates of monotonic counters between two ticks.

    A counter that went backwards (reset, wrap, device re-created) yields no rate for
    that tick rather than a huge negative spike.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}

    def rate(self, key: str, value: float, now: float) -> float | None:
        prev = self._last.get(key)
        self._last[key] = (now, value)
        if prev is None:
            return None
        dt = now - prev[0]
        dv = value - prev[1]
        if dt <= 0 or dv < 0:
            return None
        return dv / dt

    def delta(self, key: str, value: float) -> float | None:
        """Increase since the previous call (None on the first call or a reset)."""
        prev = self._last.get(key)
        self._last[key] = (0.0, value)
        if prev is None or value < prev[1]:
            return None
        return value - prev[1]
