"""``titan preflight``: prove every node runs the same stack and healthy hardware."""

from __future__ import annotations

from titan.preflight.analyze import analyze
from titan.preflight.compare import Difference, compare_fingerprints
from titan.preflight.fingerprint import DEFAULT_PACKAGES, collect_fingerprint, flatten

__all__ = ["DEFAULT_PACKAGES", "Difference", "analyze", "collect_fingerprint", "compare_fingerprints", "flatten"]
