"""The abort path: any Titan component asks ``titan run`` to stop the job *without* restart.

torchrun restarts on any non-zero exit and never gives up early, so a decision to stop
(a worker that exits ``ExitCode.GAVE_UP``, the hang watchdog, a policy that sees no
progress) is carried by one small file in the run directory::

    <run_dir>/abort.<node_id>.json   {"exit_code": 3, "reason": "...", "by": "...", "t": ...}
    <run_dir>/abort.json             the same, for every node of the run

``titan run`` checks for it on every monitor tick of torchelastic's agent (every
``run.monitor_interval_s``, 0.1 s by default) and before every restart. When it is
there, the agent stops its workers (SIGTERM, then SIGKILL after the shutdown timeout),
does not restart, and ``titan run`` exits with the file's ``exit_code``. Writing the
file is atomic (temporary name + ``os.replace``), so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from titan.events.rundir import RunDir, atomic_write_json
from titan.exitcodes import ExitCode

__all__ = ["AbortRequest", "abort_file", "request_abort", "read_abort", "ABORT_CODES"]

#: Exit codes an abort may carry: they all mean "stop, do not restart".
ABORT_CODES = frozenset({ExitCode.GAVE_UP, ExitCode.PREEMPTED, ExitCode.JOB_FAILED, ExitCode.INTERRUPTED})


class AbortRequest(dict):
    """The content of an abort file (``exit_code``, ``reason``, ``by``, ``t``, ``path``)."""

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode(int(self.get("exit_code", ExitCode.GAVE_UP)))

    @property
    def reason(self) -> str:
        return str(self.get("reason", ""))


def abort_file(run_dir: RunDir | str | os.PathLike[str], node: str | None = None) -> Path:
    """Path of the abort file for ``node`` (``None``: the run-wide one)."""
    rd = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    return rd.path / (f"abort.{node}.json" if node else "abort.json")


def request_abort(
    run_dir: RunDir | str | os.PathLike[str],
    reason: str,
    *,
    exit_code: int = ExitCode.GAVE_UP,
    node: str | None = None,
    by: str = "",
) -> Path:
    """Ask the ``titan run`` of ``node`` (or of every node) to stop without restart.

    Cost: one small atomic file write. Safe from any process or thread (workers, the
    watchdog, a CLI). The launcher honours it within one monitor interval.
    Raises ``ValueError`` for an exit code that does not mean "stop".
    """
    code = ExitCode(int(exit_code))
    if code not in ABORT_CODES:
        raise ValueError(f"an abort must carry one of {sorted(int(c) for c in ABORT_CODES)}, not {int(code)}")
    path = abort_file(run_dir, node)
    atomic_write_json(path, {"exit_code": int(code), "reason": reason, "by": by or f"pid {os.getpid()}",
                             "t": time.time(), "node": node})
    return path


def read_abort(run_dir: RunDir | str | os.PathLike[str], node: str) -> AbortRequest | None:
    """The pending abort for ``node`` (its own file first, then the run-wide one), or None."""
    for path in (abort_file(run_dir, node), abort_file(run_dir, None)):
        try:
            obj: Any = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, json.JSONDecodeError):
            obj = {"exit_code": int(ExitCode.GAVE_UP), "reason": f"unreadable abort file {path.name}"}
        if not isinstance(obj, dict):
            obj = {"exit_code": int(ExitCode.GAVE_UP), "reason": f"malformed abort file {path.name}"}
        try:
            code = ExitCode(int(obj.get("exit_code", ExitCode.GAVE_UP)))
        except (TypeError, ValueError):
            code = ExitCode.GAVE_UP
        obj["exit_code"] = int(code if code in ABORT_CODES else ExitCode.GAVE_UP)
        req = AbortRequest(obj)
        req["path"] = str(path)
        return req
    return None
