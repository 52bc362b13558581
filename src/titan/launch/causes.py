"""Root causes and consequences among a run's worker failures.

When one rank dies, its peers fail a moment later because the collective they were in
lost a member (gloo: "Connection closed by peer"; Titan workers exit
``WORKER_COMM_FAULT`` = 10 for it). Those are consequences of the first failure, not
failures of their own: one SIGKILL of rank 1 is one root cause plus rank 0's exit 10 as a
consequence. Within one attempt, a communication fault is a consequence when the attempt
has a failure that is not one; when every failure of an attempt is a communication fault
(a network that really broke), the first one seen is the root cause.

Cost: one pass over the failures (a handful per attempt).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from titan.exitcodes import ExitCode

__all__ = ["classify_failures", "count_roles", "is_comm_fault", "ROOT_CAUSE", "CONSEQUENCE"]

ROOT_CAUSE = "root_cause"
CONSEQUENCE = "consequence"

#: What a worker reports when a peer, not itself, went away (gloo, NCCL, the TCP store).
_COMM = re.compile(r"connection (closed|reset) by peer|broken pipe|timed out waiting \d+ms for (recv|send)|"
                   r"NCCL (communicator was aborted|error: remote process exited)|socket timeout|"
                   r"remote process exited or there was a network error", re.IGNORECASE)


def is_comm_fault(f: Mapping[str, Any]) -> bool:
    """Is this failure (``worker.failed`` / ``worker.fault`` data) a lost peer, not its own fault?"""
    if f.get("signal"):
        return False  # killed by a signal: something happened to this process itself
    if int(f.get("exit_code") or 0) == int(ExitCode.WORKER_COMM_FAULT):
        return True
    return bool(_COMM.search(str(f.get("error") or "")))


def classify_failures(failures: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``failures`` (``worker.failed`` data, in the order seen) with ``role`` set.

    ``role`` is ``root_cause`` or ``consequence`` (module docstring); a consequence also
    gets ``caused_by`` (the global rank of its attempt's first root cause).
    """
    out = [dict(f) for f in failures]
    by_attempt: dict[Any, list[dict[str, Any]]] = {}
    for f in out:
        by_attempt.setdefault(f.get("attempt"), []).append(f)
    for group in by_attempt.values():
        roots = [f for f in group if not is_comm_fault(f)] or group[:1]
        for f in group:
            if any(f is r for r in roots):
                f["role"] = ROOT_CAUSE
            else:
                f["role"] = CONSEQUENCE
                f["caused_by"] = roots[0].get("global_rank")
    return out


def count_roles(classified: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """(root causes, consequences) of :func:`classify_failures` output."""
    roles = [f.get("role") for f in classified]
    return roles.count(ROOT_CAUSE), roles.count(CONSEQUENCE)
