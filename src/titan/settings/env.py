"""Environment variable names, all in one place (listed in ``docs/settings.md``).

Settings fields map to ``TITAN_<SECTION>_<FIELD>`` (upper case) unless a field names its
own variable in its metadata (``env=``). The variables below are also how ``titan run``
hands context to its workers.
"""

from __future__ import annotations

__all__ = [
    "PREFIX", "TITAN_CONFIG", "TITAN_RUN_DIR", "TITAN_RUN_ID", "TITAN_NODE_ID", "TITAN_DEBUG",
    "TITAN_SETTINGS_JSON", "TITAN_CHAOS_PLAN", "TITAN_CHAOS_SKIP_STEPS", "TITAN_CHAOS_NOOP", "TITAN_CKPT_CRASH_AT", "TITAN_RDZV_SECRET", "TITAN_RDZV_SECRET_FILE",
    "TITAN_LISTEN_ADDR", "TITAN_STORE_PER_ROUND", "TITAN_AGENT_PARENT_PID", "TITAN_WARM_DIR", "TITAN_SPAWN",
    "TITAN_FINAL_STATE",
    "TITAN_STORAGE_VIEW", "TITAN_REPLICA_ENDPOINT", "TITAN_REPLICA_KEY", "TITAN_REPLICA_EXPORT",
    "TITAN_STORAGE_VIEW", "TITAN_REPLICA_ENDPOINT", "TITAN_REPLICA_KEY", "TITAN_REPLICA_EXPORT", "TITAN_ATTEMPT",
    "PROCESS_VARS", "field_env_name",
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
#: ``1``: every injector writes its ``inject.*`` event and does nothing (the faults are
#: switched off) — proves that a drill whose faults did not bite fails ("no measurable effect").
TITAN_CHAOS_NOOP = "TITAN_CHAOS_NOOP"

#: Checkpoint crash injection: ``<point>[@<rank>][#<attempt>]`` SIGKILLs the process at that save
#: protocol boundary (``titan.checkpoint.inject``; tests and drills only).
TITAN_CKPT_CRASH_AT = "TITAN_CKPT_CRASH_AT"

#: The job secret itself (at least 16 bytes; ``hex:<digits>`` is hex-decoded). Every node of a
#: multi-node run needs the same one (docs/security.md); never handed to the workers.
TITAN_RDZV_SECRET = "TITAN_RDZV_SECRET"
#: Path of a file holding the job secret (same as ``titan run --rdzv-secret-file``).
TITAN_RDZV_SECRET_FILE = "TITAN_RDZV_SECRET_FILE"
#: The address this node's Titan sockets listen on, set by ``titan run`` for its node agent
#: (the UDP probe binds it); loopback unless ``--local-addr`` or the endpoint says otherwise.
TITAN_LISTEN_ADDR = "TITAN_LISTEN_ADDR"
#: Set to ``1`` by ``titan run`` when every rendezvous round gets a fresh worker store (the
#: workers then add no restart-count prefix to it; ``titan.worker.dist``).
TITAN_STORE_PER_ROUND = "TITAN_STORE_PER_ROUND"
#: The pid of the ``titan run`` that started this node agent: the agent stops when that
#: process is gone (``titan.monitor.parent``), so it never outlives a SIGKILLed launcher.
TITAN_AGENT_PARENT_PID = "TITAN_AGENT_PARENT_PID"
#: The private folder of this node's zygote (``titan.warm``), set by ``titan run`` for the
#: worker stubs that torchrun starts: its socket, state file and log.
TITAN_WARM_DIR = "TITAN_WARM_DIR"
#: How a worker process was started, set for it by ``titan.warm``: ``warm`` (forked by the
#: zygote) or ``cold: <why>`` (torchrun's spawn: Python + imports); ``worker.started`` says it.
TITAN_SPAWN = "TITAN_SPAWN"

#: Set by ``titan drill``: where ``Checkpointer.close()`` writes a digest of the final state
#: (``<path>.rank<r>.json``), so a drill compares any script's end state with a clean run's.
TITAN_FINAL_STATE = "TITAN_FINAL_STATE"
#: The storage probe of this rendezvous round (JSON: path, members, domains), set by ``titan run``
#: for its workers: which nodes share the checkpoint folder (``titan.checkpoint.domains``).
TITAN_STORAGE_VIEW = "TITAN_STORAGE_VIEW"
#: ``host:port`` of this node's replica server (run by ``titan run``; ``titan.replica``).
TITAN_REPLICA_ENDPOINT = "TITAN_REPLICA_ENDPOINT"
#: The replication key, hex: derived from the job secret, it authenticates replica traffic only.
TITAN_REPLICA_KEY = "TITAN_REPLICA_KEY"
#: The checkpoint folder this node's replica server exports read-only to the other nodes.
TITAN_REPLICA_EXPORT = "TITAN_REPLICA_EXPORT"
#: The job-wide attempt of this rendezvous round, agreed by the nodes (``titan.launch.cluster``):
#: a replacement node's agent counts its restarts from 0, its workers join the survivors' attempt.
TITAN_ATTEMPT = "TITAN_ATTEMPT"

#: Variables that are context, not settings fields (not reported as unknown).
PROCESS_VARS = frozenset({
    TITAN_CKPT_CRASH_AT,
    TITAN_CONFIG, TITAN_RUN_DIR, TITAN_RUN_ID, TITAN_DEBUG, TITAN_SETTINGS_JSON, TITAN_CHAOS_PLAN,
    TITAN_CHAOS_SKIP_STEPS, TITAN_CHAOS_NOOP, TITAN_FINAL_STATE,
    TITAN_NODE_ID, TITAN_RDZV_SECRET, TITAN_RDZV_SECRET_FILE, TITAN_LISTEN_ADDR, TITAN_STORE_PER_ROUND,
    TITAN_AGENT_PARENT_PID, TITAN_WARM_DIR, TITAN_SPAWN,
    TITAN_STORAGE_VIEW, TITAN_REPLICA_ENDPOINT, TITAN_REPLICA_KEY, TITAN_REPLICA_EXPORT,
    TITAN_ATTEMPT,
})


def field_env_name(section: str, name: str) -> str:
    """The default environment variable of a settings field."""
    return f"{PREFIX}{section.upper()}_{name.upper()}"
