"""A synthetic run builder: event streams with known answers, for tests and demos.

Writes the same files a real run writes (``events/*.jsonl``, ``launcher.<node>.jsonl``,
``run.json``) with timestamps the caller controls, so accounting has exact expected values.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from titan.events import Event, RunDir, atomic_write_json

__all__ = ["SynthRun"]


class SynthRun:
    """Build a run second by second. Every method advances the clock ``self.t``."""

    def __init__(self, *, world: int = 2, t0: float = 1_700_000_000.0, node: str = "n0", run: str = "synth",
                 seed: int = 0) -> None:
        self.world, self.node, self.run = world, node, run
        self.t = t0
        self.t_start = t0
        self.attempt = 0
        self.step = 0
        self.events: list[Event] = []
        self._seq = 0
        self._loss = 4.0
        self._seed = seed
        self.exit_code: int | None = None
        self.emit("launcher.started", rank=None, data={"world": world})

    def emit(self, kind: str, *, rank: int | None, step: int | None = None, t: float | None = None,
             level: str = "info", data: dict[str, Any] | None = None, msg: str = "") -> None:
        self._seq += 1
        self.events.append(Event(kind=kind, t=self.t if t is None else t, mono=0.0, run=self.run, node=self.node,
                                 rank=rank, local_rank=rank, world=self.world, attempt=self.attempt if rank is not None else None,
                                 pid=1000 + (rank or 0) + 100 * self.attempt, seq=self._seq, step=step, level=level,
                                 msg=msg, data=data or {}))

    def startup(self, seconds: float) -> "SynthRun":
        """Workers start; ``seconds`` pass before the first step begins."""
        for r in range(self.world):
            self.emit("worker.started", rank=r)
        self.t += seconds
        return self

    def steps(self, n: int, *, step_time: float = 1.0, ckpt_every: int = 0, stall: float = 0.0,
              skipped: tuple[int, ...] = (), slow_rank: int | None = None, slow_factor: float = 1.0) -> "SynthRun":
        """``n`` steps of ``step_time`` s; a checkpoint stall of ``stall`` s after every ``ckpt_every``."""
        for _ in range(n):
            self.step += 1
            self.t += step_time
            self._loss = 4.0 * math.exp(-self.step / 40.0) + 0.05 * math.sin(self.step + self._seed)
            for r in range(self.world):
                # The slowest rank's compute fills the whole step; the others wait in all-reduce.
                st = step_time if r == (slow_rank if slow_rank is not None else 0) else step_time / max(slow_factor, 1.0) * (1 - 0.03 * r)
                d = {"loss": self._loss, "lr": 1e-3, "grad_norm": 1.0, "samples": self.step * 8 * self.world,
                     "step_time_s": st}
                if self.step in skipped:
                    d["skipped"] = True
                    self.emit("guard.nonfinite", rank=r, step=self.step, level="warning")
                    self.emit("guard.skip", rank=r, step=self.step, level="warning")
                self.emit("step", rank=r, step=self.step, data=d)
            if ckpt_every and self.step % ckpt_every == 0:
                self.t += stall
                for r in range(self.world):
                    self.emit("ckpt.saved", rank=r, step=self.step, data={"step": self.step, "stall_s": stall,
                                                                          "total_s": stall * 2, "bytes": 1 << 20})
        return self

    def eval(self, seconds: float) -> "SynthRun":
        self.t += seconds
        self.emit("eval.done", rank=0, step=self.step, data={"duration_s": seconds, "loss": self._loss})
        return self

    def fault(self, kind: str = "inject.kill", *, rank: int = 1, after: float = 0.0) -> "SynthRun":
        """An injected fault ``after`` seconds into the next step (ground truth onset); like
        the real injectors it names the step it strikes (the one in progress)."""
        self.t += after
        self.emit(kind, rank=rank, step=self.step + 1, level="warning", data={"rank": rank, "step": self.step + 1})
        return self

    def detect(self, seconds: float, kind: str = "worker.failed", rank: int = 1) -> "SynthRun":
        self.t += seconds
        self.emit(kind, rank=None, level="error", data={"exit_code": -9, "signal": "SIGKILL", "rank": rank})
        return self

    def restart(self, seconds: float, *, resume_from: int) -> "SynthRun":
        """A new attempt that loads checkpoint ``resume_from`` and starts stepping ``seconds`` later."""
        self.attempt += 1
        self.emit("launcher.restart", rank=None, data={"attempt": self.attempt})
        for r in range(self.world):
            self.emit("worker.started", rank=r)
        self.t += seconds
        for r in range(self.world):
            self.emit("ckpt.loaded", rank=r, step=resume_from, data={"step": resume_from})
        self.step = resume_from
        return self

    def end(self, seconds: float = 0.0, *, exit_code: int = 0) -> "SynthRun":
        self.t += seconds
        self.exit_code = exit_code
        self.emit("launcher.finished", rank=None, data={"exit_code": exit_code})
        return self

    def write(self, root: str | os.PathLike[str], run_id: str = "synth") -> RunDir:
        """Write the run directory under ``root`` and return it."""
        rd = RunDir.create(root, run_id)
        files: dict[Path, list[str]] = {}
        for ev in self.events:
            path = rd.launcher_file(self.node) if ev.rank is None else rd.event_file(self.node, ev.rank, ev.attempt or 0, ev.pid or 0)
            files.setdefault(path, []).append(ev.to_json())
        for path, lines in files.items():
            path.write_text("\n".join(lines) + "\n")
        atomic_write_json(rd.run_json, {"run_id": run_id, "world": self.world, "started_t": self.t_start,
                                        "ended_t": self.t, "exit_code": self.exit_code})
        return rd
