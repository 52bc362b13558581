"""An ``accelerate.Accelerator`` loop under Titan; the loop keeps its shape.

::

    from titan.integrations.accelerate import TitanAccelerate

    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    titan = TitanAccelerate(accelerator, model, optimizer, scheduler=scheduler)   # restores
    for epoch in range(epochs):
        for x, y in titan.batches(loader, epoch):        # was: `for x, y in loader:`
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            optimizer.step()                              # guarded: skipped on every rank alike
            scheduler.step()
            optimizer.zero_grad()
    titan.close()

What it wires (``docs/integrations.md``):

* **step guard** inside ``optimizer.step()`` (the ``AcceleratedOptimizer``'s inner optimizer,
  a ``titan.guard.StepGuard`` on the DDP module: culprit rank named before the all-reduce,
  one verdict everywhere). A skipped step is told through Accelerate's own
  ``step_was_skipped``, so a prepared scheduler does not step either; the loss is what
  ``accelerator.backward`` saw (its mean over accumulated micro-batches).
* **beacons, fault boundary, events** from ``titan.worker.WorkerContext`` and the guard.
* **Titan checkpoints** (``titan.checkpoint.Checkpointer``: DCP, atomic, checksummed,
  verified on load with fallback, each rank's RNG) every ``checkpoint.every_steps``, taken
  when the loop asks for the next batch after an optimizer step (after the scheduler's step,
  before the next batch is read); and **the data position** Accelerate does not save: the
  epoch, the batches of it consumed, and each rank's RNG at the epoch's start. On resume
  :meth:`TitanAccelerate.batches` yields nothing for finished epochs, re-creates the epoch's
  iterator from the RNG it had then, reads past the consumed batches, and puts back the RNG
  of the checkpoint's step — so shuffling and random transforms come out as in an
  uninterrupted run, bit for bit, mid-epoch included, with any sampler.

Tested with accelerate 1.15 (torch 2.13, ``MULTI_CPU`` over gloo). Not covered: DeepSpeed,
FSDP and Megatron plugins, an fp16 ``GradScaler`` (Accelerate re-patches the optimizer step:
the guard is then off and says so), several models or optimizers in one loop.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any, Iterable, Iterator

import torch

from titan.integrations._core import GuardedStep, worker_context

__all__ = ["TitanAccelerate"]

log = logging.getLogger(__name__)

SOURCE = "accelerate"


#: Where a loader keeps the generators its shuffling draws from (Accelerate seeds the
#: sampler's once, at ``prepare``, and it advances every epoch — not saved by ``save_state``).
_LINKS = ("base_dataloader", "batch_sampler", "sampler", "dataset", "generator", "synchronized_generator")


def loader_generators(loader: Any, depth: int = 5) -> dict[str, torch.Generator]:
    """Every ``torch.Generator`` reachable from ``loader`` through its sampler, batch sampler,
    dataset and Accelerate's wrappers, by attribute path (each generator once)."""
    out: dict[str, torch.Generator] = {}
    seen: set[int] = set()

    def walk(obj: Any, path: str, d: int) -> None:
        if obj is None or id(obj) in seen or d < 0:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Generator):
            out[path] = obj
            return
        for name in _LINKS:
            try:
                child = obj.__dict__.get(name) if hasattr(obj, "__dict__") else None
            except Exception:  # noqa: BLE001 - a loader's attribute access is not ours to fail on
                child = None
            walk(child, f"{path}.{name}" if path else name, d - 1)

    walk(loader, "", depth)
    return out


class _Position:
    """This rank's data position: epoch, batches consumed in it, and at the epoch's start the
    global RNG and the state of each generator the loader shuffles with."""

    def __init__(self) -> None:
        self.epoch = 0
        self.batches = 0
        self.epoch_rng: dict[str, torch.Tensor] | None = None
        self.generators: dict[str, torch.Tensor] = {}

    def capture(self, loader: Any) -> None:
        """The epoch starts: remember what its iterator will draw from."""
        from titan.checkpoint.state import capture_rng

        self.epoch_rng = capture_rng()
        self.generators = {k: g.get_state() for k, g in loader_generators(loader).items()}

    def rewind(self, loader: Any) -> None:
        """Put the epoch's start back (RNG and the loader's generators)."""
        from titan.checkpoint.state import restore_rng

        if self.epoch_rng is not None:
            restore_rng(self.epoch_rng)
        gens = loader_generators(loader)
        for k, state in self.generators.items():
            if k in gens:
                gens[k].set_state(state.to(torch.uint8).cpu())
            else:
                log.warning("titan: the loader has no generator at %s any more; its order may differ", k)

    def state_dict(self) -> dict[str, Any]:
        from titan.checkpoint.state import capture_rng

        rng = self.epoch_rng if self.epoch_rng is not None else capture_rng()
        # The generators as one string: DCP loads into the *current* structure, and a fresh
        # run's position does not know its loader's generators yet (a dict would come back empty).
        gens = json.dumps({k: base64.b64encode(v.numpy().tobytes()).decode() for k, v in self.generators.items()})
        return {"epoch": torch.tensor(self.epoch), "batches": torch.tensor(self.batches),
                "epoch_rng": dict(rng), "generators_json": gens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])
        self.epoch_rng = dict(state["epoch_rng"])
        gens = json.loads(state.get("generators_json") or "{}")
        self.generators = {k: torch.frombuffer(bytearray(base64.b64decode(v)), dtype=torch.uint8)
                           for k, v in gens.items()}


class TitanAccelerate:
    """Guard, checkpoints and exact resume for one Accelerate loop (module doc).

    ``model``, ``optimizer`` (and ``scheduler``): as ``accelerator.prepare`` returned them.
    Restores the newest verified checkpoint at once (collective); :attr:`step` is the step
    it resumed after (0 for a fresh run). Cost per step: the guard's (one pre-reduce read
    of each bucket, its small all-reduce launched with DDP's last bucket, which also
    carries the checkpointer's SIGTERM / save-due flags: no collective of the
    checkpointer's own; with the guard off, one 3-integer all-reduce).
    """

    def __init__(self, accelerator: Any, model: torch.nn.Module, optimizer: Any, *, scheduler: Any = None,
                 max_norm: float | None = None, ctx: Any = None) -> None:
        from titan.checkpoint import Checkpointer
        from titan.checkpoint.state import capture_rng

        self.accelerator, self.model, self.optimizer, self.scheduler = accelerator, model, optimizer, scheduler
        self.ctx = ctx or worker_context()
        inner = getattr(optimizer, "optimizer", optimizer)
        self.guarded: GuardedStep | None = None
        if getattr(optimizer, "scaler", None) is not None:
            log.warning("titan: step guard off: an fp16 GradScaler re-patches the optimizer step inside Accelerate")
            self.ctx.events.emit("guard.armed", "step guard off: fp16 GradScaler inside Accelerate", level="warning",
                                 data={"mode": "off", "enabled": False, "source": SOURCE})
        else:
            self.guarded = GuardedStep(self.ctx, model, inner, max_norm=max_norm, on_result=self._told)
            self.guarded.wrap_accelerator(accelerator, lambda: self.guarded)
        self.position = _Position()
        self.state: dict[str, Any] = {"model": model, "optimizer": inner,
                                      f"data_rank{self.ctx.rank}": self.position}  # per-rank key (DCP)
        if scheduler is not None:
            self.state["scheduler"] = scheduler
        if self.guarded is not None:
            self.state["guard"] = self.guarded.guard
        self.checkpointer = Checkpointer(self.ctx)
        if self.guarded is not None:
            # The checkpointer's per-step flags (SIGTERM, save due) ride the guard's vector: no
            # all-reduce of their own. No rollback: the loop's data would not follow it.
            self.guarded.guard.use_checkpointer(self.checkpointer, None, rollback=False)
            with self.guarded.bypass():  # DCP's optimizer-state creation steps once: not a training step
                self.step = self.checkpointer.restore(self.state)
        else:
            self.step = self.checkpointer.restore(self.state)
        self._resume_rng = capture_rng() if self.step else None  # the checkpoint's step, put back later
        if self.guarded is not None:
            self.guarded.set_step(self.step)
        self._seen_step = self.step

    def _told(self, res: Any) -> None:
        opt = self.optimizer
        if hasattr(opt, "_is_overflow"):  # what a prepared scheduler reads: no step on a skip
            opt._is_overflow = bool(res.skipped) and not self.guarded.guard.policy.step_scheduler_on_skip  # type: ignore[union-attr]

    # -- the data -----------------------------------------------------------------------------
    def batches(self, loader: Iterable[Any], epoch: int) -> Iterator[Any]:
        """``loader``'s batches of ``epoch`` from the saved position on (module doc); saves a
        checkpoint when one is due, each time the loop asks for a batch after an optimizer
        step. Calls ``loader.set_epoch(epoch)`` when it has one."""
        from titan.checkpoint.state import restore_rng

        pos = self.position
        resuming = self._resume_rng is not None
        if resuming and epoch < pos.epoch:
            return  # finished before the restart
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        skip = 0
        if resuming and epoch == pos.epoch and pos.batches > 0:
            skip = pos.batches
            pos.rewind(loader)  # the epoch's iterator draws what it drew the first time
        else:
            if resuming:
                restore_rng(self._resume_rng)  # type: ignore[arg-type]
                self._resume_rng = None
            pos.epoch, pos.batches = epoch, 0
        pos.capture(loader)
        it = iter(loader)
        for _ in range(skip):
            next(it)
        if skip:
            restore_rng(self._resume_rng)  # type: ignore[arg-type]
            self._resume_rng = None
            self.ctx.events.emit("data.resumed", f"epoch {epoch}: read past {skip} batches trained before "
                                 "the restart", step=self.step, data={"epoch": epoch, "batches": skip,
                                                                      "source": SOURCE})
        for batch in it:
            self._maybe_save()
            pos.batches += 1
            yield batch
        self._maybe_save()

    def _maybe_save(self) -> None:
        s = self.guarded.step_count if self.guarded is not None else self._seen_step
        if s != self._seen_step and getattr(self.accelerator, "sync_gradients", True):
            self._seen_step = self.step = s
            self.checkpointer.maybe_save(s, self.state)

    def close(self) -> None:
        """The end of training: the save in flight finishes, the drill's final-state digest is
        written (under ``titan drill``), the beacon is marked done."""
        self._maybe_save()
        self.checkpointer.close()
        if self.guarded is not None:
            self.guarded.close()
