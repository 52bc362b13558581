"""Peer comparison: a node whose metric departs from the other nodes of the same job.

A node's own baseline follows a slow drift (its history drifts with it); its peers do
not. Every ``every_s`` each agent publishes the mean of each watched metric over the
period (averaged over labels, e.g. over its GPUs) to ``<run>/metrics/peer.<node>.json``
and reads the others'. With at least ``min_nodes`` fresh nodes, each node's value is
scored against the median and MAD of the *other* nodes (leave-one-out, so the outlier
does not widen its own yardstick); a score beyond ``z`` sustained for
``min_duration_s`` names the node. Cost: one small JSON write and N reads per period.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Mapping

from titan.events import atomic_write_json
from titan.monitor.base import parse_key
from titan.monitor.baseline import SustainedDetector

__all__ = ["peer_scores", "PeerComparator", "PeerExchange", "PeerVerdict"]


def peer_scores(values: Mapping[str, float], *, rel_floor: float = 0.05, abs_floor: float = 0.0,
                min_nodes: int = 3) -> dict[str, float]:
    """Robust z-score of each node against the others (empty below ``min_nodes``)."""
    if len(values) < min_nodes:
        return {}
    out = {}
    for node, x in values.items():
        others = [v for n, v in values.items() if n != node]
        med = statistics.median(others)
        mad = statistics.median(abs(v - med) for v in others)
        scale = max(1.4826 * mad, rel_floor * abs(med), abs_floor, 1e-12)
        out[node] = (x - med) / scale
    return out


@dataclasses.dataclass(frozen=True)
class PeerVerdict:
    metric: str
    node: str
    transition: str  # fire | clear
    value: float
    peers_median: float
    z: float
    nodes: int


class PeerComparator:
    """Sustained peer outliers per (metric, node); both directions count."""

    def __init__(self, *, z: float = 3.0, min_nodes: int = 3, min_duration_s: float = 120.0,
                 floors: Mapping[str, tuple[float, float]] | None = None) -> None:
        self.z = z
        self.min_nodes = min_nodes
        self.min_duration_s = min_duration_s
        self.floors = dict(floors or {})
        self._det: dict[tuple[str, str], SustainedDetector] = {}

    def evaluate(self, now: float, table: Mapping[str, Mapping[str, float]]) -> list[PeerVerdict]:
        """``table`` maps metric → node → value; returns fire/clear transitions."""
        out = []
        for metric, values in table.items():
            rel, ab = self.floors.get(metric, (0.05, 0.0))
            scores = peer_scores(values, rel_floor=rel, abs_floor=ab, min_nodes=self.min_nodes)
            for node, z in scores.items():
                det = self._det.setdefault((metric, node), SustainedDetector(
                    min_duration_s=self.min_duration_s, fire_fraction=0.8, min_samples=3))
                tr = det.observe(now, abs(z) > self.z)
                if tr is not None:
                    others = [v for n, v in values.items() if n != node]
                    out.append(PeerVerdict(metric, node, tr, values[node], statistics.median(others), z, len(values)))
        return out


class PeerExchange:
    """Publishes this node's period means and reads the other agents' (run directory)."""

    def __init__(self, metrics_dir: str | Path, node: str, *, names: tuple[str, ...], stale_s: float = 180.0) -> None:
        self.dir = Path(metrics_dir)
        self.node = node
        self.names = set(names)
        self.stale_s = stale_s
        self._sums: dict[str, float] = collections.defaultdict(float)
        self._counts: dict[str, int] = collections.defaultdict(int)

    def add(self, metrics: Mapping[str, float]) -> None:
        """Accumulate one tick's metrics (only the watched names)."""
        for key, v in metrics.items():
            name = key.split("{", 1)[0]
            if name in self.names:
                self._sums[name] += v
                self._counts[name] += 1

    def publish(self, now: float | None = None) -> dict[str, float]:
        means = {n: self._sums[n] / self._counts[n] for n in self._sums if self._counts[n]}
        self._sums.clear()
        self._counts.clear()
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.dir / f"peer.{self.node}.json",
                          {"node": self.node, "t": time.time() if now is None else now, "means": means})
        return means

    def table(self, now: float | None = None) -> dict[str, dict[str, float]]:
        """metric → node → period mean, over every fresh ``peer.*.json`` (this node's included)."""
        now = time.time() if now is None else now
        table: dict[str, dict[str, float]] = collections.defaultdict(dict)
        for f in self.dir.glob("peer.*.json"):
            try:
                obj = json.loads(f.read_text())
                if now - float(obj["t"]) > self.stale_s:
                    continue
                for name, v in obj["means"].items():
                    parse_key(name)
                    table[name][str(obj["node"])] = float(v)
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return dict(table)
