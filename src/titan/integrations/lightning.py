"""PyTorch Lightning under Titan: one callback, and the resume path.

::

    from titan.integrations.lightning import TitanCallback, resume_path

    ckpts = ModelCheckpoint(dirpath=d, every_n_train_steps=5, save_top_k=-1)
    trainer = L.Trainer(strategy="ddp", callbacks=[ckpts, TitanCallback()], …)
    trainer.fit(model, loader, ckpt_path=resume_path(d))      # newest *verified* checkpoint, or None

What it wires (``docs/integrations.md``):

* **step guard** — a ``titan.guard.StepGuard`` on the DDP module inside the optimizer's
  ``step(closure)`` that Lightning calls: the closure runs (training_step, backward,
  ``on_before_optimizer_step``, Lightning's clipping), then the guard judges the gradients
  its comm hook read before the all-reduce, on every rank alike, and steps or skips. On a
  skipped step the step-interval LR schedulers' next ``step()`` is dropped (the schedule
  counts applied updates); ``trainer.global_step`` and the batch index advance (they count
  steps attempted: the data position, as the guard's step number).
* **beacons, fault boundary, events** from ``titan.worker.WorkerContext`` and the guard.
* **checkpoints** — :class:`TitanCheckpointIO` (installed by the callback unless the
  strategy has another ``CheckpointIO``): each file written under a temporary name, fsynced,
  renamed, then its sidecar manifest (size + CRC-32) committed; verified on load, and a bad
  or unfinished one replaced by the newest good one of the folder (``ckpt.corrupt``).
* **what Lightning does not save**: each rank's RNG streams (Python, NumPy, torch) and the
  data position mid-epoch. On resume the callback fast-forwards the train loader past the
  batches the checkpoint's epoch already consumed (re-reading them — the samplers' order is
  a function of the epoch) and then puts back each rank's RNG, so the resumed run is bit for
  bit the uninterrupted one, also mid-epoch and with dropout.

Exact resume assumes fetching a batch draws nothing from the global RNG in the main process
(a ``DistributedSampler`` / ``TensorDataset`` loader, as Lightning injects under DDP) and no
validation between a save and the next step. Tested with Lightning 2.6.6 (torch 2.13,
CPU/gloo, ``DDPStrategy`` under torchelastic). Not covered: FSDP/DeepSpeed strategies,
manual optimisation, several optimizers (only the first is guarded).
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback
from lightning.pytorch.plugins.io import CheckpointIO

from titan.errors import TitanError
from titan.integrations import _files
from titan.integrations._core import GuardedStep, dist_rank_world, worker_context, write_final_state

__all__ = ["TitanCallback", "TitanCheckpointIO", "resume_path"]

log = logging.getLogger(__name__)

SOURCE = "lightning"
_STEP_RE = re.compile(r"step=(\d+)")


def _candidates(root: Path) -> list[_files.Candidate]:
    out = []
    for p in sorted(root.glob("*.ckpt")) if root.is_dir() else []:
        if not p.is_file():
            continue
        side = root / _files.sidecar_name(p)
        step = None
        if side.is_file():
            try:
                step = int(_files._mf.read_manifest(root, side.name)["step"])
            except ValueError:
                step = None
        if step is None:
            m = _STEP_RE.search(p.name)
            step = int(m.group(1)) if m else 0
        out.append(_files.Candidate(p, step, root, side.name))
    return out


def resume_path(dirpath: str | os.PathLike[str]) -> str | None:
    """The newest checkpoint file of ``dirpath`` that verifies (or that a run made before
    Titan), for ``trainer.fit(…, ckpt_path=…)``; ``None`` to start fresh. Bad and unfinished
    ones are moved aside by rank 0 (``ckpt.corrupt``). Call it on every rank before ``fit``
    (no process group needed). Cost: one checksum read of each candidate tried."""
    rank, _ = dist_rank_world()
    chosen, _facts = _files.choose(worker_context(), Path(dirpath), _candidates(Path(dirpath)), source=SOURCE,
                                   rank=rank)
    return str(chosen.path) if chosen else None


class TitanCheckpointIO(CheckpointIO):
    """Lightning's ``CheckpointIO`` with Titan's guarantees (module doc). Files are read with
    ``torch.load(weights_only=True)`` only."""

    def __init__(self) -> None:
        self.loaded: dict[str, Any] | None = None  # what the last load used (for ckpt.loaded)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write ``path`` atomically and commit its manifest (rank 0 calls it). Cost: one
        write + fsync of the file, one checksum read, two small fsyncs."""
        t0 = time.monotonic()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.partial{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        step = int(checkpoint.get("global_step", 0))
        m = _files.commit_files(path.parent, [path.name], manifest=_files.sidecar_name(path), step=step,
                                world_size=dist_rank_world()[1],
                                info={"source": SOURCE, "epoch": checkpoint.get("epoch")})
        total = time.monotonic() - t0
        worker_context().events.emit("ckpt.saved", f"checkpoint step {step} saved and committed ({total:.2f}s)",
                                     step=step, data={"step": step, "stall_s": total, "total_s": total,
                                                      "bytes": m["bytes"], "mode": "sync", "path": str(path),
                                                      "source": SOURCE})

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Verify ``path`` and load it; if it is bad, the newest good checkpoint of its folder
        instead (reported as ``ckpt.corrupt``). Raises ``TitanError`` when none is good (the
        next attempt then starts fresh: the bad ones were moved aside)."""
        path = Path(path)
        rank, _ = dist_rank_world()
        cands = _candidates(path.parent)
        asked = [c for c in cands if c.path == path]
        chosen, facts = _files.choose(worker_context(), path.parent, asked, source=SOURCE, rank=rank)
        if chosen is None:
            others = [c for c in _candidates(path.parent) if c.path != path]
            chosen, more = _files.choose(worker_context(), path.parent, others, source=SOURCE, rank=rank)
            facts = {**more, "skipped": facts.get("skipped", []) + more.get("skipped", [])}
        if chosen is None:
            raise TitanError(f"no good checkpoint in {path.parent} (asked for {path.name})")
        t0 = time.monotonic()
        ckpt = torch.load(chosen.path, map_location=map_location or "cpu", weights_only=True)
        self.loaded = {"path": str(chosen.path), "load_s": time.monotonic() - t0, **facts}
        return ckpt

    def remove_checkpoint(self, path: Any) -> None:
        path = Path(path)
        for p in (path.parent / _files.sidecar_name(path), path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def teardown(self) -> None:
        pass


class TitanCallback(Callback):
    """Guard, beacons, events, verified checkpoints and exact resume (module doc).

    Cost per step: the guard's (one pre-reduce read of each bucket, its small all-reduce
    launched with DDP's last bucket); per
    save: one all-gather of each rank's RNG state (a few KB).
    """

    def __init__(self) -> None:
        self.ctx = worker_context()
        self.step: GuardedStep | None = None
        self._stash: dict[str, Any] | None = None
        self._skip_sched = False
        self._step_scheds: list[Any] = []
        self._sched_patched: list[Any] = []
        self._clip_patched: Any = None

    @property
    def state_key(self) -> str:
        return "TitanCallback"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        from lightning.pytorch.plugins.io import TorchCheckpointIO

        io = trainer.strategy.checkpoint_io
        if type(io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = TitanCheckpointIO()
        elif not isinstance(io, TitanCheckpointIO):
            self.ctx.events.emit("ckpt.warning", f"the strategy's CheckpointIO is {type(io).__name__}: "
                                 "checkpoints are not committed or verified by Titan", level="warning",
                                 data={"source": SOURCE})

    # -- the guard -------------------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        opts = trainer.optimizers
        if not opts or not pl_module.automatic_optimization:
            self.ctx.events.emit("guard.armed", "step guard off: manual optimisation or no optimizer",
                                 level="warning", data={"mode": "off", "enabled": False, "source": SOURCE})
            return
        self.step = GuardedStep(self.ctx, trainer.strategy.model, opts[0], on_result=self._told)
        self.step.set_step(trainer.global_step)
        if self._stash and "guard" in self._stash:
            self.step.guard.load_state_dict(self._stash["guard"])
        self._patch_clip(trainer.strategy.precision_plugin)
        self._step_scheds = [cfg.scheduler for cfg in trainer.lr_scheduler_configs if cfg.interval == "step"]
        if self._step_scheds:
            self._patch_scheduler_hook(pl_module)
        every = _every(trainer)
        self.ctx.events.emit("ckpt.armed", f"Lightning checkpoints every {every} steps, committed and verified "
                             "by Titan", data={"every_steps": every, "mode": "sync", "source": SOURCE})

    def _told(self, res: Any) -> None:
        self._skip_sched = bool(res.skipped) and not self.step.guard.policy.step_scheduler_on_skip  # type: ignore[union-attr]

    def _patch_clip(self, plugin: Any) -> None:
        """Note the norm Lightning clips with (``gradient_clip_val``), so the guard does not
        read the gradients again for it — where the precision plugin clips as the base
        ``Precision`` does (one ``clip_grad_norm_`` over the optimizer's parameters)."""
        from lightning.pytorch.plugins.precision import Precision

        if type(plugin).clip_grad_by_norm is not Precision.clip_grad_by_norm or "clip_grad_by_norm" in vars(plugin):
            return

        def clip_grad_by_norm(optimizer: Any, clip_val: Any) -> None:
            params = list(plugin.main_params(optimizer))
            total = torch.nn.utils.clip_grad_norm_(params, clip_val)
            if self.step is not None:
                self.step.note_grad_norm(total, params)

        plugin.clip_grad_by_norm = clip_grad_by_norm
        self._clip_patched = plugin

    def _patch_scheduler_hook(self, pl_module: Any) -> None:
        # Lightning steps each scheduler through the module's ``lr_scheduler_step`` hook; the
        # hook (not the scheduler, whose __dict__ its state_dict pickles) is wrapped.
        orig = pl_module.lr_scheduler_step

        def lr_scheduler_step(scheduler: Any, metric: Any = None) -> Any:
            if self._skip_sched and any(scheduler is s for s in self._step_scheds):
                return None  # the update was skipped: so is its schedule step
            return orig(scheduler, metric)

        pl_module.lr_scheduler_step = lr_scheduler_step
        self._sched_patched.append((pl_module, orig))

    # -- what a checkpoint carries beyond Lightning's own ---------------------------------------
    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Every rank's RNG streams (all-gathered: only rank 0 writes the file) and the guard."""
        from titan.beacon import get_beacon
        from titan.checkpoint.state import capture_rng

        b = get_beacon()
        if b is not None:
            b.set_phase("checkpoint")  # until the next forward: the save, and the barrier after it
        mine = capture_rng()
        _, world = dist_rank_world()
        if world > 1:
            import torch.distributed as dist

            every: list[Any] = [None] * world
            dist.all_gather_object(every, mine)
        else:
            every = [mine]
        checkpoint["titan"] = {"version": 1, "rng": {f"rank{r}": s for r, s in enumerate(every)},
                               "world_size": world,
                               "guard": self.step.guard.state_dict() if self.step is not None else None}

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._stash = dict(checkpoint.get("titan") or {})
        # Batches of the epoch finished when it was saved, from Lightning's own loop state (a
        # checkpoint from before Titan has it too). Read here: by on_train_start Lightning has
        # not yet counted the batch whose on_train_batch_end saved.
        try:
            cur = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
            self._stash["batches_done"] = int(cur["processed"])
        except (KeyError, TypeError, ValueError):
            self._stash["batches_done"] = None

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """The loss before its backward: under DDP the guard's exchange then rides the
        gradients' all-reduce (no second synchronisation per step)."""
        if self.step is not None:
            self.step.add_loss(loss)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        from titan.beacon import get_beacon

        b = get_beacon()
        if b is not None:
            b.set_phase("idle")  # the previous batch's save is over (ModelCheckpoint runs last)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """After a restore: fast-forward the data to the checkpoint's batch, then put back
        this rank's RNG — the order an uninterrupted run drew them in."""
        if self.step is not None:  # the loops are restored now (on_fit_start saw global_step 0)
            self.step.set_step(trainer.global_step)
        resumed = trainer.ckpt_path is not None
        io = trainer.strategy.checkpoint_io
        loaded = getattr(io, "loaded", None) or {}
        if not resumed:
            self.ctx.events.emit("ckpt.none", "no checkpoint to resume from; starting at step 0",
                                 data={"source": SOURCE})
            return
        rank, world = dist_rank_world()
        done = (self._stash or {}).get("batches_done")
        if done is None:
            done = int(trainer.fit_loop.epoch_loop.batch_progress.current.completed)
        total = trainer.num_training_batches
        rng = (self._stash or {}).get("rng", {}).get(f"rank{rank}")
        if (self._stash or {}).get("world_size") not in (None, world):
            rng = None  # another world size: per-rank streams do not carry over
        mid = 0 < done < total
        if mid:
            skipped = _fast_forward(trainer, done)
            if rng is not None:
                _restore(rng)
        else:
            skipped = 0
            if rng is not None:
                _restore(rng)
            _refetch(trainer)  # the epoch's iterator, created again after the RNG: as at an epoch start
        self.ctx.events.emit("ckpt.loaded", f"resumed from {Path(loaded.get('path', trainer.ckpt_path)).name}",
                             step=trainer.global_step, data={
                                 "step": trainer.global_step, "path": loaded.get("path", str(trainer.ckpt_path)),
                                 "source": SOURCE, "epoch": trainer.current_epoch, "batches_skipped": skipped,
                                 "rng": "restored" if rng is not None else "not in the checkpoint",
                                 **{k: v for k, v in loaded.items() if k != "path"}})
        self.ctx.resumed_from = trainer.global_step

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.step is not None:
            write_final_state(pl_module, self.step.optimizer, trainer.global_step)
            self.step.close()
            self.step = None
        for mod, _orig in self._sched_patched:
            del mod.lr_scheduler_step  # the class's hook again
        self._sched_patched = []
        if self._clip_patched is not None:
            del self._clip_patched.clip_grad_by_norm  # the class's method again
            self._clip_patched = None
        from titan.beacon import done

        done()


def _every(trainer: Any) -> int:
    from lightning.pytorch.callbacks import ModelCheckpoint

    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint) and cb._every_n_train_steps:
            return int(cb._every_n_train_steps)
    return 0


def _restore(rng: dict[str, Any]) -> None:
    from titan.checkpoint.state import restore_rng

    restore_rng(rng)


def _fetcher(trainer: Any) -> Any:
    f = getattr(trainer.fit_loop, "_data_fetcher", None)
    if f is None:
        raise TitanError("Lightning's fit loop has no data fetcher (a Lightning version this integration "
                         "was not tested with): cannot resume the data position")
    return f


def _refetch(trainer: Any) -> None:
    """Create the train loader's iterator again, with each sampler at the current epoch."""
    from lightning.fabric.utilities.data import _set_sampler_epoch

    combined = trainer.fit_loop._combined_loader
    for dl in combined.flattened:
        _set_sampler_epoch(dl, trainer.fit_loop.epoch_progress.current.processed)
    iter(_fetcher(trainer))


def _fast_forward(trainer: Any, batches: int) -> int:
    """Skip the ``batches`` of the current epoch that the checkpoint's run already trained on
    (Lightning counted them but, with a plain loader, would read them again). Returns the
    number skipped. Cost: reading those batches once."""
    _refetch(trainer)
    it = _fetcher(trainer).iterator
    for _ in range(batches):
        next(it)
    return batches
