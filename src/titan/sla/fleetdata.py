"""Published fleet reliability figures that ``titan plan`` uses as defaults, with sources.

Each entry is an observed *job interruption rate* at a stated job size. ``titan plan``
scales it to another size assuming independent failures per GPU (rate ∝ GPUs), which is
the model both sources use when they extrapolate.
"""

from __future__ import annotations

import dataclasses

__all__ = ["FleetData", "FLEETS", "DEFAULT_FLEET", "fleet"]

HOUR_S = 3600.0
DAY_S = 86400.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class FleetData:
    """One published observation: ``interruptions`` in ``period_s`` for a job of ``gpus``."""

    name: str
    gpus: int
    interruptions: float
    period_s: float
    source: str
    note: str = ""

    @property
    def job_mtbi_s(self) -> float:
        """Mean time between interruptions of the observed job (seconds)."""
        return self.period_s / self.interruptions

    @property
    def rate_per_gpu_hour(self) -> float:
        """Interruptions per GPU-hour (the observed job rate divided by its GPU count)."""
        return self.interruptions / (self.period_s / HOUR_S) / self.gpus


_LLAMA3 = ("Llama Team, AI @ Meta, 'The Llama 3 Herd of Models', arXiv:2407.21783 (2024), "
           "§3.3.4 Reliability and Operational Challenges, Table 5")
FLEETS: dict[str, FleetData] = {
    "llama3": FleetData(
        name="llama3", gpus=16_384, interruptions=466, period_s=54 * DAY_S, source=_LLAMA3,
        note="all 466 job interruptions in a 54-day pre-training snapshot (47 planned, 419 unexpected); "
             "'> 90 % effective training time'"),
    "llama3-unexpected": FleetData(
        name="llama3-unexpected", gpus=16_384, interruptions=419, period_s=54 * DAY_S, source=_LLAMA3,
        note="the 419 unexpected interruptions only (hardware ~78 %; 58.7 % GPU-related)"),
    "meta-rsc": FleetData(
        name="meta-rsc", gpus=1_024, interruptions=1, period_s=7.9 * HOUR_S,
        source="A. Kokolis et al., 'Revisiting Reliability in Large-Scale Machine Learning Research "
               "Clusters', arXiv:2410.21680 (2024): mean time to failure 7.9 h for 1,024-GPU jobs",
        note="Meta research clusters (RSC-1/RSC-2), 11 months of jobs"),
}
DEFAULT_FLEET = "llama3"


def fleet(name: str) -> FleetData:
    """Look up a fleet by name; ``KeyError`` lists the known names."""
    try:
        return FLEETS[name]
    except KeyError:
        raise KeyError(f"unknown fleet {name!r}; known: {', '.join(sorted(FLEETS))}") from None
