"""Apply a fault plan's in-process kinds inside a training rank.

``WorkerFaults.from_env(ctx)`` reads the plan named by ``TITAN_CHAOS_PLAN`` (drills and
tests set it; without it every call here is a no-op costing one attribute check). The
loop calls ``attach(model)`` once, ``begin_step(step)`` before the step, ``loss(loss)`` in
the forward, and ``after_step(step, model, optimizer)`` after the optimizer step. Each
firing writes an ``inject.<kind>`` event: the ground truth drills judge against.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from titan.chaos.flips import flip_bit as _flip
from titan.chaos.inject import Injector
from titan.chaos.plan import FaultSpec, Plan
from titan.chaos.runtime import RuntimeFaults, fault_id, planned_skips
from titan.settings.env import TITAN_CHAOS_PLAN

if TYPE_CHECKING:
    from titan.worker.context import WorkerContext

__all__ = ["WorkerFaults", "flip_bit", "faults_for"]


def flip_bit(t: torch.Tensor, index: int, bit: int) -> tuple[float, float]:
    """Flip bit ``bit`` of element ``index`` of ``t`` in place; returns (before, after).
    (:func:`titan.chaos.flips.flip_bit` also returns the raw bits.)"""
    r = _flip(t, index, bit)
    return r.before, r.after


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
        self.noop = self.runtime.noop if self.runtime is not None else False
        self._injector = Injector(rank=ctx.rank, events=ctx.events, noop=self.noop) if faults else None
        self._step = 0
        self._fired: set[int] = set()
        self._optimizer: Any = None
        self._scheduler: Any = None
        self._patched: dict[str, Any] = {}

    @classmethod
    def from_env(cls, ctx: "WorkerContext", env: dict[str, str] | None = None) -> "WorkerFaults":
        e = env if env is not None else os.environ
        path = e.get(TITAN_CHAOS_PLAN)
        skips = frozenset(planned_skips(e))
        if not path:
            return cls(ctx, [], skip_steps=skips)
        plan = Plan.load(path)
        return cls(ctx, plan.for_rank(ctx.rank, ctx.node), plan, skip_steps=skips)

    def bind(self, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> "WorkerFaults":
        """Give the optimizer and LR scheduler (needed by a reference run's skipped steps)."""
        self._optimizer, self._scheduler = optimizer, scheduler
        return self

    def attach(self, model: nn.Module, *, via_reduce: bool = False) -> "WorkerFaults":
        """Install gradient hooks for ``nan_grad`` faults (before DDP's all-reduce).

        ``via_reduce``: the step guard applies them through :meth:`poison` on each gradient
        bucket (DDP) or reduce-scatter input (FSDP2) instead of tensor hooks."""
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
        self._injector.attach(model, grads=not via_reduce)
        for i, f in enumerate(self.faults):
            if f.kind == "bitflip" and f.get("target") == "grad":
                self._grad_flip(model, i, f)
        return self

    def _grad_flip(self, model: nn.Module, i: int, f: FaultSpec) -> None:
        """A silent bit flip in this rank's local gradient, before the all-reduce (once)."""
        params = {n.replace("module.", "", 1): p for n, p in model.named_parameters()}
        name, index = self._element(f, params)
        first = {"done": False}

        def hook(grad: torch.Tensor) -> torch.Tensor | None:
            if self._step != f.step or first["done"] or i in self._fired:
                return None
            _check_dtype(f, grad, f"grad.{name}")  # before the claim: a wrong plan fails every attempt
            if self.runtime is not None and id(f) in self._ids and not self.runtime.claim(self._ids[id(f)]):
                return None
            first["done"] = True
            self._fired.add(i)
            g = grad.clone()
            r = _flip(g, index, int(f.get("bit")))
            if self.noop:
                _flip(g, index, int(f.get("bit")))  # switched off: flipped back, recorded as unchanged
                r = dataclasses.replace(r, after=r.before, after_bits=r.before_bits)
            self.ctx.events.emit("inject.bitflip", f"flipped bit {f.get('bit')} of grad.{name}[{index}]",
                                 level="warning", step=self._step, data={
                                     "rank": self.ctx.rank, "node": self.ctx.node, "tensor": f"grad.{name}",
                                     "index": index, "bit": int(f.get("bit")), "before": r.before,
                                     "after": r.after, "before_bits": r.before_bits, "after_bits": r.after_bits,
                                     "target": "grad", "dtype": _dtype(g), "injected": True})
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

    def poison(self, flat: torch.Tensor) -> bool:
        """A ``nan_grad`` fault due now on this rank, written into this bucket's local gradients."""
        return self._injector.poison(flat) if self._injector is not None else False

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
                                         data={"rank": self.ctx.rank, "node": self.ctx.node, "from_step": f.step,
                                               "noop": self.noop, "injected": True})
                return not self.noop
        return False

    def after_step(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Apply ``bitflip`` faults due after optimizer step ``step`` (silently, as hardware would)."""
        self._unpatch()
        for i, f in enumerate(self.faults):
            if f.kind != "bitflip" or f.get("target") == "grad" or f.step != step or i in self._fired:
                continue
            tensor, name, index = self._target(f, model, optimizer)
            _check_dtype(f, tensor, name)  # before the claim: a wrong plan fails every attempt
            if self.runtime is not None and id(f) in self._ids and not self.runtime.claim(self._ids[id(f)]):
                continue  # fired in an earlier attempt: a recomputed step stays clean
            self._fired.add(i)  # a transient: a replay of this step must not flip it again
            r = _flip(tensor, index, int(f.get("bit")))
            if self.noop:
                _flip(tensor, index, int(f.get("bit")))  # switched off: flipped back, recorded as unchanged
                r = dataclasses.replace(r, after=r.before, after_bits=r.before_bits)
            self.ctx.events.emit("inject.bitflip", f"flipped bit {f.get('bit')} of {name}[{index}]",
                                 level="warning", step=step, data={
                                     "rank": self.ctx.rank, "node": self.ctx.node, "tensor": name,
                                     "index": index, "bit": int(f.get("bit")), "before": r.before,
                                     "after": r.after, "before_bits": r.before_bits, "after_bits": r.after_bits,
                                     "target": f.get("target"), "dtype": _dtype(tensor), "injected": True})

    @staticmethod
    def _element(f: FaultSpec, params: dict[str, torch.Tensor]) -> tuple[str, int]:
        """The parameter name and element a flip hits: as planned, or drawn with the fault's
        ``seed`` when the plan says ``tensor="*"`` / ``index=-1``."""
        from titan.chaos.flips import pick_element

        name, index = str(f.get("tensor") or next(iter(params))), int(f.get("index"))
        if name == "*":
            name, drawn = pick_element(params, int(f.get("seed")))
            index = drawn if index < 0 else index
        elif index < 0:
            index = pick_element({name: params[name]}, int(f.get("seed")))[1]
        if name not in params:
            raise KeyError(f"bitflip: no parameter {name!r}")
        return name, index

    @classmethod
    def _target(cls, f: FaultSpec, model: nn.Module, optimizer: Any) -> tuple[torch.Tensor, str, int]:
        params = {n.replace("module.", "", 1): p for n, p in model.named_parameters()}
        pname, index = cls._element(f, params)
        p = params[pname]
        target = f.get("target")
        if target == "param":
            return p.data, f"param.{pname}", index
        state = optimizer.state.get(p, {}) if optimizer is not None else {}
        if target not in state:
            raise KeyError(f"bitflip: optimizer state of {pname!r} has no {target!r} (has {sorted(state)})")
        return state[target], f"optim.{pname}.{target}", index


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _check_dtype(f: FaultSpec, t: torch.Tensor, name: str) -> None:
    """A flip planned for one dtype's bit layout must not land in another's (its bit would
    be another class: bit 14 is bf16's exponent but fp32's mantissa)."""
    want = f.get("dtype")
    if want and _dtype(t) != want:
        raise ValueError(f"bitflip at step {f.step}: planned for {want}, but {name} holds {_dtype(t)} "
                         f"(train in {want}, e.g. tinygpt --dtype)")


def faults_for(ctx: "WorkerContext") -> WorkerFaults:
    """The process's in-process faults from ``TITAN_CHAOS_PLAN`` (one object per context,
    shared by the guard and the checkpointer). Its reference-run skips are left to the step
    guard, which skips natively (``TITAN_CHAOS_SKIP_STEPS``)."""
    faults = getattr(ctx, "_titan_faults", None)
    if faults is None:
        faults = WorkerFaults.from_env(ctx)
        faults.skip_steps = frozenset()
        ctx._titan_faults = faults  # type: ignore[attr-defined]
    return faults
