"""The hang watchdog (outside the workers) and straggler detection.

``Watchdog`` runs in ``titan run`` (one per node). The restart decision (backoff, give-up)
is the launcher's: ``titan.launch.restarts``. Never imports torch.
"""

from __future__ import annotations

from titan.watchdog.core import Watchdog, watchdog_events_file
from titan.watchdog.culprit import RankView, Verdict, identify
from titan.watchdog.straggler import StragglerDetector
from titan.watchdog.timeouts import PhaseTimeouts, percentile

__all__ = [
    "PhaseTimeouts", "RankView", "StragglerDetector", "Verdict", "Watchdog", "identify", "percentile",
    "watchdog_events_file",
]
