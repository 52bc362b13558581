"""``Checkpointer``: the three calls a training loop makes (restore, maybe_save, close).

Save protocol (every rank, then rank 0): state staged → DCP writes each rank's part into
``step-N.partial/`` with checksums computed while writing → ``.metadata`` → manifest →
rename to ``step-N/`` → ``latest`` replaced. Async saves run on a background thread with
their own gloo process group, so their collectives can never interleave with training
collectives; at most one is in flight, and whether to wait for it is decided by one
all-reduce for all ranks. A failed save (full disk, I/O error) is an event, not a crash.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import datetime as _dt
import logging
import os
import shutil
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from titan.checkpoint import commit as _commit
from titan.checkpoint import manifest as _mf
from titan.checkpoint.staging import Stager
from titan.errors import TitanAbort, TitanError
from titan.exitcodes import ExitCode

if TYPE_CHECKING:
    from titan.worker.context import WorkerContext

__all__ = ["Checkpointer", "Preempted", "CheckpointLoadError"]

log = logging.getLogger(__name__)

# DCP warns on every single-process save/load that it assumes one process; that is intended
# here. A targeted filter, because catch_warnings() is not thread-safe (saves run on a thread).
warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled", category=UserWarning)


class Preempted(TitanAbort, SystemExit):
    """Raised by ``maybe_save`` after the preemption checkpoint; exits with ``PREEMPTED`` (9)
    even when the script does not catch it (it is a ``SystemExit``)."""

    def __init__(self, message: str) -> None:
        TitanAbort.__init__(self, message, int(ExitCode.PREEMPTED))
        self.code = int(ExitCode.PREEMPTED)


class CheckpointLoadError(TitanError):
    """No checkpoint could be loaded after one had partly overwritten the live state."""


@dataclasses.dataclass
class _Inflight:
    step: int
    future: cf.Future
    stall_s: float
    t0: float


class Checkpointer:
    """Saves and restores the complete training state of one rank (see module docstring).

    ``ctx`` gives rank, world size, run directory, settings (section ``checkpoint``) and the
    event writer. ``seed`` is used to re-derive per-rank RNG when the world size changed.
    """

    def __init__(self, ctx: "WorkerContext", *, seed: int | None = None, root: str | os.PathLike | None = None) -> None:
        self.ctx = ctx
        self.cfg = ctx.settings.checkpoint
        self.root = Path(root or self.cfg.dir or ctx.run_dir.checkpoints)
        self.seed = seed
        self.rank, self.world = ctx.rank, ctx.world_size
        self._ctl: Any = None  # main-thread agreement group
        self._io: Any = None   # background-save group
        self._groups_ready = False
        self._pool: cf.ThreadPoolExecutor | None = None
        self._inflight: _Inflight | None = None
        self._stager = Stager()
        self._preempt = threading.Event()
        self._prev_sigterm: Any = None
        self.last_saved_step: int | None = None
        self.saves_started = 0
        self._snap = None
        if self.cfg.snapshot_every_steps:
            self.enable_snapshots()
        if self.cfg.save_on_sigterm and threading.current_thread() is threading.main_thread():
            self._prev_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)

    # --- collectives --------------------------------------------------------------------
    def _dist(self) -> Any:
        import torch.distributed as dist

        return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None

    def _setup_groups(self) -> None:
        """Create the two gloo groups (collective: every rank calls it at the same point)."""
        if self._groups_ready:
            return
        dist = self._dist()
        if dist is not None:
            timeout = _dt.timedelta(seconds=self.ctx.settings.dist.pg_timeout_s)
            self._ctl = dist.new_group(backend="gloo", timeout=timeout)
            self._io = dist.new_group(backend="gloo", timeout=timeout)
        self._groups_ready = True

    def _all_max(self, values: list[int]) -> list[int]:
        dist = self._dist()
        if dist is None:
            return values
        import torch

        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._ctl)
        return [int(v) for v in t.tolist()]

    def _all_gather(self, obj: Any) -> list[Any]:
        dist = self._dist()
        if dist is None:
            return [obj]
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj, group=self._ctl)
        return out

    def _barrier(self) -> None:
        self._all_max([0])

    # --- preemption ---------------------------------------------------------------------
    def _on_sigterm(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        # Only set a flag: the loop finishes its step, then maybe_save saves and exits.
        self._preempt.set()

    @property
    def preempt_requested(self) -> bool:
        return self._preempt.is_set()

    def request_preemption(self) -> None:
        """Behave as if SIGTERM arrived (for tests and for schedulers that notify otherwise)."""
        self._preempt.set()

    # --- save ---------------------------------------------------------------------------
    def maybe_save(self, step: int, app_state: Mapping[str, Any]) -> bool:
        """Call after optimizer step ``step`` on every rank. Saves every ``every_steps``,
        snapshots every ``snapshot_every_steps``, and on SIGTERM saves and raises ``Preempted``.

        Cost per call: one 3-integer all-reduce (world > 1); on a save step the staging copy
        (async) or the whole write (sync). Returns whether a disk save started.
        """
        self._setup_groups()
        self.ctx.step = step
        every = self.cfg.every_steps
        due = bool(every) and step % every == 0 and step != self.last_saved_step
        running = self._inflight is not None and not self._inflight.future.done()
        preempt, due_any, _ = self._all_max([int(self._preempt.is_set()), int(due), int(running)])
        self._reap()
        if preempt:
            self._preemption_exit(step, app_state)
        saved = False
        if due_any:
            saved = self.save(step, app_state, blocking=self.cfg.mode == "sync")
        snap_every = self.cfg.snapshot_every_steps
        if self._snap is not None and snap_every and step % snap_every == 0:
            self.snapshot(step, app_state)
        return saved

    def save(self, step: int, app_state: Mapping[str, Any], *, blocking: bool = True) -> bool:
        """Save the state after step ``step`` (collective: every rank must call it).

        ``blocking=False`` returns after staging; the write continues in the background.
        A previous save still in flight is waited for first (on every rank). Never raises
        for a failed save: it emits ``ckpt.failed`` and returns ``False``.
        """
        from titan.checkpoint.state import collect

        self._setup_groups()
        t0 = time.monotonic()
        self.wait()  # at most one in flight; every rank calls save at the same step
        if self.rank == 0:
            shutil.rmtree(_commit.partial_dir(self.root, step), ignore_errors=True)
            self.root.mkdir(parents=True, exist_ok=True)
        self._barrier()  # nobody writes into the partial directory before it is clean
        self.saves_started += 1
        err: Exception | None = None
        try:
            sd = collect(app_state, self.rank)
            if not blocking:
                sd = self._stager.stage(sd)
        except Exception as e:  # noqa: BLE001 - a bad state_dict fails this save, not training
            err = e
        if self._all_max([int(err is not None)])[0]:  # a rank that cannot save must not leave others hanging
            self._failed(step, err or RuntimeError("another rank could not collect its state"),
                         time.monotonic() - t0)
            return False
        stall = time.monotonic() - t0
        if blocking:
            ok = self._write(step, sd, stall, t0, self._ctl, True)
            return ok
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="titan-ckpt")
        fut = self._pool.submit(self._write, step, sd, stall, t0, self._io, False)
        self._inflight = _Inflight(step, fut, stall, t0)
        return True

    def _write(self, step: int, sd: dict[str, Any], stall: float, t0: float, group: Any, blocking: bool) -> bool:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        from titan.checkpoint.storage import TitanWriter

        part = _commit.partial_dir(self.root, step)
        info = {"step": step, "world_size": self.world, "seed": self.seed, "mode": self.cfg.mode}
        writer = TitanWriter(part, info=info, fsync=self.cfg.fsync)
        try:
            dcp.save(sd, storage_writer=writer, process_group=group, no_dist=self._dist() is None)
            final = None
            if self.rank == 0:
                final = _commit.commit(self.root, step, fsync=self.cfg.fsync)
                removed = _commit.prune(self.root, self.cfg.keep_last, self.cfg.keep_every)
                if removed:
                    log.info("retention removed %s", ", ".join(p.name for p in removed))
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            self._failed(step, e, stall)
            if self.rank == 0:
                shutil.rmtree(part, ignore_errors=True)  # free the space; older checkpoints untouched
            return False
        nbytes = 0
        if final is not None:
            try:
                nbytes = int(_mf.read_manifest(final)["bytes"])
            except ValueError:
                pass
        self.last_saved_step = step
        total = time.monotonic() - t0
        if blocking:  # a blocking save stalls training for all of it
            stall = total
        self.ctx.events.emit("ckpt.saved", f"checkpoint step {step} saved ({total:.2f}s, stall {stall:.3f}s)",
                             step=step, data={"step": step, "stall_s": stall, "total_s": total, "bytes": nbytes,
                                              "mode": "sync" if blocking else "async",
                                              "path": str(final or self.root / _mf.step_dir_name(step))})
        return True

    def _failed(self, step: int, exc: BaseException, stall: float) -> None:
        kind, info = _commit.classify_failure(exc, self.root)
        log.warning("checkpoint at step %d failed (%s): %s", step, kind, info.get("error"))
        self.ctx.events.emit("ckpt.failed", f"checkpoint step {step} failed: {kind}", level="error", step=step,
                             data={"step": step, "kind": kind, "stall_s": stall, **info})

    def _reap(self) -> None:
        """Forget a finished background save (its outcome was already recorded as an event)."""
        if self._inflight is not None and self._inflight.future.done():
            self._inflight.future.result()
            self._inflight = None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the background save in flight, if any; returns whether it succeeded."""
        inf = self._inflight
        if inf is None:
            return True
        try:
            ok = bool(inf.future.result(timeout=timeout_s or self.cfg.wait_timeout_s))
        except cf.TimeoutError:
            self.ctx.events.emit("ckpt.failed", f"checkpoint step {inf.step} still writing after "
                                 f"{timeout_s or self.cfg.wait_timeout_s:g}s", level="error", step=inf.step,
                                 data={"step": inf.step, "kind": "timeout"})
            raise TitanError(f"background checkpoint of step {inf.step} did not finish in time") from None
        self._inflight = None
        return ok

    def _preemption_exit(self, step: int, app_state: Mapping[str, Any]) -> None:
        self.ctx.events.emit("ckpt.preempted", f"SIGTERM: saving step {step} and exiting", level="warning",
                             step=step, data={"step": step})
        self.wait()
        if self.last_saved_step != step:
            self.save(step, app_state, blocking=True)
        self.close()
        raise Preempted(f"preempted after step {step}; checkpoint saved")

    # --- snapshot -----------------------------------------------------------------------
    def enable_snapshots(self) -> None:
        """Create the ``/dev/shm`` snapshot store even when ``snapshot_every_steps`` is 0.

        For callers that decide themselves when a snapshot is taken (``titan.sdc`` takes one
        only after replicas agreed, so that every snapshot is verified).
        """
        if self._snap is None:
            from titan.checkpoint.snapshot import SnapshotStore, snapshot_key

            try:  # this node's launch time tells a re-created run dir of the same name apart
                rj = self.ctx.run_dir.read_run_json()
                started = (rj.get("nodes") or {}).get(self.ctx.node, {}).get("started_at", rj.get("started_at", ""))
            except TitanError:
                started = ""
            key = snapshot_key(self.ctx.run_dir.path, self.ctx.run_dir.run_id, started)
            self._snap = SnapshotStore(Path(self.cfg.snapshot_dir), key, self.rank, self.world)
            self._snap.report(self.ctx.events)

    def snapshot(self, step: int, app_state: Mapping[str, Any]) -> None:
        """Write an in-memory (``/dev/shm``) snapshot of this rank's state after ``step``.

        Cost: one copy of the state into a tmpfs file plus a CRC-32; no collectives.
        """
        from titan.checkpoint.state import collect

        if self._snap is None:
            raise TitanError("snapshots are off; set checkpoint.snapshot_every_steps")
        t0 = time.monotonic()
        try:
            nbytes = self._snap.save(step, collect(app_state, self.rank))
        except OSError as e:
            kind, info = _commit.classify_failure(e, self._snap.dir)
            self.ctx.events.emit("ckpt.snapshot_failed", f"snapshot step {step} failed: {kind}", level="warning",
                                 step=step, data={"step": step, "kind": kind, **info})
            return
        self.ctx.events.emit("ckpt.snapshot", f"snapshot step {step}", step=step,
                             data={"step": step, "seconds": time.monotonic() - t0, "bytes": nbytes})

    def discard_snapshots(self) -> None:
        """Delete this rank's ``/dev/shm`` snapshots (local). Call after training finished
        for good: snapshots are RAM and outlive the process by design."""
        if self._snap is not None:
            self._snap.remove()

    def rollback(self, app_state: Mapping[str, Any]) -> int:
        """Roll every rank back to the newest snapshot step they all hold (collective).

        For the guard: returns the step restored, or raises ``CheckpointLoadError`` when no
        common snapshot exists (then fall back to ``restore`` from disk).
        """
        from titan.checkpoint import restore as _restore

        self._setup_groups()
        step = _restore.agreed_snapshot_step(self)
        if step <= 0:
            raise CheckpointLoadError("no snapshot common to all ranks to roll back to")
        _restore.load_snapshot(self, step, app_state, source="rollback")
        return step

    # --- restore ------------------------------------------------------------------------
    def restore(self, app_state: Mapping[str, Any], *, seed: int | None = None) -> int:
        """Load the newest good state (snapshot if newer, else verified disk checkpoint).

        Collective. Returns the completed step to resume after (0 if nothing). Corrupt
        checkpoints are reported (``ckpt.corrupt``), moved aside, and the previous one is
        used. Raises ``CheckpointLoadError`` only if a load failed after partly
        overwriting the live state and no other checkpoint loaded.
        """
        from titan.checkpoint import restore as _restore

        self._setup_groups()
        if seed is not None:
            self.seed = seed
        step = _restore.restore(self, app_state)
        self.last_saved_step = step or None
        return step

    def close(self) -> None:
        """Wait for the save in flight, stop the background thread, put SIGTERM back."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            self._stager.close()
            if self._prev_sigterm is not None and threading.current_thread() is threading.main_thread():
                try:
                    signal.signal(signal.SIGTERM, self._prev_sigterm)
                except (TypeError, ValueError):
                    pass
                self._prev_sigterm = None
