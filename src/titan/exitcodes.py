"""Exit codes of every ``titan`` command and of Titan-managed workers.

One ``IntEnum`` for the whole tool (listed in ``titan --help``). Workers use the
``WORKER_*`` codes to tell ``titan run`` why they stopped: torchrun restarts on any
non-zero exit, so codes that must *not* be restarted are acted on by ``titan run``
itself (see ``docs/failure-model.md``).
"""

from __future__ import annotations

import enum
from typing import Iterable

__all__ = ["ExitCode", "describe_exit_codes"]


class ExitCode(enum.IntEnum):
    """Process exit statuses, shared by the CLI and the workers it launches."""

    SUCCEEDED = 0
    JOB_FAILED = 1
    USER_ERROR = 2
    GAVE_UP = 3
    DIAGNOSED = 4
    UNDIAGNOSED = 5
    MISMATCH = 6
    SELFTEST_FAILED = 7
    DRILL_FAILED = 8
    PREEMPTED = 9
    WORKER_COMM_FAULT = 10
    WORKER_CUDA_FAULT = 11
    INTERRUPTED = 130

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS: dict[ExitCode, str] = {
    ExitCode.SUCCEEDED: "succeeded (preflight: all consistent and healthy)",
    ExitCode.JOB_FAILED: "the job failed (restarts used up, or a command could not run)",
    ExitCode.USER_ERROR: "user error: bad flag, file or setting; nothing was started",
    ExitCode.GAVE_UP: "gave up: no progress after restarts, or the guard stopped the job",
    ExitCode.DIAGNOSED: "triage: failure diagnosed",
    ExitCode.UNDIAGNOSED: "triage: no diagnosis",
    ExitCode.MISMATCH: "preflight: nodes differ in their software stack",
    ExitCode.SELFTEST_FAILED: "preflight: a hardware self-test failed",
    ExitCode.DRILL_FAILED: "drill: at least one expectation failed",
    ExitCode.PREEMPTED: "worker saved and stopped on SIGTERM (preemption; the save is on disk); not a failure",
    ExitCode.WORKER_COMM_FAULT: "worker: communication/store error (timeout, peer closed); restartable",
    ExitCode.WORKER_CUDA_FAULT: "worker: CUDA error (sticky ones need a new process); restartable",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C, or SIGTERM without a save on disk)",
}


def describe_exit_codes(codes: Iterable[ExitCode] | None = None) -> str:
    """Return the table of exit codes (all, or ``codes`` in order) as text for ``--help``."""
    return "\n".join(f"  {int(c):>3}  {c.meaning}" for c in (ExitCode if codes is None else codes))
