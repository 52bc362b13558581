"""Where the guard reads gradients: one check per wrapper, one interface.

A check splits the model's trainable parameters into *units* (a parameter for DDP and no
wrapper, an FSDP module for FSDP2), and after the step's backward offers

* ``local_norm()`` — the L2 norm of *this* rank's gradients **before** the collective
  (NaN/Inf propagate, so a non-finite norm flags the rank) and ``local_unit_norms()``, the
  same per unit (what names the parameters on a fault),
* ``norm_slot()`` — the global norm of the reduced gradients (DDP, no wrapper) or this
  rank's partial sum of squares (FSDP2, ``norm_is_partial_sq``),
* ``grads()`` — the local gradient tensors that clipping scales.

``note_norm(t)`` hands the check the global norm the loop (or its framework) already
computed from this step's final gradients — for its own clipping — so that the check does
not read them again for it (DDP and no wrapper; where there is no collective that norm is
the local one too). No method syncs with the host; the guard reads everything in one
transfer.
"""

from __future__ import annotations

import logging
from typing import Iterable

import torch
from torch import nn

__all__ = ["GradCheck", "LocalCheck", "index_tensor", "local_norms", "make_check"]

log = logging.getLogger(__name__)


def _strip(name: str) -> str:
    # DDP registers the wrapped model as ``module``; FSDP/compile add their own prefixes.
    for prefix in ("module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(prefix, "")
    return name


class GradCheck:
    """Base: the trainable parameters in model order and their names."""

    mode = "base"
    norm_is_partial_sq = False

    def __init__(self, model: nn.Module) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names: list[str] = [_strip(n) for n, _ in named]
        self.params: list[nn.Parameter] = [p for _, p in named]
        self.index: dict[int, int] = {id(p): i for i, p in enumerate(self.params)}
        self.unit_names: list[str] = list(self.names)
        self._noted: torch.Tensor | None = None

    def begin_step(self) -> None:
        """Forget what the previous step recorded (called before each forward/backward)."""
        self._noted = None

    def note_norm(self, norm: torch.Tensor) -> None:
        """The global norm of this step's final gradients, computed by the loop (e.g. the
        one it clipped with). Ignored by checks whose slot is a partial sum (FSDP2)."""
        self._noted = norm.detach()

    def local_norm(self) -> torch.Tensor:
        """This rank's pre-collective gradient norm (a 0-d float32 tensor)."""
        return torch.linalg.vector_norm(self.local_unit_norms())

    def grads(self) -> list[torch.Tensor]:
        """Local gradient tensors (for clipping and zeroing); cost: none."""
        return [p.grad for p in self.params if p.grad is not None]

    def local_unit_norms(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def norm_slot(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def unit_groups(self) -> list[str]:
        """Label of the communication group (bucket, FSDP module) of each unit this step."""
        return ["-"] * len(self.unit_names)

    def unit_params(self, unit: int) -> list[str]:
        """Parameter names inside ``unit``."""
        return [self.unit_names[unit]]

    def device(self) -> torch.device:
        return self.params[0].device if self.params else torch.device("cpu")

    def close(self) -> None:
        """Detach from the model where torch allows it."""


def _foreach_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-tensor L2 norms, one fused kernel per device/dtype (as ``clip_grad_norm_``)."""
    if not tensors:
        return []
    return list(torch._foreach_norm(tensors, 2.0))


class LocalCheck(GradCheck):
    """No wrapper: the gradients are already final, so the clipping norm is the check.

    Cost: one fused ``foreach_norm`` read of all gradients — exactly the read that
    ``clip_grad_norm_`` does — and none when the loop noted the norm it clipped with
    (``note_norm``); the per-parameter norms are then read only on a fault (after the
    loop's clipping, which turns an Inf into a NaN: the fault's ``values`` say ``nan``).
    """

    mode = "local"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._norms: torch.Tensor | None = None
        self._total: torch.Tensor | None = None

    def begin_step(self) -> None:
        super().begin_step()
        self._norms = self._total = None

    def _compute(self) -> None:
        self._norms, self._total = local_norms(self.params, self.device())

    def local_unit_norms(self) -> torch.Tensor:
        if self._norms is None:
            self._compute()
        assert self._norms is not None
        return self._norms

    def local_norm(self) -> torch.Tensor:
        if self._noted is not None and self._norms is None:
            return self._noted  # no wrapper: the final gradients are this rank's
        return torch.linalg.vector_norm(self.local_unit_norms())

    def norm_slot(self) -> torch.Tensor:
        if self._noted is not None and self._total is None:
            return self._noted
        if self._total is None:
            self._compute()
        assert self._total is not None
        return self._total


def local_norms(params: list[nn.Parameter], dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-parameter gradient norms (float32, 0 where no grad) and their total norm.

    Cost: one fused ``foreach_norm`` read of the gradients, as ``clip_grad_norm_``.
    """
    with_grad = [(i, p.grad) for i, p in enumerate(params) if p.grad is not None]
    norms = _foreach_norms([g for _, g in with_grad])
    if not norms:
        return torch.zeros(len(params), dtype=torch.float32, device=dev), torch.zeros((), device=dev)
    out = torch.zeros(len(params), dtype=torch.float32, device=dev) if len(with_grad) < len(params) else None
    stacked = torch.stack(norms)
    # The order and grouping of clip_grad_norm_/get_total_norm, so the clipped update is
    # bitwise the one a plain loop computes.
    total = torch.linalg.vector_norm(stacked, 2.0)
    if out is None:
        return stacked.float(), total
    out[index_tensor(tuple(i for i, _ in with_grad), dev)] = stacked.float()
    return out, total


_INDEX_CACHE: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}


def index_tensor(idx: tuple[int, ...], dev: torch.device) -> torch.Tensor:
    """A cached device tensor of ``idx`` (no host-to-device copy per step once seen)."""
    key = (idx, str(dev))
    t = _INDEX_CACHE.get(key)
    if t is None:
        if len(_INDEX_CACHE) > 256:
            _INDEX_CACHE.clear()
        t = _INDEX_CACHE[key] = torch.tensor(idx, dtype=torch.long, device=dev)
    return t


def make_check(model: nn.Module, process_group: object | None = None) -> GradCheck:
    """Pick the check for ``model``: DDP comm hook, FSDP2 reduce-scatter, or local.

    Raises ``UserError`` if the model is a DDP module that already has a comm hook.
    """
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        from titan.guard.ddp import DDPCheck

        return DDPCheck(model, process_group)
    if _is_fsdp2(model.modules()):
        from titan.guard.fsdp import FSDPCheck

        return FSDPCheck(model)
    return LocalCheck(model)


def _is_fsdp2(modules: Iterable[nn.Module]) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in modules)
