"""Who this process is inside a Titan run: rank, node, attempt, run directory, events.

Read from the environment that torchrun and ``titan run`` set; works without them too
(a single process writes into ``./runs/<new id>`` when no run directory is given).

Under ``titan run`` :meth:`WorkerContext.from_env` also wires the process at once
(:meth:`WorkerContext.wire`): ``worker.started``, the progress beacon and stack dumps the
hang watchdog reads, the fault boundary (an uncaught exception becomes ``worker.fault`` and
its class's exit code, 10/11), and rank/attempt/step on Titan's log records. A script that
creates the context gets all of it with no further call.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import sys
from typing import Any

from titan.events import EventWriter, RunDir, default_node_id
from titan.settings import Settings, load_settings
from titan.settings.env import TITAN_ATTEMPT, TITAN_NODE_ID, TITAN_RUN_DIR, TITAN_SPAWN

__all__ = ["WorkerContext", "RankLogFilter"]


@dataclasses.dataclass
class WorkerContext:
    """Identity and event writer of one worker process (one rank of one attempt)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    attempt: int
    node: str
    run_dir: RunDir
    settings: Settings
    events: EventWriter
    step: int | None = None  # last step the loop reported; stamped on log lines
    beacon: Any = None  # the progress beacon (titan.beacon), once wired
    wired: bool = False
    resumed_from: int | None = None  # the step a Checkpointer restored (None before a restore)
    _announced: bool = False

    @classmethod
    def from_env(cls, settings: Settings | None = None, *, run_dir: str | os.PathLike[str] | None = None,
                 env: dict[str, str] | None = None, wire: bool | None = None) -> "WorkerContext":
        """Build from torchrun's variables (``RANK``, ``TORCHELASTIC_RESTART_COUNT``…); the
        attempt is the job-wide one ``titan run`` agreed for a multi-node round
        (``TITAN_ATTEMPT``) when set, else this node's restart count.

        ``wire`` (default: when ``titan run`` launched this process, i.e. ``TITAN_RUN_DIR`` is
        set) calls :meth:`wire`. Call it before ``init_distributed`` (the beacon turns the
        flight recorder on). Cost: one event file opened; wired, see :meth:`wire`.
        """
        env = dict(os.environ if env is None else env)
        settings = settings or load_settings(env=env)
        rank = int(env.get("RANK", "0"))
        local_rank = int(env.get("LOCAL_RANK", "0"))
        world = int(env.get("WORLD_SIZE", "1"))
        local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
        attempt = int(env.get(TITAN_ATTEMPT) or env.get("TORCHELASTIC_RESTART_COUNT", "0"))
        node = env.get(TITAN_NODE_ID) or settings.run.node_id or default_node_id()
        path = run_dir or env.get(TITAN_RUN_DIR)
        rd = RunDir(path) if path else RunDir.create(settings.run.runs_dir)
        ev = settings.events
        writer = EventWriter(
            rd.event_file(node, rank, attempt, os.getpid()), run=rd.run_id, node=node, rank=rank,
            local_rank=local_rank, world=world, attempt=attempt, step_every=ev.step_every,
            slow_write_s=ev.slow_write_s, queue_on_slow=ev.queue_on_slow, queue_size=ev.queue_size,
        )
        ctx = cls(rank, local_rank, world, local_world, attempt, node, rd, settings, writer)
        if wire if wire is not None else bool(env.get(TITAN_RUN_DIR)):
            ctx.wire()
        return ctx

    def wire(self) -> "WorkerContext":
        """Give this process every in-worker capability that needs no object of the script's:
        ``worker.started``; the progress beacon, stack dumps on a signal and the flight
        recorder (``titan.beacon.install``; off with ``watchdog.enabled = false``); the fault
        boundary (``titan.worker.errors.install_fault_boundary``); rank/attempt/step on the
        ``titan`` logger. Idempotent. Cost: ~1 ms, one daemon thread (the beacon's helper).
        """
        if self.wired:
            return self
        from titan.beacon import install
        from titan.worker.errors import install_fault_boundary

        self.beacon = install(self)
        import atexit

        if self.beacon is not None:
            from titan.beacon import done

            atexit.register(done)  # the interpreter's shutdown is no hang
        install_fault_boundary(self)
        from titan.worker.shutdown import drain_collective_threads

        atexit.register(drain_collective_threads)  # gloo's threads may still hold a decref (shutdown.py)
        self.install_log_filter()
        self.wired = True
        self.announce()
        return self

    @property
    def is_restart(self) -> bool:
        return self.attempt > 0

    def announce(self) -> None:
        """Emit ``worker.started`` with versions and thread counts (what run.json lacks); once."""
        import torch

        if self._announced:
            return
        self._announced = True

        self.events.emit("worker.started", f"rank {self.rank} started (attempt {self.attempt})", data={
            "pid": os.getpid(), "host": platform.node(), "python": sys.version.split()[0],
            "torch": torch.__version__, "intra_op_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(), "local_world_size": self.local_world_size,
            # titan.warm: "warm" (forked by the zygote) or "cold: <why>" (a new interpreter)
            "spawn": os.environ.get(TITAN_SPAWN, "cold"),
            "wired": self.wired, "beacon": self.beacon is not None,
            "fault_boundary": getattr(sys.excepthook, "titan_ctx", None) is self,
        })

    def install_log_filter(self, logger: logging.Logger | None = None) -> None:
        """Stamp rank, attempt and step on every record of ``logger`` (default: ``titan``)."""
        target = logger or logging.getLogger("titan")
        if not any(isinstance(f, RankLogFilter) and f.ctx is self for f in target.filters):
            target.addFilter(RankLogFilter(self))


class RankLogFilter(logging.Filter):
    """Adds ``rank``, ``attempt`` and ``step`` attributes and a prefix to log records."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__()
        self.ctx = ctx

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.ctx.rank
        record.attempt = self.ctx.attempt
        record.step = self.ctx.step
        if not getattr(record, "_titan_prefixed", False):
            record.msg = f"[rank{self.ctx.rank} attempt{self.ctx.attempt} step{self.ctx.step}] {record.msg}"
            record._titan_prefixed = True
        return True
