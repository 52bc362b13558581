"""In-process fault injection for tests and drills: NaN/Inf gradients, loss spikes, bad
activations — on one rank, at one step, once or persistently.

The model is torchft's fluent ``EventInjector``::

    inj = (Injector(rank=ctx.rank, step_fn=lambda: guard.step_count + 1)
           .nan_grad(rank=1, param="fc1.weight", step=30)         # one-shot (transient)
           .loss_spike(rank=0, step=80, factor=3.0)
           .nan_activation(rank=1, module="blocks.0", step=90, times=None)  # persistent
           .attach(model))
    ...
    loss = inj.loss(loss)          # in the forward, where a loss spike applies

Gradient faults are tensor hooks on the parameter, so they land in this rank's local
gradient *before* DDP's all-reduce (as a faulty GPU would produce them). ``times`` is how
many times a fault fires at its step (``None``: every pass, so a replay sees it again).
Each firing emits an ``inject.<kind>`` event when an event writer is given.
Cheap to import (torch only); nothing happens until :meth:`Injector.attach`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["Fault", "Injector"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Fault:
    """One planned fault; ``fired`` counts how often it has been applied."""

    kind: str  # grad | loss | activation
    rank: int
    step: int
    target: str = ""
    value: float = math.nan
    times: int | None = 1
    fired: int = 0

    def due(self, rank: int, step: int) -> bool:
        return rank == self.rank and step == self.step and (self.times is None or self.fired < self.times)


def _strip(name: str) -> str:
    for prefix in ("module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(prefix, "")
    return name


class Injector:
    """Plans faults and applies them when this process is at the planned rank and step.

    ``rank``: this process's rank (default: the process group's, else 0). ``step_fn``: the
    step being computed (1-based); without it call :meth:`set_step` from the loop.
    """

    def __init__(self, rank: int | None = None, *, step_fn: Callable[[], int] | None = None,
                 events: Any = None, noop: bool = False) -> None:
        if rank is None:
            import torch.distributed as dist

            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank = rank
        self.noop = noop  # record each firing but change nothing (faults switched off)
        self._step_fn = step_fn
        self._step = 0
        self.events = events
        self.faults: list[Fault] = []
        self._handles: list[Any] = []

    # --- planning -------------------------------------------------------------------
    def nan_grad(self, *, rank: int, param: str, step: int, value: float = math.nan,
                 times: int | None = 1) -> "Injector":
        """Put ``value`` (NaN by default) into element 0 of ``param``'s local gradient."""
        self.faults.append(Fault("grad", rank, step, param, value, times))
        return self

    def inf_grad(self, *, rank: int, param: str, step: int, times: int | None = 1) -> "Injector":
        """As :meth:`nan_grad` with ``+inf``."""
        return self.nan_grad(rank=rank, param=param, step=step, value=math.inf, times=times)

    def loss_spike(self, *, rank: int, step: int, factor: float = 3.0, times: int | None = 1) -> "Injector":
        """Multiply the loss by ``factor`` on ``rank`` at ``step`` (applied by :meth:`loss`)."""
        self.faults.append(Fault("loss", rank, step, "", factor, times))
        return self

    def nan_activation(self, *, rank: int, module: str, step: int, value: float = math.nan,
                       times: int | None = 1) -> "Injector":
        """Put ``value`` into element 0 of ``module``'s forward output (works under FSDP2)."""
        self.faults.append(Fault("activation", rank, step, module, value, times))
        return self

    # --- wiring ---------------------------------------------------------------------
    def set_step(self, step: int) -> None:
        """Tell the injector which step (1-based) the loop is computing."""
        self._step = step

    @property
    def step(self) -> int:
        return self._step_fn() if self._step_fn is not None else self._step

    def attach(self, model: nn.Module, *, grads: bool = True) -> "Injector":
        """Install the hooks the planned faults need on ``model`` (DDP/FSDP wrappers ok).

        ``grads=False``: gradient faults are applied by :meth:`poison` instead (the step
        guard calls it on each gradient bucket / reduce-scatter input before the collective —
        the only place FSDP2's local gradients exist). Raises ``KeyError`` naming the unknown
        parameter or module.
        """
        params = {_strip(n): p for n, p in model.named_parameters()}
        mods = {_strip(n): m for n, m in model.named_modules()}
        for f in self.faults:
            if f.rank != self.rank:
                continue
            if f.kind == "grad" and not grads:
                continue
            if f.kind == "grad":
                if f.target not in params:
                    raise KeyError(f"no parameter {f.target!r}; known: {', '.join(sorted(params))}")
                self._handles.append(params[f.target].register_hook(self._grad_hook(f)))
            elif f.kind == "activation":
                if f.target not in mods:
                    raise KeyError(f"no module {f.target!r}; known: {', '.join(sorted(mods))}")
                self._handles.append(mods[f.target].register_forward_hook(self._act_hook(f)))
        return self

    def detach(self) -> None:
        """Remove every hook installed by :meth:`attach`."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def poison(self, flat: torch.Tensor) -> bool:
        """Put a gradient fault due now on this rank into element 0 of ``flat`` (this rank's
        local gradients of one bucket, before the all-reduce / reduce-scatter); once per due
        fault (one host sync when it fires: the event records the element before and after;
        switched off by ``TITAN_CHAOS_NOOP``, it records both unchanged). Returns whether it
        changed ``flat``."""
        for f in self.faults:
            if f.kind == "grad" and f.due(self.rank, self.step):
                with torch.no_grad():
                    before = float(flat.view(-1)[0])
                    if not self.noop:
                        flat.view(-1)[0] = f.value
                self._fired(f, before=before, after=float(flat.view(-1)[0]))
                return not self.noop
        return False

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Return ``loss`` multiplied by any loss spike due now on this rank (one host sync
        when it fires: the event records the loss before and after)."""
        for f in self.faults:
            if f.kind == "loss" and f.due(self.rank, self.step):
                before = float(loss.detach())
                if not self.noop:
                    loss = loss * f.value
                self._fired(f, before=before, after=float(loss.detach()))
        return loss

    # --- internals ------------------------------------------------------------------
    def _fired(self, f: Fault, **measured: float) -> None:
        """Count and record one firing; ``measured``: the value before and after (the effect)."""
        f.fired += 1
        log.info("inject %s on rank %d at step %d (%s)", f.kind, f.rank, f.step, f.target)
        if self.events is not None:
            self.events.emit(f"inject.{f.kind}", f"injected {f.kind} fault {f.target} at step {f.step}",
                             level="warning", step=f.step,
                             data={"rank": f.rank, "target": f.target, "value": str(f.value), "fired": f.fired,
                                   **measured, "injected": True})

    def _grad_hook(self, f: Fault) -> Callable[[torch.Tensor], torch.Tensor | None]:
        def hook(grad: torch.Tensor) -> torch.Tensor | None:
            if not f.due(self.rank, self.step):
                return None
            g = grad.clone()
            before = float(g.view(-1)[0])
            if not self.noop:
                g.view(-1)[0] = f.value
            self._fired(f, before=before, after=float(g.view(-1)[0]))
            return g
        return hook

    def _act_hook(self, f: Fault) -> Callable[..., Any]:
        def hook(_mod: nn.Module, _inp: Any, out: Any) -> Any:
            if not isinstance(out, torch.Tensor) or not f.due(self.rank, self.step):
                return None
            self._fired(f)
            o = out.clone()
            o.view(-1)[0] = f.value
            return o
        return hook
