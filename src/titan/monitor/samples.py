"""Compact sample files: ``<run>/metrics/agent.<node>.jsonl``, one line per tick.

Each line is ``{"t": unix_time, "m": {key: value}}`` with values rounded to 5
significant digits and only the keys whose value changed since the previous line; every
``full_every`` lines (and the first) carry all keys and ``"full": true``. ``read_samples``
rebuilds the full snapshot of every tick. A key that disappears (a collector went
unavailable) is written once with ``null``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator, Mapping

from titan.events import strict

__all__ = ["SampleWriter", "read_samples", "compact"]


def compact(v: float) -> float | int:
    """Round to 5 significant digits; integral values become ints (shorter JSON)."""
    if v != v or v in (float("inf"), float("-inf")):
        return v
    r = float(f"{v:.5g}")
    return int(r) if r.is_integer() and abs(r) < 1e15 else r


class SampleWriter:
    """Appends delta-encoded samples with one ``write(2)`` per line (O_APPEND)."""

    def __init__(self, path: str | os.PathLike[str], *, full_every: int = 60) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.full_every = full_every
        self._prev: dict[str, float | int] = {}
        self._n = 0
        self.bytes_written = 0

    def write(self, t: float, metrics: Mapping[str, float]) -> None:
        cur = {k: compact(v) for k, v in metrics.items()}
        full = self._n % self.full_every == 0
        if full:
            obj: dict[str, object] = {"t": round(t, 3), "full": True, "m": cur}
        else:
            delta: dict[str, float | int | None] = {k: v for k, v in cur.items() if self._prev.get(k) != v}
            delta.update({k: None for k in self._prev.keys() - cur.keys()})
            obj = {"t": round(t, 3), "m": delta}
        self._prev = cur
        self._n += 1
        line = (strict.dumps(obj, separators=(",", ":")) + "\n").encode()  # non-finite -> "nan"
        try:
            os.write(self._fd, line)
            self.bytes_written += len(line)
        except OSError:
            pass  # a full disk must not stop monitoring; the disk_free rule reports it

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


def read_samples(path: str | os.PathLike[str]) -> Iterator[tuple[float, dict[str, float]]]:
    """Yield ``(t, full snapshot)`` per line; torn or garbled lines are skipped."""
    state: dict[str, float] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                obj = json.loads(line)
                t, m = float(obj["t"]), obj["m"]
            except (ValueError, KeyError, TypeError):
                continue
            if obj.get("full"):
                state = {}
            for k, v in m.items():
                if v is None:
                    state.pop(k, None)
                else:
                    state[k] = float(v)
            yield t, dict(state)
