"""Restart policy, worker side: backoff before rejoining, give up when nothing advances.

torchrun restarts on any exit code, immediately, until ``max_restarts`` is used up. So:

* **Backoff** (:func:`restart_backoff`): a restarted worker sleeps before its
  distributed init — 0 s on the first restart (a transient is usually gone, and RTO
  matters), then ``restart_backoff_s × 2^(attempt-2)`` capped at ``restart_backoff_max_s``.
  The sleep depends only on ``TORCHELASTIC_RESTART_COUNT``, so all ranks sleep alike.
* **Give up** (:func:`check_progress`): rank 0 records the step each attempt resumed
  from in ``<run_dir>/progress.json``. When attempt ``a`` resumes from the same step as
  attempt ``a-K`` (``K = watchdog.giveup_restarts``), K restarts brought no checkpoint
  progress: the worker requests the run-wide abort (``titan.launch.abort``) and raises
  ``TitanAbort(GAVE_UP)``; ``titan run`` ends every node without another restart.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Callable

from titan.errors import TitanAbort
from titan.events import atomic_write_json
from titan.exitcodes import ExitCode

if TYPE_CHECKING:
    from titan.worker.context import WorkerContext

__all__ = ["backoff_for_attempt", "restart_backoff", "check_progress", "read_progress"]


def backoff_for_attempt(attempt: int, base_s: float, max_s: float) -> float:
    """Seconds to wait before restart ``attempt`` (0 for the first run and first restart)."""
    if attempt <= 1:
        return 0.0
    return min(max_s, base_s * 2 ** (attempt - 2))


def restart_backoff(ctx: "WorkerContext", *, sleep: Callable[[float], None] = time.sleep) -> float:
    """Sleep the backoff of ``ctx.attempt`` (emits ``restart.backoff`` when > 0); returns it."""
    w = ctx.settings.watchdog
    d = backoff_for_attempt(ctx.attempt, w.restart_backoff_s, w.restart_backoff_max_s)
    if d > 0:
        ctx.events.emit("restart.backoff", f"attempt {ctx.attempt}: waiting {d:g}s before rejoining",
                        level="warning", data={"attempt": ctx.attempt, "backoff_s": d})
        sleep(d)
    return d


def read_progress(ctx_or_path: Any) -> dict[int, int]:
    """attempt → step resumed from, as recorded so far."""
    path = ctx_or_path.run_dir.path / "progress.json" if hasattr(ctx_or_path, "run_dir") else ctx_or_path
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {int(k): int(v) for k, v in (obj.get("resumed_from") or {}).items()}


def check_progress(ctx: "WorkerContext", resumed_step: int) -> None:
    """Record the resume step of this attempt; give up when K restarts made no progress.

    Cost: one small JSON read (every rank) and one atomic write (rank 0).
    Raises ``TitanAbort(…, ExitCode.GAVE_UP)`` after requesting the run-wide abort.
    """
    k = ctx.settings.watchdog.giveup_restarts
    hist = read_progress(ctx)
    if ctx.rank == 0:
        hist[ctx.attempt] = resumed_step
        atomic_write_json(ctx.run_dir.path / "progress.json",
                          {"resumed_from": {str(a): s for a, s in sorted(hist.items())}})
    before = hist.get(ctx.attempt - k)
    if ctx.attempt >= k and before is not None and before == resumed_step:
        reason = (f"gave up: {k} restarts without checkpoint progress (attempt {ctx.attempt - k} and attempt "
                  f"{ctx.attempt} both resumed from step {resumed_step})")
        ctx.events.emit("restart.gave_up", reason, level="critical", step=resumed_step,
                        data={"attempt": ctx.attempt, "giveup_restarts": k, "resumed_from": resumed_step})
        if ctx.rank == 0:
            from titan.launch.abort import request_abort

            request_abort(ctx.run_dir, reason, exit_code=ExitCode.GAVE_UP, by=f"rank {ctx.rank}")
        raise TitanAbort(reason, int(ExitCode.GAVE_UP))
