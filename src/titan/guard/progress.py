"""What the step guard drives besides the update: beacon phases, a drill's injection points,
DDP's warm-up after a restore, and the ``step`` event.

The guard sees every forward of the model it wraps (module hooks) and every optimizer step,
so a loop that calls ``guard.step`` gets, with no call of its own:

* the progress beacon's step and phases (``titan.beacon``, read by the hang watchdog):
  ``forward``, ``backward`` from the end of the forward to ``guard.step``, ``comm`` (each
  DDP bucket, FSDP reduce-scatter and the guard's own exchange), ``optimizer``, then
  ``idle`` until the next step (unmarked code — logging, an evaluation — gets the idle
  budget, never a tight learned timeout); ``data`` comes from ``titan.data.ResumableSampler``
  when it draws a batch, ``checkpoint`` from the ``Checkpointer``, ``eval`` from forwards
  without gradients;
* a drill's in-process faults (``TITAN_CHAOS_PLAN``, :mod:`titan.chaos.worker`) at their
  steps — the gate where a rank waits for an OS-level fault, hangs, exceptions, NaN/Inf
  gradients, loss spikes, bit flips after the update — and a clean reference run's skipped
  updates (``TITAN_CHAOS_SKIP_STEPS``);
* DDP's bucket warm-up after a restore at 3 or more ranks (bitwise resume, see
  ``titan.checkpoint.ddp_warmup``): one discarded forward/backward of the first batch after
  the restore, RNG and gradients put back;
* one ``step`` event per optimizer step (loss, learning rate, grad norm, skipped, step time).

Only forwards with gradients enabled count (an evaluation under ``torch.no_grad`` changes
nothing). Cost: two module hooks (~2 µs each) and a few beacon updates per step.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import torch

from titan.beacon import get_beacon
from titan.guard.rng import capture_rng, restore_rng
from titan.settings.env import TITAN_CHAOS_PLAN, TITAN_CHAOS_SKIP_STEPS

if TYPE_CHECKING:  # pragma: no cover
    from titan.guard.core import StepGuard, StepResult

__all__ = ["StepProgress"]

log = logging.getLogger(__name__)


def _float_leaves(out: Any) -> list[torch.Tensor]:
    """Every floating tensor of a model output that has a gradient path (tensors, tuples,
    lists, dicts and dict-like outputs)."""
    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() and out.requires_grad else []
    if isinstance(out, dict) or hasattr(out, "values") and callable(out.values):
        return [t for v in out.values() for t in _float_leaves(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _float_leaves(v)]
    return []


class StepProgress:
    """The guard's step bookkeeping (see the module doc); created by ``StepGuard``."""

    def __init__(self, guard: "StepGuard", ctx: Any, *, step_events: bool = True) -> None:
        self.g, self.ctx, self.step_events = guard, ctx, step_events
        self.faults = None
        if ctx is not None and (os.environ.get(TITAN_CHAOS_PLAN) or os.environ.get(TITAN_CHAOS_SKIP_STEPS)):
            from titan.chaos.worker import faults_for

            # Before the guard registers DDP's comm hook: a collective hang wraps it.
            self.faults = faults_for(ctx)
        self.skips: dict[int, str] = {}
        if os.environ.get(TITAN_CHAOS_SKIP_STEPS):
            from titan.chaos.runtime import planned_skips

            self.skips = planned_skips()
        self._begun: int | None = None
        self._t0 = time.perf_counter()
        self._warm: bool | None = None  # None: not decided yet (decided at the first forward)
        self._in_warmup = False
        m = guard.model
        self._handles = [m.register_forward_pre_hook(self._pre, with_kwargs=True), m.register_forward_hook(self._post)]
        b = get_beacon()
        if b is not None:
            b.on_data = self._data

    def attach_faults(self) -> None:
        """Wire the faults' gradient injection (after the guard's check exists): into each
        bucket / reduce-scatter input before the collective under DDP and FSDP2, else hooks."""
        if self.faults is None:
            return
        check = self.g.check
        via_reduce = check is not None and hasattr(check, "before_reduce")
        self.faults.attach(self.g.model, via_reduce=via_reduce)
        if via_reduce:
            check.before_reduce = self._poison

    @property
    def warming_up(self) -> bool:
        """True during the discarded warm-up forward/backward after a restore."""
        return self._in_warmup

    def _poison(self, flat: torch.Tensor) -> None:
        if not self._in_warmup:  # a discarded warm-up pass must not use up a planned fault
            self.faults.poison(flat)

    # -- hooks -------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._in_warmup:
            return None
        if not torch.is_grad_enabled():
            self.phase("eval")
            return None
        if self._warm is None:
            self._warm = self._needs_warmup()
        if self._warm:
            self._warm = False
            self._warmup(module, args, kwargs)
        s = self.g.step_count + 1
        if self._begun != s:
            self.begin(s, phase="data")
        b = get_beacon()
        if b is not None:
            b.set_phase("forward")
        return None

    def _data(self) -> None:
        """A batch is drawn (``titan.data``): step ``step_count + 1`` begins here, if not yet."""
        if self._in_warmup:
            return
        s = self.g.step_count + 1
        if self._begun != s:
            self.begin(s, phase="data")

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._in_warmup or not torch.is_grad_enabled():
            return None
        b = get_beacon()
        if b is not None:
            b.set_phase("backward")
        return None

    def begin(self, s: int, *, phase: str | None = None) -> None:
        """Step ``s`` starts: its first batch drawn from a ``titan.data`` sampler, else its first
        forward (else ``guard.step``, when neither was seen). ``phase``: the phase it starts in
        (``data`` for a draw), set before a drill's fault of this step may stop the rank there —
        a rank stopped while drawing its batch is in ``data``, not in the ``idle`` between steps
        (whose budget is at least ``watchdog.idle_timeout_s``)."""
        self._begun, self._t0 = s, time.perf_counter()
        if self.ctx is not None:
            self.ctx.step = s
        b = get_beacon()
        if b is not None:
            b.step_begin(s)
            if phase is not None:
                b.set_phase(phase)
        if self.faults is not None:
            self.faults.begin_step(s)  # may wait at a drill's gate, sleep (a hang) or raise

    # -- DDP warm-up ---------------------------------------------------------------------
    def _needs_warmup(self) -> bool:
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(self.g.model, DistributedDataParallel):
            return False
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        resumed = self.g.step_count > 0 or bool(getattr(self.ctx, "resumed_from", 0))
        return world >= 3 and resumed

    def _warmup(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """One discarded forward/backward of this batch: DDP rebuilds its buckets after its
        first iteration, so the first real step after a restore uses the layout of an
        unbroken run (at >= 3 ranks gloo's sums depend on it). RNG and gradients are put back."""
        saved = capture_rng()
        params = [p for p in module.parameters() if p.requires_grad]
        grads = [p.grad for p in params]
        self._in_warmup = True
        try:
            leaves = _float_leaves(module(*args, **kwargs))
            if leaves:
                torch.stack([t.float().sum() for t in leaves]).sum().backward()
        finally:
            self._in_warmup = False
            for p, g in zip(params, grads):
                p.grad = g
            restore_rng(saved)
            if self.g.check is not None:
                self.g.check.begin_step()
        if self.g.events is not None and self.g.rank == 0:
            self.g.events.emit("guard.ddp_warmup", "DDP warmed up after the restore (one discarded forward/backward)",
                               step=self.g.step_count, data={"leaves": len(leaves)})

    # -- the step ------------------------------------------------------------------------
    def phase(self, name: str) -> None:
        """Mark phase ``name`` of the guard's own work (``comm``, ``optimizer``)."""
        b = get_beacon()
        if b is not None:
            b.set_phase(name)

    def end(self, res: "StepResult") -> None:
        """Step ``res.step`` is done: beacon, bit flips due now, the ``step`` event, phase ``idle``."""
        s = res.step
        b = get_beacon()
        if self._begun != s and b is not None:
            b.step_begin(s)  # no forward through the guarded model this step
        if b is not None:
            b.step_end(s)
        if self.faults is not None:
            self.faults.after_step(s, self.g.model, self.g.optimizer)
        res.step_time_s = time.perf_counter() - self._t0
        if self.step_events and res.rolled_back_to is None:
            self.g.emit_step(res)
        self._begun = None if res.rolled_back_to is not None else s
        if b is not None:
            b.set_phase("idle")

    def loss(self, loss: Any) -> Any:
        """The loss as a drill's spike or Inf/NaN fault makes it look (unchanged otherwise)."""
        return self.faults.loss(loss) if self.faults is not None and isinstance(loss, torch.Tensor) else loss

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        b = get_beacon()
        if b is not None and b.on_data == self._data:
            b.on_data = None
