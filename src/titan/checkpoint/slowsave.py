"""Slow-disk detection from the checkpoints themselves: each save's time against this rank's
own learned baseline, naming node and path.

A disk that turned slow (a degraded array, a congested parallel file system, an fsync that
takes half a second) shows first where training writes durably. The node agent's
``/proc/diskstats`` latency cannot see it — a slow ``fsync`` on a network or FUSE file
system is not a block-device read — but every save measures it end to end.

:class:`SaveTimeDetector` keeps the last ``window`` normal save times of one rank; once it
has ``warmup`` of them, a save is **slow** when it took more than ``factor`` × their median
*and* more than ``k`` robust standard deviations above it (σ = 1.4826·MAD, at least
``rel_floor`` × median and ``abs_floor_s``). Then two 4 KiB ``fsync`` probes in the
checkpoint folder tell whether the disk itself is slow: the faster of them must exceed
``probe_factor`` × the probe baseline (the median of three probes taken once, when the
save baseline was complete) and ``probe_floor_s`` above it. A save slowed by something
else — CPU contention, a busy reference run — finds the disk fast and raises nothing. The
first slow save of an episode emits ``ckpt.slow``; slow saves never enter the baseline, and
the episode ends with the next normal save. Cost: a few float operations per save; three
small fsyncs once, two per suspicious save.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import Any

__all__ = ["SaveTimeDetector", "fsync_probe"]


def fsync_probe(folder: Path) -> float | None:
    """Seconds to write and fsync 4 KiB in ``folder`` (the file is removed); None on error."""
    path = Path(folder) / f".titan-fsync-probe.{os.getpid()}"
    try:
        t0 = time.monotonic()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
        return time.monotonic() - t0
    except OSError:
        return None
    finally:
        try:
            path.unlink()
        except OSError:
            pass


@dataclasses.dataclass
class SaveTimeDetector:
    """See the module doc; :meth:`observe` after every save of this rank."""

    folder: Path
    warmup: int = 3
    window: int = 20
    factor: float = 2.0
    k: float = 4.0
    rel_floor: float = 0.1
    abs_floor_s: float = 0.05
    probe_factor: float = 4.0
    probe_floor_s: float = 0.02

    def __post_init__(self) -> None:
        self._times: collections.deque[float] = collections.deque(maxlen=self.window)
        self._fsync_base: float | None = None
        self._in_episode = False

    def baseline(self) -> tuple[float, float] | None:
        """(median, σ) of the normal saves, once ``warmup`` of them were seen."""
        if len(self._times) < self.warmup:
            return None
        m = statistics.median(self._times)
        mad = statistics.median(abs(x - m) for x in self._times)
        return m, max(1.4826 * mad, self.rel_floor * m, self.abs_floor_s)

    def observe(self, seconds: float) -> dict[str, Any] | None:
        """Record one save that took ``seconds``; returns the ``ckpt.slow`` data when this save
        starts a slow episode (else None)."""
        base = self.baseline()
        if base is not None and self._fsync_base is None:
            probes = [p for p in (fsync_probe(self.folder) for _ in range(3)) if p is not None]
            self._fsync_base = statistics.median(probes) if probes else None
        if base is not None:
            m, sig = base
            if seconds > self.factor * m and seconds - m > self.k * sig:
                if self._in_episode:
                    return None
                probes = [p for p in (fsync_probe(self.folder) for _ in range(2)) if p is not None]
                probe = min(probes) if probes else None
                pb = self._fsync_base
                if probe is None or pb is None or not (probe > self.probe_factor * pb and probe - pb > self.probe_floor_s):
                    return None  # slow, but not the disk: kept out of the baseline, no alarm
                self._in_episode = True
                return {"total_s": round(seconds, 4), "baseline_s": round(m, 4), "sigma_s": round(sig, 4),
                        "ratio": round(seconds / m, 2) if m > 0 else None, "baseline_saves": len(self._times),
                        "fsync_probe_s": None if probe is None else round(probe, 4),
                        "fsync_baseline_s": None if self._fsync_base is None else round(self._fsync_base, 4)}
        self._in_episode = False
        self._times.append(seconds)
        return None
