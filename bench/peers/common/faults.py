"""In-process faults of the shared schedule, the same for every system.

``$PEERS_FAULTS`` is a JSON list; each entry fires **once per job** (a marker file in
``$PEERS_LOG_DIR``), so a step recomputed after a restart is clean, as a transient would be:

* ``{"kind": "nan", "rank": r, "step": s}`` — NaN in rank r's local gradient of the first
  parameter at step s, through a tensor hook, before DDP's all-reduce (as Titan's
  ``nan_grad`` drill does);
* ``{"kind": "slow", "rank": r, "step": s, "steps": k, "factor": f}`` — rank r sleeps
  ``(f - 1) x`` its own median step time at the start of steps s..s+k-1 (as Titan's ``slow``).

Kills and hangs come from outside (the harness signals the process), not from here.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any, Callable

import torch

__all__ = ["Faults"]


class Faults:
    """The faults of one rank; every method is a no-op when none is planned for it."""

    def __init__(self, rank: int, plan: list[dict[str, Any]], marker_dir: str | None,
                 announce: Callable[[str, int], None] | None = None) -> None:
        self.rank = rank
        self.announce = announce
        self.plan = [f for f in plan if f.get("rank") in (None, rank)]
        self.marker_dir = marker_dir
        self._step = 0
        self._nan_now = False
        self._times: list[float] = []
        self._t_begin: float | None = None

    @classmethod
    def from_env(cls, rank: int, model: torch.nn.Module,
                 announce: Callable[[str, int], None] | None = None) -> "Faults":
        """Read ``$PEERS_FAULTS`` and attach the gradient hook to ``model`` (unwrapped).

        ``announce(kind, step)`` is called when a fault fires (a system that is told about
        deliberate faults, as Titan's drills tell it, gets it here)."""
        plan = json.loads(os.environ.get("PEERS_FAULTS", "[]") or "[]")
        self = cls(rank, plan, os.environ.get("PEERS_LOG_DIR"), announce)
        if any(f["kind"] == "nan" for f in self.plan):
            first = next(iter(model.parameters()))
            first.register_hook(self._grad_hook)
        return self

    def _fire_once(self, i: int) -> bool:
        if self.marker_dir is None:
            return True
        path = os.path.join(self.marker_dir, f"fired.{i}.{self.plan[i]['kind']}.r{self.rank}")
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        with open(path, "w") as f:
            json.dump({"t": time.time(), "pid": os.getpid(), "step": self._step}, f)
        if self.announce is not None:
            self.announce(self.plan[i]["kind"], self._step)
        return True

    def _grad_hook(self, grad: torch.Tensor) -> torch.Tensor:
        if self._nan_now:
            self._nan_now = False
            return torch.full_like(grad, float("nan"))
        return grad

    def begin_step(self, step: int) -> None:
        """Call at the start of every optimizer step (before the forward pass)."""
        now = time.perf_counter()
        if self._t_begin is not None:
            self._times.append(now - self._t_begin)
            del self._times[:-50]
        self._t_begin = now
        self._step = step
        for i, f in enumerate(self.plan):
            if f["kind"] == "nan" and step == f["step"] and self._fire_once(i):
                self._nan_now = True
            elif f["kind"] == "slow" and f["step"] <= step < f["step"] + f.get("steps", 1):
                if step == f["step"] and not self._fire_once(i):
                    f["kind"] = "slow.done"  # fired in an earlier process of this job
                    continue
                med = statistics.median(self._times) if self._times else 0.05
                time.sleep(max(0.0, (float(f.get("factor", 3.0)) - 1.0) * med))
                self._t_begin = time.perf_counter()  # the sleep is not part of the learned step time
