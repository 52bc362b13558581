"""Launcher events: torchelastic's structured event stream plus what it records too late.

torchelastic emits structured events (``torchelastic.worker.status.START`` per worker
with its pid at every (re)start, ``SUCCEEDED``/``FAILED`` for the agent, and per-worker
states only once the whole job ends) to a logging handler chosen by name
(``--event-log-handler``). ``titan run`` registers one handler, ``"titan"``, that turns
each of them into a ``launcher.elastic`` event in ``launcher.<node>.jsonl``.

torchelastic logs its handler's ``logging.Logger`` once per process and keeps it, so the
handler is a single module-level object that forwards to the *current* recorder; an
in-process caller (the tests) may launch many jobs one after another.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from typing import Any, Mapping

from titan.events import EventWriter, RunDir

__all__ = ["HANDLER_NAME", "LauncherRecorder", "install_elastic_handler", "signal_name"]

log = logging.getLogger(__name__)

#: The name passed to torchrun's ``--event-log-handler``.
HANDLER_NAME = "titan"


def signal_name(exit_code: int | None) -> str | None:
    """``SIGKILL`` for -9 (how torchelastic reports a worker killed by a signal), else None."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"SIG{-exit_code}"


class LauncherRecorder:
    """Writes the launcher's events for one node of one run (thread-safe)."""

    def __init__(self, run_dir: RunDir, node: str, *, attempt: int = 0) -> None:
        self.run_dir = run_dir
        self.node = node
        self.writer = EventWriter(run_dir.launcher_file(node), run=run_dir.run_id, node=node,
                                  attempt=attempt)
        self.lock = threading.Lock()
        self.worker_pids: dict[int, dict[int, int]] = {}  # attempt -> global rank -> pid
        self.failures: list[dict[str, Any]] = []
        self.restarts = 0

    def emit(self, kind: str, msg: str = "", *, level: str = "info", data: Mapping[str, Any] | None = None) -> None:
        self.writer.emit(kind, msg, level=level, data=dict(data or {}))

    def set_attempt(self, attempt: int) -> None:
        self.writer.set_context(attempt=attempt)

    def elastic(self, ev_name: str, source: str, metadata: Mapping[str, Any]) -> None:
        """Record one torchelastic structured event as ``launcher.elastic``."""
        md = dict(metadata)
        try:
            inner = json.loads(md.pop("metadata", None) or "{}")
        except (TypeError, json.JSONDecodeError):
            inner = {}
        # torchelastic wraps per-worker values in 1-tuples (serialised as lists).
        flat = {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in inner.items()}
        state = md.get("state")
        data: dict[str, Any] = {"name": ev_name, "source": source, "state": state,
                                "global_rank": md.get("global_rank"), "agent_restarts": md.get("agent_restarts"),
                                "group_rank": md.get("group_rank"), "hostname": md.get("hostname"),
                                "rdzv_backend": md.get("rdzv_backend"), **flat}
        if md.get("worker_id") not in (None, "None"):
            data["worker_id"] = md.get("worker_id")
        if md.get("raw_error"):
            data["raw_error"] = md["raw_error"]
        if md.get("duration_ms") is not None:
            data["duration_ms"] = md["duration_ms"]
        if state == "START" and md.get("worker_id") not in (None, "None"):
            try:
                pid = int(str(md["worker_id"]))
                attempt = int(md.get("agent_restarts") or 0)
                with self.lock:
                    self.worker_pids.setdefault(attempt, {})[int(md["global_rank"])] = pid
                data["pid"] = pid
            except (TypeError, ValueError):
                pass
        level = "error" if state == "FAILED" else "info"
        self.emit("launcher.elastic", f"torchelastic {source.lower()} {state}" +
                  (f" rank {md.get('global_rank')}" if md.get("global_rank") is not None else ""),
                  level=level, data={k: v for k, v in data.items() if v is not None})

    def close(self) -> None:
        self.writer.close()


class _ElasticHandler(logging.Handler):
    """The one logging handler torchelastic sends structured events to."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.current: LauncherRecorder | None = None

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D102 - logging API
        rec = self.current
        if rec is None:
            return
        try:
            obj = json.loads(record.getMessage())
            rec.elastic(str(obj.get("name", "")), str(obj.get("source", "")), obj.get("metadata") or {})
        except Exception:  # a recorder must never break the agent
            log.debug("could not record a torchelastic event", exc_info=True)


_HANDLER = _ElasticHandler()


def install_elastic_handler(recorder: LauncherRecorder | None) -> None:
    """Register the ``"titan"`` handler with torchelastic and point it at ``recorder``."""
    from torch.distributed.elastic.events import handlers

    handlers._log_handlers[HANDLER_NAME] = _HANDLER
    _HANDLER.current = recorder
    # torchelastic sets its event logger's level from $LOGLEVEL; events are logged at INFO
    # and must reach the run directory whatever the console verbosity is.
    from torch.distributed.elastic import events

    events._get_or_create_logger(HANDLER_NAME).setLevel(logging.INFO)
