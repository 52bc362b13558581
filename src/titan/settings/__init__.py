"""The settings layer: one validated dataclass per component, one precedence.

defaults < config file (``--config`` / ``TITAN_CONFIG``, TOML) < ``TITAN_*`` environment
< CLI flags. Sections register themselves on import; import them all here.
"""

from __future__ import annotations

from titan.settings.core import (
    SECTIONS, Settings, coerce, env_var_table, load_settings, register_check, register_section,
    require, settings_from_json,
)

# Sections (each module registers its dataclass). Keep this list sorted.
from titan.settings.agent import AgentConfig  # noqa: E402
from titan.settings.checkpoint import CheckpointConfig  # noqa: E402
from titan.settings.dist import DistConfig  # noqa: E402
from titan.settings.events import EventsConfig  # noqa: E402
from titan.settings.guard import GuardConfig  # noqa: E402
from titan.settings.run import RunConfig  # noqa: E402
from titan.settings.sdc import SDCConfig  # noqa: E402
from titan.settings.tracing import TracingConfig  # noqa: E402
from titan.settings.triage import TriageConfig  # noqa: E402
from titan.settings.warm import WarmConfig  # noqa: E402
from titan.settings.watchdog import WatchdogConfig  # noqa: E402

__all__ = [
    "AgentConfig", "CheckpointConfig", "DistConfig", "EventsConfig", "GuardConfig", "RunConfig", "SDCConfig", "SECTIONS", "TracingConfig", "TriageConfig", "WarmConfig", "Settings", "coerce", "env_var_table",
    "load_settings", "register_check", "register_section", "require", "settings_from_json",
]
