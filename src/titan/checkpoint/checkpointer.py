"""``Checkpointer``: the three calls a training loop makes (restore, maybe_save, close).

Save protocol (every rank, then rank 0): state staged → DCP writes each rank's part into
``step-N.partial/`` with checksums computed while writing → ``.metadata`` → manifest →
rename to ``step-N/`` → ``latest`` replaced. Async saves run on a background thread with
their own gloo process group, so their collectives can never interleave with training
collectives; at most one is in flight. Whether a save is due and whether SIGTERM reached a
rank is agreed by every rank each step — in a step guard's vector when one carries it
(``StepGuard.use_checkpointer``), else by one small all-reduce of ``maybe_save``'s own. A
failed save (full disk, I/O error) is an event, not a crash.
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
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from titan.checkpoint import commit as _commit
from titan.checkpoint import manifest as _mf
from titan.checkpoint.slowsave import SaveTimeDetector
from titan.checkpoint.staging import Stager
from titan.errors import TitanAbort, TitanError
from titan.exitcodes import ExitCode

if TYPE_CHECKING:
    from titan.worker.context import WorkerContext

__all__ = ["Checkpointer", "Preempted", "CheckpointLoadError", "CheckpointsLost"]

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


class CheckpointsLost(TitanAbort):
    """Every checkpoint is corrupt and ``checkpoint.allow_fresh_start`` is off: stop (exit
    ``GAVE_UP``) rather than train again from step 0 without anyone noticing."""

    def __init__(self, message: str) -> None:
        super().__init__(message, int(ExitCode.GAVE_UP),
                         hint="inspect with `titan ckpt ls`; to start over from step 0 on purpose, "
                              "--set checkpoint.allow_fresh_start=true")


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
        self._slow = SaveTimeDetector(self.root)  # a slow disk, from the saves' own times
        self._snap = None  # the verified tier (SDC), ``snapshot.py``
        self._steps: Any = None  # the per-step tier, ``stepsnap.py`` (created at the first use)
        self._steps_stats: list[Any] = []
        self._steps_saves = 0
        self._last_state: Mapping[str, Any] | None = None  # for the final-state digest
        self._last_step: int | None = None
        self._rolled_back_to: int | None = None
        self._agreed: tuple[int, list[int]] | None = None  # (step, flags) a step guard's vector carried
        #: ``maybe_save`` calls whose flags rode a step guard's vector / needed their own all-reduce
        self.flags_rode = 0
        self.flags_exchanged = 0
        if self.cfg.save_on_sigterm and threading.current_thread() is threading.main_thread():
            self._prev_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        ctx.events.emit("ckpt.armed", f"checkpoints every {self.cfg.every_steps} steps in {self.root}", data={
            "every_steps": self.cfg.every_steps, "mode": self.cfg.mode, "dir": str(self.root),
            "save_on_sigterm": self.cfg.save_on_sigterm})

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
        from titan.checkpoint.layout import compute_layout

        # Shared folder, or one storage domain per node with buddy copies (docs/checkpoint.md).
        self._layout = compute_layout(self, self._ctl)
        self._groups_ready = True

    @property
    def layout(self) -> Any:
        """Where this job's checkpoint files live (``titan.checkpoint.layout.Layout``); collective
        the first time (the storage probe)."""
        self._setup_groups()
        return self._layout

    def _dir_leader(self) -> bool:
        """The rank that manages this node's checkpoint folder: rank 0 on shared storage, each
        storage domain's lowest rank on node-local storage."""
        lay = getattr(self, "_layout", None)
        return lay.is_leader if lay is not None and lay.node_local else self.rank == 0

    def _all_max(self, values: list[int]) -> list[int]:
        dist = self._dist()
        if dist is None:
            return values
        import torch

        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._ctl)
        return [int(v) for v in t.tolist()]

    def _agree(self, values: list[int]) -> list[int]:
        """:meth:`_all_max` as the per-step agreement of ``maybe_save``: a collective, not a
        save — phase ``comm`` (learned, tight) inside ``ckpt_step`` and counted on the
        beacon (slot 1, the control group), so a rank waiting here for a stopped peer is
        neither given the checkpoint budget nor taken for the one that stopped (a stall
        there went undetected)."""
        from titan.beacon import get_beacon, phase

        b = get_beacon() if self._dist() is not None else None
        with phase("comm"):
            if b is not None:
                b.collective_issued(1)
            out = self._all_max(values)
            if b is not None:
                b.collective_done(1)
        return out

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

    # --- the per-step agreement ----------------------------------------------------------
    def step_flags(self, step: int) -> list[int]:
        """This rank's flags for ``maybe_save(step)``: SIGTERM seen, a save due, a save still
        writing. ``maybe_save`` acts on them only once every rank agrees (any rank's flag
        counts): through a step guard's vector (:meth:`flags_agreed`) or its own all-reduce.
        Local and thread-safe (the guard may ask from DDP's comm hook)."""
        every = self.cfg.every_steps
        due = bool(every) and step % every == 0 and step != self.last_saved_step
        inf = self._inflight
        running = inf is not None and not inf.future.done()
        return [int(self._preempt.is_set()), int(due), int(running)]

    def flags_agreed(self, step: int, sums: Sequence[float]) -> None:
        """The sums over every rank of :meth:`step_flags` for ``step``, as a step guard's
        vector carried them (bitwise the same on every rank): ``maybe_save(step)`` uses them
        instead of an all-reduce of its own. A flag sampled after the vector left (SIGTERM
        late in the step) is carried by the next step's. Called by ``StepGuard``."""
        if len(sums) == 3:
            self._agreed = (int(step), [int(v > 0) for v in sums])

    def _step_agreement(self, step: int) -> list[int]:
        """[preempt, due, running] as every rank sees them for ``step`` (module doc)."""
        agreed, self._agreed = self._agreed, None
        if agreed is not None and agreed[0] == step:  # the same on every rank: the guard's steps are
            self.flags_rode += 1
            return agreed[1]
        self.flags_exchanged += 1
        return self._agree(self.step_flags(step))

    # --- save ---------------------------------------------------------------------------
    def maybe_save(self, step: int, app_state: Mapping[str, Any]) -> bool:
        """Call after optimizer step ``step`` on every rank. Saves every ``every_steps``,
        snapshots into the per-step tier every ``snapshot_every_steps``, and on SIGTERM saves
        and raises ``Preempted`` (SIGTERM on any rank: every rank saves the same step).

        Cost per call: no collective when a step guard carried this step's flags
        (``StepGuard.use_checkpointer``; a SIGTERM that arrives after the guard's vector
        left is then acted on one step later), else one 3-integer all-reduce (world > 1);
        one memcpy of the state when a per-step snapshot is due; on a save step the staging
        copy (async) or the whole write (sync). Returns whether a disk save started.
        On the progress beacon the call is phase ``ckpt_step`` (learned, like every phase run
        each step), a disk save inside it ``checkpoint`` (its own budget: a save may take
        minutes) and the per-step snapshot ``snapshot`` (learned once it has samples); its
        own per-step agreement, when it needs one, is phase ``comm``, a counted collective
        (beacon slot 1). Before, the whole call was ``checkpoint``: a rank stuck in it — e.g.
        stopped during its per-step snapshot — was not taken for hung before
        ``checkpoint_budget_s`` (120 s).
        After a rollback to step r (``rollback``), calls for other steps than r+1 are stale
        (the loop's step of the discarded state) and do nothing.
        """
        if self._rolled_back_to is not None:
            if step != self._rolled_back_to + 1:
                return False
            self._rolled_back_to = None
        from titan.beacon import phase

        with phase("ckpt_step"):
            return self._maybe_save(step, app_state)

    def _maybe_save(self, step: int, app_state: Mapping[str, Any]) -> bool:
        from titan.beacon import phase

        self._setup_groups()
        self.ctx.step = step
        self._last_state, self._last_step = app_state, step
        preempt, due_any, _ = self._step_agreement(step)
        self._reap()
        if preempt:
            with phase("checkpoint"):
                self._preemption_exit(step, app_state)
        saved = False
        if due_any:
            with phase("checkpoint"):
                saved = self.save(step, app_state, blocking=self.cfg.mode == "sync")
        snap_every = self.cfg.snapshot_every_steps
        if snap_every and step % snap_every == 0:
            with phase("snapshot"):
                self.step_snapshot(step, app_state)
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
        if self._dir_leader():
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
        lay = self._layout
        writer = TitanWriter(part, info=info, fsync=self.cfg.fsync, manifest=not lay.node_local)
        extra: dict[str, Any] = {}
        try:
            dcp.save(sd, storage_writer=writer, process_group=group, no_dist=self._dist() is None)
            final = None
            if lay.node_local:  # buddy copies, then a commit agreed over the process group
                from titan.checkpoint.nodelocal import save_nodelocal

                extra = save_nodelocal(self, lay, step, writer, group)
                final = extra.pop("path")
                extra["storage"] = "node-local"
            elif self.rank == 0:
                final = _commit.commit(self.root, step, fsync=self.cfg.fsync)
                removed = _commit.prune(self.root, self.cfg.keep_last, self.cfg.keep_every)
                if removed:
                    log.info("retention removed %s", ", ".join(p.name for p in removed))
        except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
            self._failed(step, e, stall)
            if self._dir_leader():
                shutil.rmtree(part, ignore_errors=True)  # free the space; older checkpoints untouched
            self._persist(step, writer, False, group)  # collective: every rank takes part
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
                                              "mode": "sync" if blocking else "async", **extra,
                                              "path": str(final or self.root / _mf.step_dir_name(step))})
        slow = self._slow.observe(total)
        if slow is not None:
            self.ctx.events.emit("ckpt.slow", f"checkpoint step {step} on {self.ctx.node}:{self.root} took "
                                 f"{total:.2f}s, {slow['ratio']}x its baseline {slow['baseline_s']:.2f}s "
                                 f"(4 KiB fsync {slow['fsync_probe_s']}s, was {slow['fsync_baseline_s']}s)",
                                 level="warning", step=step,
                                 data={"step": step, "node": self.ctx.node, "rank": self.rank, "path": str(self.root),
                                       **slow})
        self._persist(step, writer, True, group)
        return True

    def _persist(self, step: int, writer: Any, ok: bool, group: Any) -> None:
        """Every ``persist_every_steps``: copy the committed step to the durable tier
        (``titan.checkpoint.durable``; collective on ``group``, after ``ckpt.saved`` so that
        the slow-save detector and the save's own times never include it)."""
        from titan.checkpoint.durable import persist, persist_due

        if not persist_due(self.cfg, step):
            return
        try:
            persist(self, step, dict(writer.fs.sums), ok, group)
        except Exception as e:  # noqa: BLE001 - a peer gone mid-copy: the restart will tell; never crash the save
            log.warning("durable copy of step %d failed: %s", step, e)
            self.ctx.events.emit("ckpt.persist_failed", f"checkpoint step {step} not copied to durable storage: {e}",
                                 level="warning", step=step, data={"step": step, "error": str(e)[:500],
                                                                    "dir": self.cfg.persist_dir})

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
    def _snapshot_key(self) -> str:
        from titan.checkpoint.snapshot import snapshot_key

        try:  # this node's launch time tells a re-created run dir of the same name apart
            rj = self.ctx.run_dir.read_run_json()
            started = (rj.get("nodes") or {}).get(self.ctx.node, {}).get("started_at", rj.get("started_at", ""))
        except TitanError:
            started = ""
        return snapshot_key(self.ctx.run_dir.path, self.ctx.run_dir.run_id, started)

    def enable_snapshots(self) -> None:
        """Create the verified ``/dev/shm`` tier, written only by :meth:`snapshot`.

        For callers that decide themselves when a snapshot is taken (``titan.sdc`` takes one
        only after replicas agreed, so that every snapshot of this tier is verified).
        """
        if self._snap is None:
            from titan.checkpoint.snapshot import SnapshotStore

            self._snap = SnapshotStore(Path(self.cfg.snapshot_dir), self._snapshot_key(), self.rank, self.world)
            self._snap.report(self.ctx.events)

    def step_tier(self) -> Any:
        """The per-step tier (:class:`titan.checkpoint.stepsnap.StepSnapshots`), created on
        first use; ``None`` when ``snapshot_every_steps`` is 0 or it turned itself off."""
        if self._steps is None and self.cfg.snapshot_every_steps:
            from titan.checkpoint.stepsnap import StepSnapshots

            from titan.checkpoint.snapshot import shm_space

            self._steps = StepSnapshots(Path(self.cfg.snapshot_dir), self._snapshot_key(), self.rank, self.world,
                                        replica=self.replica, max_fraction=self.cfg.snapshot_max_fraction)
            space = shm_space(self._steps.dir)
            self.ctx.events.emit("ckpt.snapshot_space", f"per-step snapshots in {self._steps.dir}: "
                                 f"{space['free_bytes'] / 2**20:.0f} MiB free of {space['total_bytes'] / 2**20:.0f} MiB",
                                 data={"dir": str(self._steps.dir), "tier": "step", **space})
        if self._steps is not None and self._steps.off_reason is not None:
            return None
        return self._steps

    #: Where the per-step tier copies each finished slot (a buddy node); ``None``: node-local.
    replica: Any = None

    def step_snapshot(self, step: int, app_state: Mapping[str, Any]) -> None:
        """Snapshot this rank's state after ``step`` into the per-step tier (local, no collective).

        Cost: one memcpy of the model and optimizer state on the loop's thread; hashing,
        marker and replication on a background thread (waited for by the next call). A
        failure (full ``/dev/shm``) is a ``ckpt.snapshot_failed`` event, never a crash.
        """
        tier = self.step_tier()
        if tier is None:
            return
        try:
            st = tier.save(step, app_state)
        except OSError as e:
            kind, info = _commit.classify_failure(e, tier.dir)
            self.ctx.events.emit("ckpt.snapshot_failed", f"per-step snapshot {step} failed: {kind}", level="warning",
                                 step=step, data={"step": step, "kind": kind, "tier": "step", **info})
            return
        if st is None:
            self.ctx.events.emit("ckpt.snapshot_off", f"per-step snapshots off: {tier.off_reason}; a restart "
                                 "resumes from the disk checkpoint", level="warning", step=step,
                                 data={"tier": "step", "reason": tier.off_reason, "dir": str(tier.dir)})
            return
        self._steps_saves += 1
        self._steps_stats.append(st)
        if self._steps_saves in (1, 10) or self._steps_saves % 100 == 0:
            self._report_step_snapshots(step)

    def _report_step_snapshots(self, step: int) -> None:
        import statistics

        from titan.checkpoint.stepsnap import SnapshotStats

        sts: list[SnapshotStats] = self._steps_stats
        if not sts:
            return
        med = {f: statistics.median(getattr(s, f) for s in sts) for f in
               ("wait_s", "copy_s", "small_s", "hash_s", "replicate_s")}
        self.ctx.events.emit("ckpt.step_snapshots", f"per-step snapshots: {len(sts)} since the last report, "
                             f"{sts[-1].bytes / 2**20:.1f} MiB, stall {1e3 * (med['wait_s'] + med['copy_s'] + med['small_s']):.2f} ms",
                             step=step, data={"saves": self._steps_saves, "bytes": sts[-1].bytes, "dir": str(self._steps.dir),
                                              "median": med, "replicated": self.replica is not None})
        self._steps_stats = []

    def snapshot(self, step: int, app_state: Mapping[str, Any]) -> None:
        """Write an in-memory (``/dev/shm``) snapshot of this rank's state after ``step``.

        Cost: one copy of the state into a tmpfs file plus a CRC-32; no collectives.
        """
        from titan.checkpoint.state import collect

        if self._snap is None:
            raise TitanError("the verified snapshot tier is off; call enable_snapshots() first")
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
        """Delete this rank's ``/dev/shm`` snapshots of both tiers (local). Call after training
        finished for good: snapshots are RAM and outlive the process by design."""
        from titan.checkpoint.snapshot import SnapshotStore

        if self._steps is not None:
            self._steps.close()
        # The verified tier's folder holds the per-step tier's (``rank<r>/step``): one removal.
        (self._snap or SnapshotStore(Path(self.cfg.snapshot_dir), self._snapshot_key(), self.rank, self.world)).remove()

    def rollback(self, app_state: Mapping[str, Any]) -> int:
        """Roll every rank back to the newest snapshot step they all hold (collective).

        For the guard: returns the step restored, or raises ``CheckpointLoadError`` when no
        common snapshot exists (then fall back to ``restore`` from disk).
        """
        from titan.checkpoint import restore as _restore

        self._setup_groups()
        # With SDC on (the verified tier exists) a rollback never uses the per-step tier: a
        # per-step snapshot may hold state that no SDC round has checked.
        tier = "verified" if self._snap is not None else "step"
        step = _restore.agreed_snapshot_step(self, tier)
        if step <= 0:
            raise CheckpointLoadError("no snapshot common to all ranks to roll back to")
        _restore.load_snapshot(self, step, app_state, source="rollback", tier=tier)
        self._rolled_back_to = step
        return step

    def _write_final_digest(self) -> None:
        from titan.settings.env import TITAN_FINAL_STATE

        path = os.environ.get(TITAN_FINAL_STATE)
        if not path or self._last_state is None:
            return
        from titan.checkpoint.digest import state_digest, write_digest

        try:
            write_digest(path, self.rank, self._last_step, state_digest(self._last_state, self.rank))
        except (OSError, RuntimeError, ValueError) as e:  # evidence for a drill; never fails training
            log.warning("final state digest not written: %s", e)

    # --- restore ------------------------------------------------------------------------
    def restore(self, app_state: Mapping[str, Any], *, seed: int | None = None) -> int:
        """Load the newest good state (snapshot if newer, else verified disk checkpoint).

        Collective. Returns the completed step to resume after (0 if nothing). Corrupt
        checkpoints are reported (``ckpt.corrupt``), moved aside, and the previous one is
        used. Raises ``CheckpointLoadError`` only if a load failed after partly
        overwriting the live state and no other checkpoint loaded.
        """
        from titan.beacon import phase
        from titan.checkpoint import restore as _restore

        with phase("restore"):
            self._setup_groups()
            if seed is not None:
                self.seed = seed
            step = _restore.restore(self, app_state)
        self.last_saved_step = step or None
        self._last_state, self._last_step = app_state, step
        self.ctx.resumed_from = step  # the guard warms DDP up after a restore (titan.guard.progress)
        return step

    def close(self) -> None:
        """The end of training: wait for the save in flight, stop the background threads, put
        SIGTERM back, mark the progress beacon done (the teardown after it is no hang); under
        a drill (``TITAN_FINAL_STATE``) write the final state's digest (``titan.checkpoint.digest``)."""
        from titan import beacon

        try:
            with beacon.phase("checkpoint"):
                self.wait()
            if self._steps is not None:
                self._steps.close()
                if self._steps_stats:
                    self._report_step_snapshots(self._steps_stats[-1].step)
            beacon.done()
            self._write_final_digest()
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
