"""Environment variable names, all in one place (listed in ``docs/settings.md``).

Settings fields map to ``TITAN_<SECTION>_<FIELD>`` (upper case) unless a field names its
own variable in its metadata (``env=``). The variables below are also how ``titan run``
hands context to its workers.
"""

from __future__ import annotations

__all__ = [
    "PREFIX", "TITAN_CONFIG", "TITAN_RUN_DIR", "TITAN_RUN_ID", "TITAN_NODE_ID", "TITAN_DEBUG",
    "TITAN_SETTINGS_JSON", "TITAN_CHAOS_PLAN", "TITAN_CHAOS_SKIP_STEPS", "TITAN_CKPT_CRASH_AT", "PROCESS_VARS", "field_env_name",
]

PREFIX = "TITAN_"
#: Path of a TOML settings file (same as ``--config``).
TITAN_CONFIG = "TITAN_CONFIG"
#: The run directory, set by ``titan run`` for its workers.
TITAN_RUN_DIR = "TITAN_RUN_DIR"
#: The run id (the run directory's name), set by ``titan run``.
TITAN_RUN_ID = "TITAN_RUN_ID"
#: This node's id in event file names (default: the hostname).
TITAN_NODE_ID = "TITAN_NODE_ID"
#: Show tracebacks for user errors (same as ``--debug``).
TITAN_DEBUG = "TITAN_DEBUG"
#: The resolved settings as JSON, handed by ``titan run`` to its workers so that every
#: rank uses exactly the launcher's settings.
TITAN_SETTINGS_JSON = "TITAN_SETTINGS_JSON"
#: Path of a fault plan for in-process injection (``titan.chaos``), set by drills.
TITAN_CHAOS_PLAN = "TITAN_CHAOS_PLAN"
#: Reference runs of a drill: comma-separated steps whose update is skipped (as the guard would).
TITAN_CHAOS_SKIP_STEPS = "TITAN_CHAOS_SKIP_STEPS"

#: Checkpoint crash injection: ``<point>[@<rank>][#<attempt>]`` SIGKILLs the process at that save
#: protocol boundary (``titan.checkpoint.inject``; tests and drills only).
TITAN_CKPT_CRASH_AT = "TITAN_CKPT_CRASH_AT"

#: Variables that are context, not settings fields (not reported as unknown).
PROCESS_VARS = frozenset({
    TITAN_CKPT_CRASH_AT,
    TITAN_CONFIG, TITAN_RUN_DIR, TITAN_RUN_ID, TITAN_DEBUG, TITAN_SETTINGS_JSON, TITAN_CHAOS_PLAN,
    TITAN_CHAOS_SKIP_STEPS,
    TITAN_NODE_ID,
})


def field_env_name(section: str, name: str) -> str:
    """The default environment variable of a settings field."""
    return f"{PREFIX}{section.upper()}_{name.upper()}"
