"""Titan: keep large distributed training alive through transient faults.

The in-process library (``titan.guard``, ``titan.checkpoint``, ``titan.worker``) is
imported by training scripts; the CLI (``titan VERB``) launches, watches, drills and
reports. Everything meets in one run directory (``titan.events``).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
