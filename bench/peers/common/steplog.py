"""The step log: one JSON line per event of one process, read by the harness.

Every system's script writes the same records, so RTO, RPO and goodput are measured the
same way for all of them: ``mark`` (``start`` before ``import torch``, ``ready`` when the
process group is formed, ``restored`` with the step resumed from) and ``step`` (start and end
wall time, loss). One ``write(2)`` per line on an ``O_APPEND`` descriptor: a SIGKILL loses
nothing already written. Cost: one system call per step.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

__all__ = ["StepLog"]

ENV_DIR = "PEERS_LOG_DIR"


class StepLog:
    """Records of one process in ``$PEERS_LOG_DIR/<system>.pid<pid>.jsonl`` (no-op without it)."""

    def __init__(self, system: str, t0: float | None = None) -> None:
        self.system = system
        self.rank: int | None = None
        self._fd: int | None = None
        d = os.environ.get(ENV_DIR)
        import multiprocessing  # a helper process a peer spawns (it re-imports the script) is not a worker

        if d and multiprocessing.parent_process() is None:
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, f"{system}.pid{os.getpid()}.jsonl")
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.mark("start", t=t0 if t0 is not None else time.time())

    def _write(self, rec: dict[str, Any]) -> None:
        if self._fd is None:
            return
        rec.setdefault("t", time.time())
        rec["pid"] = os.getpid()
        rec["rank"] = self.rank
        rec["restart"] = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        os.write(self._fd, (json.dumps(rec, allow_nan=False, default=str) + "\n").encode())

    def mark(self, what: str, **data: Any) -> None:
        """A lifecycle mark: ``start``, ``ready`` (rank known), ``restored`` (``step=``), ``done``."""
        if "rank" in data:
            self.rank = data.pop("rank")
        self._write({"kind": "mark", "what": what, **data})

    def step(self, step: int, *, t_start: float, loss: float, **data: Any) -> None:
        """One completed optimizer step (``t_start``: wall time when the step began)."""
        finite = math.isfinite(loss)
        self._write({"kind": "step", "step": int(step), "t_start": t_start,
                     "loss": loss if finite else None, "finite": finite, **data})
