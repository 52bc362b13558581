"""DDP: a communication hook that flags each bucket before its all-reduce.

Per bucket and call, the hook

1. reads the bucket's *local* gradients once (``foreach_norm`` over views of the flat
   buffer) and keeps the per-parameter norms **as a tensor** — no ``.item()``, no host
   sync; a NaN/Inf anywhere makes the norm non-finite;
2. calls torch's default ``allreduce_hook`` (so the reduced gradients are bitwise those
   of DDP without a hook);
3. in the future's completion callback, computes the per-parameter norms of the *reduced*
   bucket — the norm clipping needs, computed once, overlapped with other buckets'
   communication.

Parameters are mapped from ``bucket.parameters()`` on every call, because DDP rebuilds
its buckets after the first iteration (one bucket first, then several in reverse order).
A clean step adds no exchange: a non-finite value survives the all-reduce on every rank,
and only then does the guard all-gather these local norms to name ranks and parameters.
"""

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from titan.guard.checks import GradCheck, _foreach_norms, index_tensor, local_norms
from titan.beacon.hooks import wrap_comm_hook

__all__ = ["DDPCheck"]

log = logging.getLogger(__name__)


class DDPCheck(GradCheck):
    """Guard check for ``DistributedDataParallel`` (registers the comm hook).

    Raises ``UserError`` when the model already has a comm hook (DDP allows one).
    """

    mode = "ddp"

    def __init__(self, ddp: nn.Module, process_group: Any | None = None) -> None:
        super().__init__(ddp)
        self._pg = process_group
        self._active = True
        self._pre: dict[int, tuple[list[int], torch.Tensor]] = {}
        self._post: dict[int, tuple[list[int], list[torch.Tensor]]] = {}
        self._fallback: tuple[torch.Tensor, torch.Tensor] | None = None
        #: Called with each bucket's flat local gradients before they are read and reduced
        #: (a drill's gradient faults; ``titan.guard.progress``).
        self.before_reduce: Any = None
        try:
            # Observers (tracing, beacon counters) wrap the one hook DDP allows.
            ddp.register_comm_hook(self, wrap_comm_hook(_guard_hook))  # type: ignore[operator]
        except RuntimeError as e:
            from titan.errors import UserError

            raise UserError(f"cannot install the guard's DDP comm hook: {e}",
                            "the guard needs DDP's one comm hook; remove your own register_comm_hook") from None

    def begin_step(self) -> None:
        self._pre.clear()
        self._post.clear()
        self._fallback = None

    def _covered(self) -> bool:
        n = sum(len(idx) for idx, _ in self._post.values())
        return n == len(self.params) and len(self._pre) == len(self._post)

    def _direct(self) -> tuple[torch.Tensor, torch.Tensor]:
        # The hook did not run this step (backward outside DDP, or no_sync on the last
        # micro-batch): read the gradients directly, as the no-wrapper path does.
        if self._fallback is None:
            log.warning("DDP comm hook did not cover every parameter this step; reading grads directly")
            self._fallback = local_norms(self.params, self.device())
        return self._fallback

    def local_unit_norms(self) -> torch.Tensor:
        if not self._covered():
            return self._direct()[0]
        out = torch.zeros(len(self.params), dtype=torch.float32, device=self.device())
        for idx, norms in self._pre.values():
            out[index_tensor(tuple(idx), out.device)] = norms
        return out

    def norm_slot(self) -> torch.Tensor:
        if not self._covered():
            return self._direct()[1]
        per_param: list[torch.Tensor | None] = [None] * len(self.params)
        for idx, norms in self._post.values():
            for i, n in zip(idx, norms):
                per_param[i] = n
        # Model order, as get_total_norm stacks them: the clip coefficient is bitwise the
        # one ``clip_grad_norm_`` computes on the same gradients.
        return torch.linalg.vector_norm(torch.stack([n for n in per_param if n is not None]), 2.0)

    def unit_groups(self) -> list[str]:
        groups = ["-"] * len(self.params)
        for b, (idx, _) in self._pre.items():
            for i in idx:
                groups[i] = f"bucket{b}"
        return groups

    def close(self) -> None:
        # DDP cannot unregister a comm hook; the hook then behaves as allreduce_hook.
        self._active = False


# No ``from __future__ import annotations`` here: DDP checks the hook's annotations at runtime.
def _guard_hook(state: DDPCheck, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    if not state._active:
        return allreduce_hook(state._pg, bucket)
    b = bucket.index()
    params = bucket.parameters()  # re-read every call: buckets are rebuilt after step 1
    idx = [state.index[id(p)] for p in params]
    numels = [p.numel() for p in params]
    shapes = [p.shape for p in params]
    buf = bucket.buffer()
    if state.before_reduce is not None:
        state.before_reduce(buf)
    low = buf.dtype in (torch.float16, torch.bfloat16)
    views = list(buf.split(numels))
    pre = torch._foreach_norm(views, 2.0, dtype=torch.float32) if low else _foreach_norms(views)
    state._pre[b] = (idx, torch.stack(list(pre)).to(torch.float32))
    fut = allreduce_hook(state._pg, bucket)

    def _after(f: "torch.futures.Future[torch.Tensor]") -> torch.Tensor:
        reduced = f.value()
        shaped = [v.view(s) for v, s in zip(reduced.split(numels), shapes)]
        state._post[b] = (idx, _foreach_norms(shaped))
        return reduced

    return fut.then(_after)
