"""Node ledger: strikes per node (hangs, crashes, guard transients, stragglers) and exclusion."""

from __future__ import annotations

from pathlib import Path

from titan.ledger.store import KINDS, Ledger, NodeRecord, Strike, default_ledger_path

__all__ = ["KINDS", "Ledger", "NodeRecord", "Strike", "default_ledger_path", "ledger_from_settings",
           "ledger_path"]


def ledger_path(settings) -> Path:  # noqa: ANN001 - titan.settings.Settings
    """Where the configured ledger lives (``watchdog.ledger_path`` or the default); creates nothing."""
    return Path(settings.watchdog.ledger_path) if settings.watchdog.ledger_path else default_ledger_path()


def ledger_from_settings(settings) -> Ledger:  # noqa: ANN001 - titan.settings.Settings
    """The ledger configured by ``watchdog.ledger_path`` / ``strike_limit`` / ``strike_window_s``."""
    w = settings.watchdog
    return Ledger(w.ledger_path or None, limit=w.strike_limit, window_s=w.strike_window_s)
