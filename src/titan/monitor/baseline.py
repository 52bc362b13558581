"""Learned baselines: rolling robust statistics per series, and sustained-deviation detection.

For each watched series the agent keeps the last ``window`` samples (an hour at 1 Hz)
and, every ``refresh`` samples, their median and MAD. A sample is *deviant* when
``(x - median) / scale > z`` with ``scale = max(1.4826·MAD, rel_floor·|median|, abs_floor)``
— 1.4826·MAD equals σ for a normal distribution, but one heavy-tailed burst cannot
inflate it the way it inflates a standard deviation. Nothing is judged during warm-up.

An *anomaly* is an episode of deviant samples lasting at least ``min_duration_s`` with at
least ``fire_fraction`` of its samples deviant (heavy-tailed noise makes single deviant
samples common; sustained ones are not). It clears after ``clear_s`` without a deviant
sample. Only high deviations count: every default series is "higher is worse".
While an anomaly is active its deviant samples are kept out of the history for up to
``relearn_s`` (a level shift that lasts longer becomes the new normal).

The scale also respects heavy tails: ``(q97.5 − median) / 1.96`` is σ for a normal
distribution, but on a series whose normal life includes rare stalls (loopback RTT on a
busy host: p99 ≈ 270× the median) it is wider than 1.4826·MAD, so those stalls do not
read as anomalies; the larger of the two is used.

Cost: O(1) per sample plus a sort of ``window`` floats every ``refresh`` samples
(~0.3 ms for 3600 values); memory ~32 bytes per kept sample.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics

__all__ = ["RobustBaseline", "SustainedDetector", "BaselineVerdict", "BaselineBank"]


class RobustBaseline:
    """Rolling median and MAD of one series (last ``window`` samples)."""

    def __init__(self, *, window: int = 3600, warmup: int = 300, refresh: int = 10,
                 rel_floor: float = 0.05, abs_floor: float = 0.0, tail_q: float | None = 0.975) -> None:
        self.values: collections.deque[float] = collections.deque(maxlen=window)
        self.warmup = warmup
        self.refresh = refresh
        self.rel_floor = rel_floor
        self.abs_floor = abs_floor
        self.tail_q = tail_q
        # The normal distribution's quantile at tail_q, e.g. 1.96 at 0.975.
        self.tail_z = statistics.NormalDist().inv_cdf(tail_q) if tail_q is not None else 1.0
        self.median = 0.0
        self.mad = 0.0
        self.tail_sigma = 0.0
        self._since = 0
        self.seen = 0

    @property
    def ready(self) -> bool:
        return self.seen >= self.warmup

    @property
    def scale(self) -> float:
        return max(1.4826 * self.mad, self.tail_sigma, self.rel_floor * abs(self.median), self.abs_floor, 1e-12)

    def score(self, x: float) -> float | None:
        """Robust z-score of ``x`` against the history (None during warm-up)."""
        if not self.ready:
            return None
        return (x - self.median) / self.scale

    def add(self, x: float) -> None:
        self.values.append(x)
        self.seen += 1
        self._since += 1
        if self._since >= self.refresh or self.seen == self.warmup:
            self._since = 0
            vals = sorted(self.values)
            n = len(vals)
            self.median = statistics.median(vals)
            self.mad = statistics.median(sorted(abs(v - self.median) for v in vals))
            if self.tail_q is not None:
                hi = vals[min(n - 1, int(self.tail_q * n))]
                self.tail_sigma = max(0.0, hi - self.median) / self.tail_z


class SustainedDetector:
    """Turns per-sample deviant flags into fire/clear transitions (see module docstring)."""

    def __init__(self, *, min_duration_s: float = 30.0, fire_fraction: float = 0.8,
                 clear_s: float | None = None, min_samples: int = 5) -> None:
        self.min_duration_s = min_duration_s
        self.fire_fraction = fire_fraction
        self.clear_s = min_duration_s if clear_s is None else clear_s
        self.min_samples = min_samples
        self.active = False
        self.start: float | None = None
        self._n = 0
        self._bad = 0
        self._last_bad = 0.0

    def observe(self, t: float, deviant: bool) -> str | None:
        """Feed one sample; returns ``"fire"``, ``"clear"`` or None."""
        if self.active:
            if deviant:
                self._last_bad = t
                return None
            if t - self._last_bad >= self.clear_s:
                self.active = False
                self.start = None
                self._n = self._bad = 0
                return "clear"
            return None
        if self.start is None:
            if not deviant:
                return None
            self.start, self._n, self._bad = t, 0, 0
        self._n += 1
        self._bad += int(deviant)
        if deviant:
            self._last_bad = t
        frac = self._bad / self._n
        if self._n >= self.min_samples and frac < self.fire_fraction:
            self.start = None  # the episode petered out: isolated tail samples
            return None
        if t - self.start >= self.min_duration_s and frac >= self.fire_fraction:
            self.active = True
            return "fire"
        return None


@dataclasses.dataclass(frozen=True)
class BaselineVerdict:
    key: str
    transition: str  # fire | clear
    value: float
    median: float
    scale: float
    z: float
    since: float | None


class BaselineBank:
    """Baselines and detectors for every series whose name is watched."""

    def __init__(self, *, z: float = 3.0, window: int = 3600, warmup: int = 300,
                 min_duration_s: float = 30.0, fire_fraction: float = 0.8,
                 floors: dict[str, tuple[float, float]] | None = None, relearn_s: float = 600.0) -> None:
        self.z = z
        self.relearn_s = relearn_s
        self.window = window
        self.warmup = warmup
        self.min_duration_s = min_duration_s
        self.fire_fraction = fire_fraction
        self.floors = floors or {}
        self.baselines: dict[str, RobustBaseline] = {}
        self.detectors: dict[str, SustainedDetector] = {}

    def _get(self, key: str, name: str) -> tuple[RobustBaseline, SustainedDetector]:
        b = self.baselines.get(key)
        if b is None:
            rel, ab = self.floors.get(name, (0.05, 0.0))
            b = self.baselines[key] = RobustBaseline(window=self.window, warmup=self.warmup,
                                                     rel_floor=rel, abs_floor=ab)
            self.detectors[key] = SustainedDetector(min_duration_s=self.min_duration_s,
                                                    fire_fraction=self.fire_fraction)
        return b, self.detectors[key]

    def observe(self, t: float, key: str, name: str, x: float) -> BaselineVerdict | None:
        """Score ``x`` against its history, then add it; a fire/clear transition or None."""
        b, d = self._get(key, name)
        z = b.score(x)
        deviant = z is not None and z > self.z
        # While an alert is active its samples are not learned (for up to relearn_s), or a
        # long spike would widen its own yardstick and "clear" while still going on.
        if not (deviant and d.active and d.start is not None and t - d.start < self.relearn_s):
            b.add(x)
        if z is None:
            return None
        since = d.start
        tr = d.observe(t, deviant)
        if tr is None:
            return None
        return BaselineVerdict(key, tr, x, b.median, b.scale, z, since)
