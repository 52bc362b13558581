"""Apply a fault plan's in-process kinds inside a training rank.

``WorkerFaults.from_env(ctx)`` reads the plan named by ``TITAN_CHAOS_PLAN`` (drills and
tests set it; without it every call here is a no-op costing one attribute check). The
loop calls ``attach(model)`` once, ``begin_step(step)`` before the step, ``loss(loss)`` in
the forward, and ``after_step(step, model, optimizer)`` after the optimizer step. Each
firing writes an ``inject.<kind>`` event: the ground truth drills judge against.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from titan.chaos.inject import Injector
from titan.chaos.plan import FaultSpec, Plan
from titan.chaos.runtime import RuntimeFaults, fault_id
from titan.settings.env import TITAN_CHAOS_PLAN, TITAN_CHAOS_SKIP_STEPS

if TYPE_CHECKING:
    from titan.worker.context import WorkerContext

__all__ = ["WorkerFaults", "flip_bit"]


def flip_bit(t: torch.Tensor, index: int, bit: int) -> tuple[float, float]:
    """Flip bit ``bit`` of element ``index`` of ``t`` in place; returns (before, after)."""
    flat = t.detach().view(-1)
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[flat.element_size()]
    iv = flat.view(ints)
    before = float(flat[index])
    with torch.no_grad():
        iv[index] ^= (1 << bit) if bit < 63 else -(1 << 63)
    return before, float(flat[index])


_ONCE = frozenset({"nan_grad", "inf_loss", "spike"})


class WorkerFaults:
    """The in-process faults of one rank (see the module doc)."""

    def __init__(self, ctx: "WorkerContext", faults: list[FaultSpec], plan: Plan | None = None,
                 skip_steps: frozenset[int] = frozenset()) -> None:
        self.ctx = ctx
        # Numeric kinds fire once per job (marker files): a step recomputed after a restart is clean.
        self._ids = {id(f): fault_id(i, f) for i, f in enumerate(plan.faults)} if plan is not None else {}
        self.runtime = RuntimeFaults(ctx, plan) if plan is not None else None
        if self.runtime is not None:
            faults = [f for f in faults if id(f) not in self._ids or f.kind not in _ONCE
                      or not self.runtime.marker(self._ids[id(f)]).exists()]
        self.faults = faults
        self.skip_steps = skip_steps
        self.active = bool(faults) or bool(skip_steps) or bool(self.runtime and self.runtime.active)
        self._injector = Injector(rank=ctx.rank, events=ctx.events) if faults else None
        self._step = 0
        self._fired: set[int] = set()
        self._optimizer: Any = None
        self._scheduler: Any = None
        self._patched: dict[str, Any] = {}

    @classmethod
    def from_env(cls, ctx: "WorkerContext", env: dict[str, str] | None = None) -> "WorkerFaults":
        e = env if env is not None else os.environ
        path = e.get(TITAN_CHAOS_PLAN)
        skips = frozenset(int(s) for s in e.get(TITAN_CHAOS_SKIP_STEPS, "").replace(" ", "").split(",") if s)
        if not path:
            return cls(ctx, [], skip_steps=skips)
        plan = Plan.load(path)
        return cls(ctx, plan.for_rank(ctx.rank, ctx.node), plan, skip_steps=skips)

    def bind(self, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> "WorkerFaults":
        """Give the optimizer and LR scheduler (needed by a reference run's skipped steps)."""
        self._optimizer, self._scheduler = optimizer, scheduler
        return self

    def attach(self, model: nn.Module) -> "WorkerFaults":
        """Install gradient hooks for ``nan_grad`` faults (before DDP's all-reduce)."""
        if self._injector is None:
            return self
        names = [n for n, _ in model.named_parameters()]
        default = names[0].replace("module.", "", 1) if names else ""
        for f in self.faults:
            if f.kind == "nan_grad":
                value = float(f.get("value")) if f.get("value") not in ("nan", "inf") else (
                    math.nan if f.get("value") == "nan" else math.inf)
                self._injector.nan_grad(rank=self.ctx.rank, param=f.get("param") or default, step=f.step,
                                        value=value, times=f.get("times"))
            elif f.kind in ("spike", "inf_loss"):
                factor = math.inf if f.kind == "inf_loss" else float(f.get("factor"))
                self._injector.loss_spike(rank=self.ctx.rank, step=f.step, factor=factor, times=f.get("times"))
        self._injector.attach(model)
        for i, f in enumerate(self.faults):
            if f.kind == "bitflip" and f.get("target") == "grad":
                self._grad_flip(model, i, f)
        return self

    def _grad_flip(self, model: nn.Module, i: int, f: FaultSpec) -> None:
        """A silent bit flip in this rank's local gradient, before the all-reduce (once)."""
        params = {n.replace("module.", "", 1): p for n, p in model.named_parameters()}
        name = f.get("tensor") or next(iter(params))
        first = {"done": False}

        def hook(grad: torch.Tensor) -> torch.Tensor | None:
            if self._step != f.step or first["done"] or i in self._fired:
                return None
            if self.runtime is not None and id(f) in self._ids and not self.runtime.claim(self._ids[id(f)]):
                return None
            first["done"] = True
            self._fired.add(i)
            g = grad.clone()
            before, after = flip_bit(g, int(f.get("index")), int(f.get("bit")))
            self.ctx.events.emit("inject.bitflip", f"flipped bit {f.get('bit')} of grad.{name}[{f.get('index')}]",
                                 level="warning", step=self._step, data={
                                     "rank": self.ctx.rank, "node": self.ctx.node, "tensor": f"grad.{name}",
                                     "index": int(f.get("index")), "bit": int(f.get("bit")), "before": before,
                                     "after": after, "target": "grad"})
            return g
        params[name].register_hook(hook)

    def begin_step(self, step: int) -> None:
        """Tell the injector which step (1-based) is being computed."""
        self._step = step
        self._unpatch()
        if step in self.skip_steps:
            self._skip_update()
        if self.runtime is not None:
            for f in self.faults:
                if f.kind in _ONCE and f.step == step and id(f) in self._ids:
                    self.runtime.claim(self._ids[id(f)])
            self.runtime.begin_step(step)
        if self._injector is not None:
            self._injector.set_step(step)

    def _skip_update(self) -> None:
        """Reference runs: make this step's optimizer and scheduler updates no-ops, as the
        guard's skip does (gradients are zeroed by the next step's ``zero_grad``)."""
        if self._optimizer is None:
            raise RuntimeError("TITAN_CHAOS_SKIP_STEPS needs WorkerFaults.bind(optimizer, scheduler)")
        for name, obj in (("optimizer", self._optimizer), ("scheduler", self._scheduler)):
            if obj is not None:
                self._patched[name] = obj.__dict__.get("step")
                obj.step = lambda *a, **k: None
        self.ctx.events.emit("chaos.skip", f"reference run: update of step {self._step} skipped", step=self._step)

    def _unpatch(self) -> None:
        for name, old in self._patched.items():
            obj = self._optimizer if name == "optimizer" else self._scheduler
            if old is None:
                obj.__dict__.pop("step", None)
            else:
                obj.step = old
        self._patched.clear()

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss, multiplied by a spike due now on this rank."""
        if self.runtime is not None and self.runtime.poisoned(self._step):
            loss = loss * math.nan  # the same batch is bad on every pass: the guard's replay sees it again
        return self._injector.loss(loss) if self._injector is not None else loss

    def gemm_perturbed(self) -> bool:
        """True from a ``gemm_perturb`` fault's step on: this rank's arithmetic is now wrong."""
        for i, f in enumerate(self.faults):
            if f.kind == "gemm_perturb" and self._step >= f.step:
                if i not in self._fired:  # ground truth, once
                    self._fired.add(i)
                    self.ctx.events.emit("inject.gemm_perturb", "compute canary perturbed from now on",
                                         level="warning", step=self._step,
                                         data={"rank": self.ctx.rank, "node": self.ctx.node, "from_step": f.step})
                return True
        return False

    def after_step(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Apply ``bitflip`` faults due after optimizer step ``step`` (silently, as hardware would)."""
        self._unpatch()
        for i, f in enumerate(self.faults):
            if f.kind != "bitflip" or f.get("target") == "grad" or f.step != step or i in self._fired:
                continue
            if self.runtime is not None and id(f) in self._ids and not self.runtime.claim(self._ids[id(f)]):
                continue  # fired in an earlier attempt: a recomputed step stays clean
            self._fired.add(i)  # a transient: a replay of this step must not flip it again
            tensor, name = self._target(f, model, optimizer)
            before, after = flip_bit(tensor, int(f.get("index")), int(f.get("bit")))
            self.ctx.events.emit("inject.bitflip", f"flipped bit {f.get('bit')} of {name}[{f.get('index')}]",
                                 level="warning", step=step, data={
                                     "rank": self.ctx.rank, "node": self.ctx.node, "tensor": name,
                                     "index": int(f.get("index")), "bit": int(f.get("bit")), "before": before,
                                     "after": after, "target": f.get("target")})

    @staticmethod
    def _target(f: FaultSpec, model: nn.Module, optimizer: Any) -> tuple[torch.Tensor, str]:
        params = {n.replace("module.", "", 1): p for n, p in model.named_parameters()}
        pname = f.get("tensor") or next(iter(params))
        if pname not in params:
            raise KeyError(f"bitflip: no parameter {pname!r}")
        p = params[pname]
        target = f.get("target")
        if target == "param":
            return p.data, f"param.{pname}"
        state = optimizer.state.get(p, {}) if optimizer is not None else {}
        if target not in state:
            raise KeyError(f"bitflip: optimizer state of {pname!r} has no {target!r} (has {sorted(state)})")
        return state[target], f"optim.{pname}.{target}"
