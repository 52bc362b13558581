"""The ``titan`` command line (top of the house: imports every capability)."""

from __future__ import annotations

from titan.cli.environment import Environment
from titan.cli.main import main, run

__all__ = ["Environment", "main", "run"]
