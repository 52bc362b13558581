"""FSDP2 (``fully_shard``): flag each module's gradients inside its reduce-scatter.

Every FSDP module gets a custom reduce-scatter (``set_custom_reduce_scatter``) that
reads the flat *unsharded local* gradient buffer once (one norm, kept as a tensor) and
then runs torch's default reduce-scatter. Units are FSDP modules (the flat buffer mixes
their parameters). The clipping norm is built from the local shards' partial sums of
squares, which the guard all-reduces in its one per-step exchange — the same all-reduce
``clip_grad_norm_`` does on DTensors — so the decision and the clip coefficient come
from all-reduced values on every rank.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from titan.beacon import get_beacon
from titan.guard.checks import GradCheck, _foreach_norms
from titan.private_api import PrivateName, register, require

#: torch internals the FSDP2 guard rests on (checked before use; titan.private_api).
PRIVATE_NAMES = register("step guard for FSDP2", [
    PrivateName("torch.distributed.fsdp._fully_shard._fsdp_collectives", "DefaultReduceScatter",
                "the guard wraps FSDP2's reduce-scatter to see each rank's gradients before they are summed"),
    PrivateName("torch.distributed.fsdp._fully_shard._fsdp_collectives", "DefaultAllGather",
                "the guard counts FSDP2's parameter all-gathers on the progress beacon (who is behind in a hang)"),
    PrivateName("torch", "_foreach_norm", "per-tensor norms of many gradients in one call"),
])

__all__ = ["FSDPCheck"]

log = logging.getLogger(__name__)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class FSDPCheck(GradCheck):
    """Guard check for models sharded with FSDP2 ``fully_shard``."""

    mode = "fsdp2"
    norm_is_partial_sq = True

    def __init__(self, model: nn.Module) -> None:
        from torch.distributed.fsdp import FSDPModule

        require(PRIVATE_NAMES, feature="the step guard for FSDP2")
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

        super().__init__(model)
        self._pre: dict[int, torch.Tensor] = {}
        #: Called with each unit's flat local gradients before they are read and reduced.
        self.before_reduce: Any = None
        self.unit_names = []
        self._unit_params: list[list[str]] = []
        self._unit_tensors: list[list[nn.Parameter]] = []
        owned: set[int] = set()
        fsdp_mods = [(n, m) for n, m in model.named_modules() if isinstance(m, FSDPModule)]
        # Innermost first: a parent FSDP module owns only what its children do not.
        for name, mod in sorted(fsdp_mods, key=lambda nm: -nm[0].count(".") - (nm[0] != "")):
            mine = [(f"{name}.{pn}" if name else pn, p) for pn, p in mod.named_parameters()
                    if id(p) not in owned and p.requires_grad]
            owned.update(id(p) for p in mod.parameters())
            if not mine:  # e.g. a root whose parameters all live in sharded children
                continue
            unit = len(self.unit_names)
            self.unit_names.append(name or "<root>")
            self._unit_params.append([n for n, _ in mine])
            self._unit_tensors.append([p for _, p in mine])
            mod.set_custom_reduce_scatter(_make_flag_rs(DefaultReduceScatter, self._pre, unit, self))
        for _, mod in fsdp_mods:
            # The parameter all-gathers (forward, backward) count on the beacon too: a rank
            # that never issued the one its peers wait in is then behind in the sequence.
            mod.set_custom_all_gather(_make_counted_ag(DefaultAllGather))

    def begin_step(self) -> None:
        self._pre.clear()

    def local_unit_norms(self) -> torch.Tensor:
        dev = self.device()
        out = torch.zeros(len(self.unit_names), dtype=torch.float32, device=dev)
        for u in range(len(self.unit_names)):
            if u not in self._pre:
                # World 1 (FSDP skips the collective: the shard is the whole gradient) or
                # a unit without gradients this step.
                shards = [_local(p.grad) for p in self._unit_tensors[u] if p.grad is not None]
                norms = _foreach_norms(shards)
                if norms:
                    out[u] = torch.linalg.vector_norm(torch.stack(norms)).float()
        for u, n in self._pre.items():
            out[u] = n.to(dev)
        return out

    def norm_slot(self) -> torch.Tensor:
        shards = [_local(p.grad) for p in self.params if p.grad is not None]
        norms = _foreach_norms(shards)
        if not norms:
            return torch.zeros((), device=self.device())
        return torch.stack(norms).float().pow(2).sum()

    def grads(self) -> list[torch.Tensor]:
        return [_local(p.grad) for p in self.params if p.grad is not None]

    def unit_groups(self) -> list[str]:
        return [f"fsdp:{n}" for n in self.unit_names]

    def unit_params(self, unit: int) -> list[str]:
        return self._unit_params[unit]


def _make_counted_ag(base: type) -> Any:
    """An all-gather counted on the beacon (issued at the call, completed when its work is)."""

    class _CountedAllGather(base):  # type: ignore[misc, valid-type]
        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                     async_op: bool = False) -> Any:
            b = get_beacon()
            if b is None:
                return super().__call__(output_tensor, input_tensor, group, async_op)
            b.collective_issued(0)
            work = super().__call__(output_tensor, input_tensor, group, async_op)
            fut = work.get_future() if work is not None and hasattr(work, "get_future") else None
            if fut is None:
                b.collective_done(0)
            else:
                fut.then(lambda f: b.collective_done(0))
            return work

    return _CountedAllGather()


def _make_flag_rs(base: type, sink: dict[int, torch.Tensor], unit: int, check: Any = None) -> Any:
    """A reduce-scatter that records the local input's norm for ``unit``, then reduces."""

    class _FlagReduceScatter(base):  # type: ignore[misc, valid-type]
        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                     op: Any, async_op: bool = False) -> Any:
            if check is not None and check.before_reduce is not None:
                check.before_reduce(input_tensor)
            sink[unit] = torch.linalg.vector_norm(input_tensor, 2.0, dtype=torch.float32)
            b = get_beacon()
            if b is None:
                return super().__call__(output_tensor, input_tensor, group, op, async_op)
            # Phase ``comm`` and the beacon's collective counters, as DDP's buckets get them
            # (issued and completed when the call returns: the counters show a rank that
            # never got here, which is what the watchdog compares).
            b.enter("comm")
            try:
                out = super().__call__(output_tensor, input_tensor, group, op, async_op)
                b.collective_issued(0)
            finally:
                b.exit()
            b.collective_done(0)
            return out

    return _FlagReduceScatter()
