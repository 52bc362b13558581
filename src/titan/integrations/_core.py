"""What the three integrations share: the step guard inside the framework's optimizer step,
the step's loss, and the drill's final-state digest.

A framework calls ``optimizer.step()`` itself (the Trainer and Accelerate through
``AcceleratedOptimizer``, Lightning with a closure that runs forward and backward first).
:class:`GuardedStep` replaces the *instance's* ``step`` — the class is untouched, nothing
else changes — so that call becomes :meth:`titan.guard.StepGuard.step`: the guard reads the
gradients its DDP comm hook flagged before the all-reduce, agrees with every rank on one
verdict, and then either runs the original ``step`` (at its ``lr_scale``) or skips it on
every rank alike. Each micro-batch's loss reaches the guard before its backward (the
frameworks' ``backward``, wrapped on the instance), so the verdict's exchange rides DDP's
last gradient bucket instead of adding a synchronisation after the backward; the norm the
framework clips with is noted, so the gradients are not read again for it.

The framework is told a skip through its own channel (the Trainer and Accelerate:
``AcceleratedOptimizer.step_was_skipped``, as for an fp16 overflow; Lightning: the
step-interval schedulers' next ``step`` is dropped), so the learning-rate schedule counts
applied updates — the guard's rule everywhere (``guard.step_scheduler_on_skip``).

The beacon's phases, a drill's injection points and the ``step`` event come with the guard
(``titan.guard.progress``): its module hooks see every forward through the DDP module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, Callable, Iterator

import torch

__all__ = ["GuardedStep", "worker_context", "write_final_state", "dist_rank_world"]

log = logging.getLogger(__name__)

_CTX: Any = None


def worker_context() -> Any:
    """This process's ``titan.worker.WorkerContext`` (one per process: every integration
    object of the process shares it, so there is one event file and one beacon). Under
    ``titan run`` it is wired at once (beacon, stack dumps, fault boundary). Cost: the first
    call opens the event file (~1 ms)."""
    global _CTX
    if _CTX is None:
        from titan.worker import WorkerContext

        _CTX = WorkerContext.from_env()
    return _CTX


def dist_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class GuardedStep:
    """Route ``optimizer.step()`` through a :class:`titan.guard.StepGuard`.

    ``model``: what the forward runs through (the ``DistributedDataParallel`` module, so the
    guard's comm hook sees each bucket before its all-reduce). ``optimizer``: the torch
    optimizer whose ``step`` the framework ends up calling. ``max_norm``: clip with the
    guard's exchanged norm (``None`` when the framework clips itself — the guard's norm is
    read from the comm hook, before that clipping). ``on_result``: called with each
    ``StepResult`` (the integration tells the framework about a skip there).
    Raises ``UserError`` when the model already has a DDP comm hook.
    """

    def __init__(self, ctx: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 max_norm: float | None = None, on_result: Callable[[Any], None] | None = None) -> None:
        from titan.guard import StepGuard

        self.ctx, self.model, self.optimizer = ctx, model, optimizer
        self.guard = StepGuard(model, optimizer, ctx=ctx, max_norm=max_norm)
        self.on_result = on_result
        self.last: Any = None  # the last StepResult
        #: seconds spent in the guard around the update (exchange, decision, bookkeeping) and
        #: in the update itself, summed over steps (what bench/integrations_overhead.py reports)
        self.guard_s = 0.0
        self.update_s = 0.0
        self._inside = False
        self._bypass = False
        self._orig = optimizer.step  # the bound method (or a framework's own patch of it)

        def step(closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
            return self._step(closure, **kwargs)

        # What torch's LR scheduler marks on the step it wraps (else it warns that the step
        # was overridden after the scheduler was built); _orig still counts the real calls.
        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
        self._patched = step
        optimizer.step = step  # type: ignore[method-assign]

    # -- the loss of the step ---------------------------------------------------------------
    def add_loss(self, loss: Any) -> None:
        """Count one micro-batch's loss toward this step's (their mean is what the guard
        exchanges: loss spikes and a non-finite loss are judged on it). Called before the
        backward (the frameworks' ``backward`` hooks), so that under DDP the exchange rides
        the gradients' all-reduce (``StepGuard.add_loss``). Cost: one detach."""
        if isinstance(loss, torch.Tensor):
            self.guard.add_loss(loss)

    def note_grad_norm(self, norm: Any, params: list[Any] | None = None) -> None:
        """The framework's clipping norm of this step (``StepGuard.note_grad_norm``): the
        guard does not read the gradients again for it. ``params``: what it was computed
        over — ignored unless that is every parameter the guard checks (a norm of a subset
        is not the step's). Cost: a count of ``params``."""
        check = self.guard.check
        if params is not None and check is not None and \
                sum(1 for p in params if p.requires_grad) != len(check.params):
            return
        self.guard.note_grad_norm(norm)

    def wrap_accelerator(self, accelerator: Any, active: Callable[[], "GuardedStep | None"]) -> None:
        """Route ``accelerator.backward`` and ``accelerator.clip_grad_norm_`` (instance
        attributes; the class is untouched) through the guard of ``active()``: each loss is
        counted before its backward, the clipping norm noted. Idempotent per accelerator."""
        if getattr(accelerator.backward, "_titan", False):
            return
        backward, clip = accelerator.backward, accelerator.clip_grad_norm_

        def _backward(loss: Any, **kw: Any) -> Any:
            g = active()
            if g is not None:
                g.add_loss(loss)
            return backward(loss, **kw)

        def _clip(parameters: Any, *a: Any, **kw: Any) -> Any:
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            total = clip(params, *a, **kw)
            g = active()
            if g is not None:
                g.note_grad_norm(total, params)
            return total

        _backward._titan = True  # type: ignore[attr-defined]
        accelerator.backward, accelerator.clip_grad_norm_ = _backward, _clip

    # -- the step ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def bypass(self) -> Iterator[None]:
        """``optimizer.step()`` calls inside go straight to the optimizer — e.g. the one
        ``torch.distributed.checkpoint`` makes with zero gradients and a zero learning rate to
        create the optimizer's state before loading it: no training step to guard."""
        self._bypass = True
        try:
            yield
        finally:
            self._bypass = False

    def _step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        if self._bypass:
            return self._orig(closure, **kwargs) if closure is not None else self._orig(**kwargs)
        if self._inside:  # the guard applying the update it decided on
            t = time.perf_counter()
            try:
                return self._orig(closure, **kwargs) if closure is not None else self._orig(**kwargs)
            finally:
                self.update_s += time.perf_counter() - t
        loss = None
        if closure is not None:  # Lightning: forward + backward (+ clipping) run in here
            with torch.enable_grad():
                loss = closure()
            if not self.guard.loss_pending:  # not seen before its backward (Lightning's hook)
                self.add_loss(loss)
        self._inside = True
        t0, u0 = time.perf_counter(), self.update_s
        try:
            res = self.guard.step()  # the loss given to add_loss
        finally:
            self._inside = False
            self.guard_s += time.perf_counter() - t0 - (self.update_s - u0)
        self.last = res
        if self.on_result is not None:
            self.on_result(res)
        return loss

    @property
    def step_count(self) -> int:
        return self.guard.step_count

    def set_step(self, step: int) -> None:
        """Continue the guard's step numbering after ``step`` (a resumed run)."""
        self.guard.step_count = int(step)

    def close(self) -> None:
        """Put the optimizer's own ``step`` back and detach the guard."""
        if getattr(self.optimizer, "step", None) is self._patched:
            self.optimizer.step = self._orig  # type: ignore[method-assign]
        self.guard.close()


def write_final_state(model: torch.nn.Module, optimizer: Any, step: int | None) -> None:
    """Under ``titan drill`` (``TITAN_FINAL_STATE``): this rank's digest of the model and
    optimizer, what the drill compares with the clean run's. Cost: one hash of the state;
    nothing without the variable. Never raises (a digest is evidence, not training)."""
    from titan.settings.env import TITAN_FINAL_STATE

    path = os.environ.get(TITAN_FINAL_STATE)
    if not path:
        return
    from titan.checkpoint.digest import state_digest, write_digest

    rank, _ = dist_rank_world()
    try:
        write_digest(path, rank, step, state_digest({"model": model, "optimizer": optimizer}, rank))
    except (OSError, RuntimeError, ValueError) as e:
        log.warning("final state digest not written: %s", e)
