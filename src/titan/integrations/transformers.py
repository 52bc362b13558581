"""Hugging Face ``transformers.Trainer`` under Titan: two lines in the script.

::

    from titan.integrations.transformers import TitanCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds)
    titan_cb = TitanCallback(trainer)                               # adds itself
    trainer.train(resume_from_checkpoint=titan_cb.resume_from())    # newest *verified* checkpoint

What it wires (``docs/integrations.md``):

* **step guard** — a ``titan.guard.StepGuard`` on ``trainer.model_wrapped`` (the DDP module:
  its comm hook reads each bucket before the all-reduce) inside the Trainer's own
  ``optimizer.step()``. A non-finite or spiking step is skipped on every rank, its culprit
  rank and parameters named in ``guard.nonfinite`` / ``guard.spike``. On a skipped step the
  optimizer does not step and the Trainer's LR scheduler does not either (the Trainer's own
  rule for a step its fp16 scaler skipped: ``optimizer_step_was_skipped``); ``global_step``
  does advance — it counts steps *attempted*, the data position, as the guard's step number.
  The step's loss is what ``accelerator.backward`` saw (the mean over micro-batches).
* **progress beacons** with phases (forward, backward, comm, optimizer, checkpoint) for
  hang detection, the fault boundary and a ``step`` event per step — from
  ``titan.worker.WorkerContext`` and the guard, as in any script.
* **the Trainer's own checkpoints, committed and verified**: once every rank wrote its
  files of ``checkpoint-N/`` (``on_save``), rank 0 writes ``manifest.json`` (size + CRC-32 of
  each file, the guard's state beside them); :meth:`TitanCallback.resume_from` picks the
  newest checkpoint that verifies, moves bad and unfinished ones aside and says so
  (``ckpt.corrupt``), and accepts the checkpoints a run made before Titan (adopted,
  unverified). The Trainer's own resume is bitwise mid-epoch (it saves each rank's RNG and
  skips the consumed batches), so the guarded run resumes bit for bit.

Tested with transformers 5.24 (torch 2.13, CPU/gloo). Not covered: DeepSpeed and FSDP inside
the Trainer (the guard's DDP check needs the DDP module; the guard is then off and says so),
an fp16 ``GradScaler`` (Accelerate's scaler re-patches the optimizer step; use bf16).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from titan.integrations import _files
from titan.integrations._core import GuardedStep, dist_rank_world, worker_context, write_final_state

__all__ = ["TitanCallback"]

log = logging.getLogger(__name__)

SOURCE = "transformers"
GUARD_FILE = "titan_guard.json"


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _broadcast(obj: Any) -> Any:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return obj


class TitanCallback(TrainerCallback):
    """Guard, beacons, events and verified checkpoints for one ``Trainer`` (module doc).

    ``trainer``: the Trainer to wire; the callback adds itself (``trainer.add_callback``).
    ``max_norm``: leave ``None`` — the Trainer clips (``max_grad_norm``); the guard's norm is
    read before that. ``done_at_train_end``: mark the beacon done when ``train()`` returns, so
    what the script does next (``save_model``, ``evaluate``, teardown) is not watched as a
    hang; pass ``False`` when ``train()`` is called again on this trainer (stages, the
    overhead benchmark): the beacon is then marked done at exit. Cost per step: the guard's
    (one pre-reduce read of each bucket, its small all-reduce launched with DDP's last
    bucket: ``docs/benchmarks.md`` § integrations); per save: a barrier and one checksum
    read of the checkpoint on rank 0.
    """

    def __init__(self, trainer: Any, *, max_norm: float | None = None, done_at_train_end: bool = True) -> None:
        self.trainer = trainer
        self.ctx = worker_context()
        self.max_norm = max_norm
        self.done_at_train_end = done_at_train_end
        self.step: GuardedStep | None = None
        self._resumed: tuple[_files.Candidate | None, dict[str, Any]] | None = None
        self._save_t0: float | None = None
        trainer.add_callback(self)

    # -- resume --------------------------------------------------------------------------------
    def _candidates(self) -> list[_files.Candidate]:
        root = Path(self.trainer.args.output_dir)
        out = []
        for p in root.glob("checkpoint-*") if root.is_dir() else []:
            tail = p.name[len("checkpoint-"):]
            if p.is_dir() and tail.isdigit():
                out.append(_files.Candidate(p, int(tail), p, _files._mf.MANIFEST))
        return out

    def resume_from(self) -> str | None:
        """The newest checkpoint of ``args.output_dir`` that verifies (or that the run made
        before Titan), for ``trainer.train(resume_from_checkpoint=…)``; ``None`` to start
        fresh. Collective when the process group is up (rank 0 decides, all get its answer).
        Cost: one checksum read of each candidate tried."""
        rank, _ = dist_rank_world()
        root = Path(self.trainer.args.output_dir)
        if rank == 0:
            chosen, facts = _files.choose(self.ctx, root, self._candidates(), source=SOURCE, rank=0)
            answer = (str(chosen.path) if chosen else None, chosen.step if chosen else 0, facts)
        else:
            answer = None
        path, step, facts = _broadcast(answer)
        self._resumed = (_files.Candidate(Path(path), step, Path(path), _files._mf.MANIFEST) if path else None, facts)
        return path

    # -- wiring ----------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        tr = self.trainer
        acc_opt = tr.optimizer
        inner = getattr(acc_opt, "optimizer", acc_opt)
        if self.step is not None and not (self.step.model is tr.model_wrapped and self.step.optimizer is inner):
            self.step.close()  # train() again with a new model or optimizer: the old guard goes
            self.step = None
        if self.step is not None:  # train() again on the same trainer: the guard stays (one comm hook per DDP)
            self.step.set_step(state.global_step)
        elif getattr(acc_opt, "scaler", None) is not None:
            self._off("an fp16 GradScaler re-patches the optimizer step inside Accelerate; use bf16 or fp32")
        else:
            self.step = GuardedStep(self.ctx, tr.model_wrapped, inner, max_norm=self.max_norm, on_result=self._told)
            self.step.set_step(state.global_step)
            self._load_guard_state()
        if self.step is not None:  # each loss before its backward, the clipping norm
            self.step.wrap_accelerator(tr.accelerator, lambda: self.step)
        self._announce(args, state)

    def _told(self, res: Any) -> None:
        """The Trainer's own "skipped" channel (read now: each train() prepares its own wrapper)."""
        acc_opt = self.trainer.optimizer
        if hasattr(acc_opt, "_is_overflow") and self.step is not None:
            acc_opt._is_overflow = bool(res.skipped) and not self.step.guard.policy.step_scheduler_on_skip

    def _off(self, why: str) -> None:
        log.warning("titan: step guard off: %s", why)
        self.ctx.events.emit("guard.armed", f"step guard off: {why}", level="warning",
                             data={"mode": "off", "enabled": False, "why": why, "source": SOURCE})

    def _load_guard_state(self) -> None:
        chosen = self._resumed[0] if self._resumed else None
        if chosen is None or self.step is None:
            return
        f = chosen.path / GUARD_FILE
        try:
            self.step.guard.load_state_dict(__import__("json").loads(f.read_text()))
        except FileNotFoundError:
            pass  # a checkpoint from before Titan: the guard's statistics start afresh

    def _announce(self, args: Any, state: Any) -> None:
        every = args.save_steps if str(getattr(args.save_strategy, "value", args.save_strategy)) == "steps" else 0
        self.ctx.events.emit("ckpt.armed", f"Trainer checkpoints every {every} steps in {args.output_dir}, "
                             "committed and verified by Titan", data={
                                 "every_steps": int(every), "mode": "sync", "dir": str(args.output_dir),
                                 "source": SOURCE, "save_total_limit": args.save_total_limit})
        if args.save_total_limit == 1:
            self.ctx.events.emit("ckpt.warning", "save_total_limit=1 deletes the previous checkpoint before the "
                                 "new one commits; use 2 or more", level="warning", data={"source": SOURCE})
        chosen, facts = self._resumed if self._resumed else (None, {})
        if chosen is not None:
            self.ctx.events.emit("ckpt.loaded", f"resumed from {chosen.path.name}", step=state.global_step, data={
                "step": state.global_step, "path": str(chosen.path), "source": SOURCE, **facts})
        else:
            self.ctx.events.emit("ckpt.none", "no checkpoint to resume from; starting at step 0",
                                 data={"root": str(args.output_dir), "source": SOURCE, **facts})
        self.ctx.resumed_from = state.global_step

    # -- saves -------------------------------------------------------------------------------------
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save:
            self._save_t0 = time.monotonic()
            from titan.beacon import get_beacon

            b = get_beacon()
            if b is not None:
                b.set_phase("checkpoint")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Commit ``checkpoint-<global_step>``: every rank's files are on disk after the
        barrier; rank 0 writes the guard's state and the manifest (collective)."""
        rank, world = dist_rank_world()
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        _barrier()
        if rank == 0 and ckpt.is_dir():
            from titan.events import atomic_write_json

            if self.step is not None:
                atomic_write_json(ckpt / GUARD_FILE, self.step.guard.state_dict())
            files = _files.files_under(ckpt, skip=(_files._mf.MANIFEST,))
            m = _files.commit_files(ckpt, files, manifest=_files._mf.MANIFEST, step=state.global_step,
                                    world_size=world, info={"source": SOURCE, "epoch": state.epoch})
            total = time.monotonic() - self._save_t0 if self._save_t0 is not None else 0.0
            self.ctx.events.emit("ckpt.saved", f"checkpoint step {state.global_step} saved and committed "
                                 f"({total:.2f}s)", step=state.global_step, data={
                                     "step": state.global_step, "stall_s": total, "total_s": total,
                                     "bytes": m["bytes"], "mode": "sync", "path": str(ckpt), "source": SOURCE})
        _barrier()  # nobody resumes from, or rotates, a checkpoint before it committed
        self._save_t0 = None
        from titan.beacon import get_beacon

        b = get_beacon()
        if b is not None:
            b.set_phase("idle")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        tr = self.trainer
        if self.step is not None:  # the guard stays wired (a DDP module takes one comm hook): train() may run again
            write_final_state(tr.model, self.step.optimizer, state.global_step)
        if self.done_at_train_end:
            from titan.beacon import done

            done()  # what follows training is no hang
